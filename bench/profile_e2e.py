"""Where a two-tab group's step goes: the default run (two pages in one headless Chromium over
loopback WebRTC, as bench_mesh.py --only e2e) with the V8 sampling profiler on both pages (CDP
Profiler). Prints, per page, the self time of the hottest functions (name, file:line) as a
share of the profiled span, and the run's wall, ms/step and exchange wait. A tool for finding
the next thing to make faster, not a benchmark: the profiler itself slows a page by a few %.

    python bench/profile_e2e.py                     # 300 steps, the page's defaults
    python bench/profile_e2e.py --steps 120 --top 40 --start '{"auditRate": 0}'
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.bench_mesh import RECORD, close_group, ended, load, open_group   # noqa: E402
from tests.app_server import running_app                                      # noqa: E402
from tests.page_browser import chromium_pages                                 # noqa: E402


def self_times(profile: dict) -> tuple[collections.Counter, float]:
    """{(function, url:line): ms of self time} and the profiled span in ms."""
    nodes = {n["id"]: n for n in profile["nodes"]}
    ms = collections.Counter()
    deltas = profile.get("timeDeltas", [])
    for sample, dt in zip(profile.get("samples", []), deltas[1:] + [0]):
        f = nodes[sample]["callFrame"]
        url = f["url"].rsplit("/", 1)[-1]
        ms[(f["functionName"] or "(anonymous)", f"{url}:{f['lineNumber'] + 1}" if url else "")] += dt / 1000
    return ms, (profile["endTime"] - profile["startTime"]) / 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--gpu", default="", help="the pages' ?gpu= (empty: the auto path)")
    ap.add_argument("--start", default="{}", help="window.daisy.start() settings, JSON")
    args = ap.parse_args()
    settings = {"steps": args.steps, **json.loads(args.start)}
    print(f"cores {os.cpu_count()}, load {load()}, settings {settings}", flush=True)
    with tempfile.TemporaryDirectory(prefix="daisy-profile-") as tmp:
        with running_app(tmp, "profile", {"HF_HUB_OFFLINE": "1", "DAISY_ICE_SERVERS": "[]"}) as base:
            with chromium_pages() as pages:
                group = open_group(pages, f"{base}/" + (f"?gpu={args.gpu}" if args.gpu else ""), 2)
                try:
                    cdps = []
                    for page in group:
                        page.evaluate(RECORD, [10, 0])
                        cdp = page.context.new_cdp_session(page)
                        cdp.send("Profiler.enable")
                        cdp.send("Profiler.setSamplingInterval", {"interval": 200})
                        cdp.send("Profiler.start")
                        cdps.append(cdp)
                    t0 = time.monotonic()
                    err = group[0].evaluate("(cfg) => window.daisy.start(cfg).then(() => '', (e) => e.message || String(e))",
                                            settings)
                    assert not err, err
                    finals = [ended(page, 600_000) for page in group]
                    wall = time.monotonic() - t0
                    profiles = [cdp.send("Profiler.stop")["profile"] for cdp in cdps]
                    lead = group[0].evaluate("window.bench")
                finally:
                    close_group(pages)
    ts = [lead["t"][str(k)] for k in range(1, finals[0]["step"] + 1)]
    gaps = sorted(b - a for a, b in zip(ts[10:], ts[11:]))
    print(f"wall {wall:.1f} s, steps {[s['step'] for s in finals]}, states {[s['runState'] for s in finals]}, "
          f"hashes equal {len({s['hash'] for s in finals}) == 1}, path {finals[0].get('path')}")
    print(f"ms/step median {gaps[len(gaps) // 2]:.1f} (p10 {gaps[len(gaps) // 10]:.1f}, p90 {gaps[9 * len(gaps) // 10]:.1f}), "
          f"exchange wait {100 * lead['end']['waitMs'] / (lead['end']['now'] - lead['runStart']):.0f} % of the run (leader)")
    for i, prof in enumerate(profiles):
        ms, span = self_times(prof)
        print(f"\npage {i}: profiled {span / 1000:.1f} s; self time, top {args.top}:")
        for (name, where), t in ms.most_common(args.top):
            print(f"  {100 * t / span:5.1f} %  {t:8.0f} ms  {name}  {where}")


if __name__ == "__main__":
    main()
