"""Membership costs between real pages (`python app.py` on 127.0.0.1, headless Chromium pages
linked over loopback WebRTC, the CPU path): a benchmark, not a test (pytest does not collect
bench/). Per settings (default, largest), --reps times, median reported:

  join ms        a third page opens while two train: from its JOIN (the page's first
                 'syncing' state minus the SYNC round trip is not separated: measured from the
                 page's load to its first contributed step, and from SYNC to that step)
  state bytes    the STATE a joiner receives (weights + Adam m, v: 24 bytes per parameter + header)
  crash ms       one of three pages crashes (daisy.testing.crash(): links and socket end at once, no goodbye): from the crash to the
                 survivors' next completed step (detection by the link closing + the recovery)

    python bench/bench_membership.py [--reps 3] [--only default|large]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from daisy.config import Config                                          # noqa: E402
from daisy.model import param_count                                       # noqa: E402
from tests.app_server import open_peer, running_app, state, wait_state    # noqa: E402
from tests.page_browser import chromium_pages                             # noqa: E402

SETTINGS = {"default": {"steps": 10000}, "large": {"steps": 10000, "width": 128, "seq_len": 128, "batch": 32}}
RECORD = """() => { window.mb = { loaded: performance.timeOrigin, sync: null, first: null, steps: [] };
  window.daisy.on('state', (s) => { if (s.runState === 'syncing' && window.mb.sync === null) window.mb.sync = performance.timeOrigin + performance.now(); });
  window.daisy.on('step', (e) => { const t = performance.timeOrigin + performance.now();
    window.mb.steps.push([e.step, t]); if (window.mb.first === null && window.mb.sync !== null) window.mb.first = t; }); }"""


def linked(page, others):
    ids = [state(o)["peerId"] for o in others]
    wait_state(page, " && ".join(f"s.links['{i}'] === 'linked'" for i in ids), "links", 30_000)


def one(browser, base, settings):
    url = base + "/?gpu=off"
    a, b = open_peer(browser, url, "a"), open_peer(browser, url, "b")
    linked(a, [b]); linked(b, [a])
    for p in (a, b):
        p.evaluate(RECORD)
    a.evaluate("(cfg) => window.daisy.start(cfg)", settings)
    wait_state(a, "s.running && s.step >= 5", "5 steps", 120_000)
    t_open = time.time() * 1000
    c = open_peer(browser, url, "c")
    c.evaluate(RECORD)
    wait_state(c, "s.running && s.runState === 'training'", "c joined", 300_000)
    wait_state(c, "s.step >= s.run.history[s.run.history.length - 1][0] + 1", "c's first step", 120_000)
    mb = c.evaluate("window.mb")
    join_ms = mb["first"] - t_open
    sync_ms = mb["first"] - mb["sync"]
    # the crash: c's renderer dies; a's next completed step after it
    wait_state(a, f"s.step >= {state(a)['step'] + 3}", "3 steps of three", 120_000)
    t_crash = time.time() * 1000
    c.evaluate("window.daisy.testing.crash()")
    wait_state(a, "s.run && s.run.roster.length === 2", "c removed", 120_000)
    steps = a.evaluate("window.mb.steps")
    after = [t for _, t in steps if t > t_crash]
    wait_state(a, f"s.step >= {state(a)['step'] + 1}", "a step of two", 120_000)
    if not after:
        after = [t for _, t in a.evaluate("window.mb.steps") if t > t_crash]
    crash_ms = after[0] - t_crash
    a.evaluate("window.daisy.stop()")
    browser.close_pages()
    time.sleep(0.5)
    return join_ms, sync_ms, crash_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", choices=sorted(SETTINGS))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, running_app(tmp, "bench", {"HF_HUB_OFFLINE": "1", "DAISY_ICE_SERVERS": "[]"}) as base:
        with chromium_pages() as browser:
            for name, settings in SETTINGS.items():
                if args.only and name != args.only:
                    continue
                n = param_count(Config(**settings))
                got = [one(browser, base, settings) for _ in range(args.reps)]
                med = [statistics.median(x) for x in zip(*got)]
                rows.append((name, n, med, got))
    print("| settings | params | state bytes | join ms (open -> first step) | sync ms (SYNC -> first step) | crash ms (crash -> next step) |")
    print("|---|---|---|---|---|---|")
    for name, n, med, got in rows:
        print(f"| {name} | {n:,} | {24 * n:,} + header | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.0f} |")
    for name, _, _, got in rows:
        print(name, "runs:", [[round(x) for x in g] for g in got])


if __name__ == "__main__":
    main()
