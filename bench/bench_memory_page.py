"""A tab's memory at a config (default: the largest), in headless Chromium: one page trains one
peer for STEPS steps on each CPU backend the page can choose (the threaded one when cross-origin
isolated, the unit workers otherwise, the single-threaded wasm-simd one), then the browser's own
measure of the page's memory, `performance.measureUserAgentSpecificMemory()` (JS heaps of the
page and its workers, ArrayBuffers, WebAssembly memories; it needs cross-origin isolation, so
every page here is isolated and the unit workers are run there too), and the renderer process's
peak resident set (VmHWM in /proc: the page and its workers live in one renderer process). Also
the step arena's peak. measureUserAgentSpecificMemory over-counts a growing shared
WebAssembly.Memory (the threaded backend's: ~2.3 GB reported where the process peaked at ~0.5),
so the resident set is the number to read for that row.
`python bench/bench_memory_page.py [--steps 3] [--config largest]`; system /usr/bin/chromium
with tests/page_browser.py's flags."""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser import static_server            # noqa: E402
from tests.page_browser import chromium_pages       # noqa: E402

ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp"}
CONFIGS = {"largest": {"width": 128, "seq_len": 128, "batch": 32, "layers": 2}, "default": {}}

RUN_JS = """async ([backend, settings, steps]) => {
  const { makeConfig } = await import('/frontend_js/config.js');
  const { Group } = await import('/frontend_js/train.js');
  const { textStream } = await import('/frontend_js/data.js');
  let be;
  if (backend === 'threads') be = await (await import('/frontend_js/cpu/threads.js')).createThreadedBackend({ threads: 2 });
  else if (backend === 'workers') be = await (await import('/frontend_js/cpu/unit_workers.js')).createUnitWorkersBackend({ threads: 2 });
  else be = await (await import('/frontend_js/engines.js')).bestBackend();
  const stream = textStream('the quick brown fox jumps over the lazy dog. '.repeat(4000));
  const g = new Group(makeConfig(settings), 1, stream, be);
  let hash, peak = 0;
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) { hash = (await g.step()).hashes[0]; peak = Math.max(peak, g.arena.peak); }
  const ms = (performance.now() - t0) / steps;
  const m = await performance.measureUserAgentSpecificMemory();
  const kinds = {};
  for (const b of m.breakdown) for (const t of b.types) kinds[t] = (kinds[t] || 0) + b.bytes;
  const chunk = g.arena.chunks[0];
  const sharedMB = chunk && chunk.buffer instanceof SharedArrayBuffer ? chunk.buffer.byteLength / 2 ** 20 : 0;
  const realms = m.breakdown.filter((b) => b.bytes > 2 ** 20).map((b) => `${(b.bytes / 2 ** 20).toFixed(0)} MB in ${b.attribution.map((a) => a.scope + ' ' + (a.url || '').split('/').pop()).join('+') || 'unattributed'}`);
  return { name: be.name, hash, ms, sharedMB, realms, peakMB: 8 * peak / 2 ** 20, totalMB: m.bytes / 2 ** 20,
           kindsMB: Object.fromEntries(Object.entries(kinds).map(([k, v]) => [k, v / 2 ** 20])) };
}"""


def renderer_peak_mb() -> float:
    """The largest peak resident set (VmHWM) among Chromium's renderer processes now alive."""
    best = 0.0
    for proc in Path("/proc").iterdir():
        try:
            if b"--type=renderer" not in (proc / "cmdline").read_bytes():
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    best = max(best, int(line.split()[1]) / 1024)
        except (OSError, ValueError):
            continue
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--config", default="largest", choices=sorted(CONFIGS))
    args = ap.parse_args()
    rows = []
    with static_server(headers=ISOLATION) as base, chromium_pages() as pages:
        for backend in ("wasm-simd", "threads", "workers"):
            page = pages.new_page(base + "/tests/pages/blank.html", backend)
            rows.append(page.evaluate(RUN_JS, [backend, CONFIGS[args.config], args.steps]))
            rows[-1]["rendererPeakMB"] = renderer_peak_mb()
            pages.close_pages()
    if len({r["hash"] for r in rows}) != 1:
        sys.exit(f"backends ended on different hashes: {[r['hash'] for r in rows]}")
    print(f"config {args.config}, {args.steps} steps, one peer per tab; MB = 2^20 bytes")
    print("| backend | ms/step | arena peak | renderer peak RSS | measureUserAgentSpecificMemory |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['ms']:.0f} | {r['peakMB']:.0f} | {r['rendererPeakMB']:.0f} | {r['totalMB']:.0f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
