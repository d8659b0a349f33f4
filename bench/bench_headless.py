"""A page and the headless peer against two pages: `python app.py` on 127.0.0.1 (offline, no
STUN), a headless Chromium page (tests/page_browser.py flags, ?gpu=off: the CPU path) and either a
second page or `node frontend_js/headless.mjs` (@roamhq/wrtc), training one model together. A
benchmark, not a test (pytest does not collect bench/).

Per settings, --reps rounds; each round runs both pairs one after the other (two pages, then page +
Node), so the ratio compares runs of the same moment's machine:
  ms/step   median of the page's step-to-step intervals after the first --skip steps (the page
            leads in both pairs: its clock measures both)
  ratio     page + Node / two pages, per round; the median of the rounds' ratios is reported
Every run's final hash must be the same on both peers (and, between the pairs, the same run).

    python bench/bench_headless.py                          # default and largest settings
    python bench/bench_headless.py --settings tiny --steps 20 --reps 1    # a quick check that it runs
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.bench_mesh import RECORD, close_group, ended, load, open_group           # noqa: E402
from tests.app_server import open_peer, running_app, state, wait_state             # noqa: E402
from tests.headless_peer import headless_peer                                      # noqa: E402
from tests.page_browser import chromium_pages                                      # noqa: E402

SETTINGS = {
    "tiny": {"width": 16, "seq_len": 16, "batch": 2, "layers": 1, "heads": 4},
    "default": {"width": 32, "seq_len": 32, "batch": 8, "lr_x1000": 10},
    "largest": {"width": 128, "seq_len": 128, "batch": 32},     # bench_mesh.py's largest
}


def page_run(page, settings: dict, steps: int, skip: int, timeout_ms: int) -> dict:
    """The page leads a run of `steps` steps (stopped there when under 100) -> {ms, hash, step}."""
    page.evaluate(RECORD, [skip, steps if steps < 100 else 0])
    err = page.evaluate("(cfg) => window.daisy.start(cfg).then(() => '', (e) => e.message || String(e))",
                        {**settings, "steps": max(100, steps)})
    assert not err, err
    s = ended(page, timeout_ms)
    assert s["runState"] in ("done", "stopped") and s["step"] >= steps, s["message"]
    b = page.evaluate("window.bench")
    ts = [b["t"][str(k)] for k in range(1, s["step"] + 1)]
    intervals = [y - x for x, y in zip(ts, ts[1:])]
    return {"ms": statistics.median(intervals[skip:] or intervals), "hash": s["hash"], "step": s["step"]}


def two_pages(pages, base: str, settings, steps, skip, timeout_ms) -> dict:
    a, b = open_group(pages, f"{base}/?gpu=off", 2)
    try:
        r = page_run(a, settings, steps, skip, timeout_ms)
        wait_state(b, "!s.running", "the other page ended", timeout_ms)
        assert state(b)["hash"] == r["hash"], (state(b)["hash"], r["hash"])
        return r
    finally:
        close_group(pages)


def page_and_node(pages, base: str, tmp: str, settings, steps, skip, timeout_ms) -> dict:
    with headless_peer(base, tmp, "--keep", "--param", "gpu=off", label="bench") as h:
        page = open_peer(pages, f"{base}/?gpu=off", "page")
        wait_state(page, f"s.links['{h.peer_id}'] === 'linked'", "linked to the headless peer", 30_000)
        try:
            r = page_run(page, settings, steps, skip, timeout_ms)
            e = h.wait(lambda x: x["event"] == "run-ended", "the headless peer's run ended", timeout_ms / 1000)
            assert e["hash"] == r["hash"], (e["hash"], r["hash"])
            return r
        finally:
            close_group(pages)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--settings", default="default,largest", help="tiny | default | largest (comma-separated)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="steps per run (default settings; largest: --large-steps)")
    ap.add_argument("--large-steps", type=int, default=5)
    ap.add_argument("--skip", type=int, default=5, help="first step intervals left out (largest: 1)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="daisy-bench-headless-") as tmp, \
            running_app(tmp, "bench", {"HF_HUB_OFFLINE": "1", "DAISY_ICE_SERVERS": "[]"}) as base, \
            chromium_pages() as pages:
        for name in args.settings.split(","):
            settings = SETTINGS[name]
            steps, skip = (args.large_steps, 1) if name == "largest" else (args.steps, args.skip)
            timeout_ms = 900_000 if name == "largest" else 300_000
            rounds = []
            for _ in range(args.reps):
                pp = two_pages(pages, base, settings, steps, skip, timeout_ms)
                pn = page_and_node(pages, base, tmp, settings, steps, skip, timeout_ms)
                assert pp["step"] != pn["step"] or pp["hash"] == pn["hash"], "the same run, two results"
                rounds.append({"pages_ms": pp["ms"], "node_ms": pn["ms"], "ratio": pn["ms"] / pp["ms"], "load": load()})
                print(json.dumps({"settings": name, **rounds[-1]}), flush=True)
            rows.append({"settings": name, "steps": steps,
                         "pages_ms": statistics.median(r["pages_ms"] for r in rounds),
                         "node_ms": statistics.median(r["node_ms"] for r in rounds),
                         "ratio": statistics.median(r["ratio"] for r in rounds),
                         "ratios": [round(r["ratio"], 3) for r in rounds], "load": load()})
    print(f"| settings | steps | two pages ms/step | page + Node ms/step | ratio (median of {args.reps}; rounds) | load avg |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['settings']} | {r['steps']} | {r['pages_ms']:.1f} | {r['node_ms']:.1f} | "
              f"{r['ratio']:.3f} ({', '.join(map(str, r['ratios']))}) | {r['load']} |")


if __name__ == "__main__":
    main()
