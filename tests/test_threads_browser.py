"""The threaded CPU backend (frontend_js/cpu/threads.js) in headless Chromium: Web Workers over one
shared WebAssembly.Memory. A cross-origin isolated page (COOP same-origin + COEP require-corp,
what the app's page needs to use it) trains 3 steps at the tiny settings on 2 threads with every
call split and gets the single-threaded wasm-simd backend's hashes; a page without the headers
is told why threads are unavailable, createThreadedBackend refuses with that reason, and its INT8
units run on 2 unit workers with copied buffers (frontend_js/cpu/unit_workers.js) with the same hashes."""
from tests.browser import static_server

ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp"}

TRAIN_JS = """async () => {
  const { makeConfig } = await import('/frontend_js/config.js');
  const { Group } = await import('/frontend_js/train.js');
  const { bestBackend } = await import('/frontend_js/engines.js');
  const T = await import('/frontend_js/cpu/threads.js');
  const W = await import('/frontend_js/cpu/workers.js');
  const { textStream } = await import('/frontend_js/data.js');
  const out = { isolated: self.crossOriginIsolated, why: T.threadsUnavailable(), threads: await W.defaultThreads() };
  if (out.why) out.refused = await T.createThreadedBackend({ threads: 2 }).then(() => null, (e) => e.message);
  const stream = textStream('the quick brown fox jumps over the lazy dog. '.repeat(200));
  const cfg = makeConfig({ width: 16, seq_len: 16, batch: 2, layers: 1, heads: 4 });
  const run = async (be) => {
    const g = new Group(cfg, 1, stream, be), h = [];
    for (let i = 0; i < 3; i++) h.push((await g.step()).hashes[0]);
    return h;
  };
  out.want = await run(await bestBackend());
  if (out.why) {
    const U = await import('/frontend_js/cpu/unit_workers.js');
    const be = await U.createUnitWorkersBackend({ threads: 2, minUnitMacs: 0 });
    out.got = await run(be);
    out.engine = be.name;
    be.close();
    return out;
  }
  const be = await T.createThreadedBackend({ threads: 2, minUnitMacs: 0, minRowElements: 0 });
  out.got = await run(be);
  out.shared = be.newArena().take(4).buffer instanceof SharedArrayBuffer;
  be.close();
  return out;
}"""


def test_an_isolated_page_trains_on_two_worker_threads_with_the_same_hashes(pages):
    with static_server(headers=ISOLATION) as base:
        page = pages.new_page(base + "/tests/pages/blank.html", "isolated")
        r = page.evaluate(TRAIN_JS)
    assert r["isolated"] and r["why"] is None, r
    assert r["threads"] >= 1
    assert r["shared"], r
    for s, (got, want) in enumerate(zip(r["got"], r["want"])):
        assert got == want, f"step {s + 1}: 2 threads {got} vs wasm-simd {want}"
    assert len(r["got"]) == 3


def test_a_page_without_isolation_runs_its_units_on_workers_with_the_same_hashes(pages):
    with static_server() as base:
        page = pages.new_page(base + "/tests/pages/blank.html", "plain")
        r = page.evaluate(TRAIN_JS)
    assert not r["isolated"]
    assert r["why"] == "SharedArrayBuffer is not available (the page is not cross-origin isolated)", r
    assert r["refused"] == r["why"], r
    assert r["engine"] == "wasm-simd-workers", r
    for s, (got, want) in enumerate(zip(r["got"], r["want"])):
        assert got == want, f"step {s + 1}: 2 unit workers {got} vs wasm-simd {want}"
    assert len(r["got"]) == 3
