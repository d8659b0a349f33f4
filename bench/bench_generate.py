"""Generation speed: 200 tokens from the default model (trained a few steps) in the offline kit
in headless Chromium (file://, network blocked), with frontend_js/generate.js under node, and
Python's daisy.generate as the baseline in the same run; plus the kit's size. Every run must
give the same token ids (checked). Prints a table; results go to TEST_RESULTS.md.

    python bench/bench_generate.py [--runs 7] [--tokens 200] [--train-steps 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from daisy.files.checkpoint import load_checkpoint  # noqa: E402
from daisy.config import Config  # noqa: E402
from daisy.generate import generate  # noqa: E402
from daisy.files.kit import build_kit  # noqa: E402
from tests.page_browser import chromium_pages  # noqa: E402

PROMPT, TEMPERATURE, TOP_K, SEED = "Once upon a time", 0.8, 40, 1

# node: load the kit's own weight decoder and generate.js; time every run (the first is cold: JIT)
NODE_SCRIPT = """
import { readFileSync } from 'node:fs';
import { makeConfig } from '%(fe)s/config.js';
import { bestBackend } from '%(fe)s/engines.js';
import { generate } from '%(fe)s/generate.js';
import { paramsFromBytes } from '%(fe)s/kit/kit.js';
const [spec] = process.argv.slice(-1).map((p) => JSON.parse(readFileSync(p, 'utf8')));
const cfg = makeConfig(spec.config);
const params = paramsFromBytes(new Uint8Array(readFileSync(spec.weights)), cfg);
const backend = await bestBackend();
const ms = []; let ids = null;
for (let r = 0; r < spec.runs + 1; r++) {
  const t0 = performance.now();
  ids = (await generate(params, cfg, spec.prompt, spec.tokens,
    { temperature: spec.temperature, topK: spec.topK, seed: spec.seed, backend })).ids;
  ms.push(performance.now() - t0);
}
console.log(JSON.stringify({ engine: backend.name, ms, ids }));
"""

KIT_RUN = """async ([prompt, tokens, temperature, topK, seed]) => {
  const t0 = performance.now();
  const { ids } = await window.daisyKit.generate(prompt, { tokens, temperature, topK, seed });
  return { ms: performance.now() - t0, ids };
}"""


def stats(ms):
    return statistics.median(ms), min(ms), max(ms)


def bench_python(ck, cfg, tokens, runs):
    ms, ids = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        _, ids = generate(ck.params, cfg, PROMPT, tokens, TEMPERATURE, TOP_K, SEED)
        ms.append((time.perf_counter() - t0) * 1000)
    return ms, ids


def bench_node(ck, tmp, tokens, runs):
    weights = tmp / "weights.f64"
    import numpy as np
    weights.write_bytes(b"".join(np.ascontiguousarray(w, "<f8").tobytes() for w in ck.params.values()))
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"config": ck.config, "weights": str(weights), "runs": runs, "tokens": tokens,
                                "prompt": PROMPT, "temperature": TEMPERATURE, "topK": TOP_K, "seed": SEED}))
    script = NODE_SCRIPT % {"fe": (ROOT / "frontend_js").as_uri()}
    r = subprocess.run(["node", "--input-type=module", "-e", script, str(spec)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    return out["engine"], out["ms"][0], out["ms"][1:], out["ids"]


def bench_kit(kit_path, tokens, runs):
    with chromium_pages() as pages:
        context = pages.browser.new_context()
        pages.contexts.append(context)
        requested = []
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                      else route.abort())
        page = context.new_page()
        page.on("request", lambda req: requested.append(req.url))
        t0 = time.perf_counter()
        page.goto(kit_path.as_uri(), wait_until="load", timeout=30_000)
        page.wait_for_function("document.body.dataset.state !== 'loading'", timeout=30_000)
        open_ms = (time.perf_counter() - t0) * 1000
        assert page.evaluate("document.body.dataset.state") == "ready", page.text_content("#error")
        engine = page.evaluate("window.daisyKit.engine")
        ms, ids = [], None
        for _ in range(runs + 1):
            r = page.evaluate(KIT_RUN, [PROMPT, tokens, TEMPERATURE, TOP_K, SEED])
            ms.append(r["ms"])
            ids = r["ids"]
        # the UI path once: fill, click, the kit's own timing in #status
        page.fill("#prompt", PROMPT)
        page.fill("#seed", str(SEED))
        page.fill("#tokens", str(tokens))
        page.click("#generate")
        page.wait_for_function("document.body.dataset.runs === '1'", timeout=30_000)
        ui_status = page.text_content("#status")
        assert requested == [kit_path.as_uri()], requested
    return engine, open_ms, ms[0], ms[1:], ids, ui_status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--train-steps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ck_path = tmp / "default.pt"
        subprocess.run([sys.executable, "-m", "daisy.train", "--stop-after", str(args.train_steps),
                        "--save", str(ck_path)], cwd=ROOT, check=True, capture_output=True, timeout=600)
        ck = load_checkpoint(ck_path)
        cfg = Config.from_dict(ck.config)
        kit_path = tmp / "kit.html"
        kit_path.write_text(build_kit(ck), encoding="utf-8")
        kit_bytes = kit_path.stat().st_size

        py_ms, py_ids = bench_python(ck, cfg, args.tokens, args.runs)
        node_engine, node_first, node_ms, node_ids = bench_node(ck, tmp, args.tokens, args.runs)
        kit_engine, open_ms, kit_first, kit_ms, kit_ids, ui_status = bench_kit(kit_path, args.tokens, args.runs)

    assert node_ids == py_ids, "node generated different tokens than Python"
    assert kit_ids == py_ids, "the kit generated different tokens than Python"
    py_med = statistics.median(py_ms)
    print(f"default config {ck.config}, step {ck.step}; {args.tokens} tokens, prompt {PROMPT!r}, "
          f"temperature {TEMPERATURE}, top-k {TOP_K}, seed {SEED}; median of {args.runs} (after one first run "
          "for node and the kit); identical token ids in all three")
    print(f"{'where':34} {'median ms':>10} {'min':>8} {'max':>8} {'first':>8} {'vs Python':>10}")
    rows = [("Python daisy.generate (baseline)", py_ms, None),
            (f"node generate.js ({node_engine})", node_ms, node_first),
            (f"kit in Chromium ({kit_engine})", kit_ms, kit_first)]
    for name, ms, first in rows:
        med, lo, hi = stats(ms)
        first_s = f"{first:8.0f}" if first is not None else f"{'-':>8}"
        print(f"{name:34} {med:10.0f} {lo:8.0f} {hi:8.0f} {first_s} {py_med / med:9.2f}x")
    print(f"kit open (load, decode, hash check, engine gate): {open_ms:.0f} ms; UI run: {ui_status}")
    print(f"kit size: {kit_bytes} bytes ({kit_bytes / 1e6:.3f} MB; target < 1 MB)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
