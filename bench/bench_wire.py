"""The group behind emulated links (issue 21 §4): P pages, each its own headless Chromium in
its own network namespace behind a `lan`, `home` or `far` link (tools/netlab/, docs/ARCHITECTURE.md
"Network lab"), the app in the root namespace, the pages in one room. A benchmark, not a test.

Per (profile, settings, exchange): first one page alone on the same profile (page 0, pinned the
same way), then the group of P pages; each page's browser pinned to core i mod cores (taskset):

  ms/step     median step-to-step interval on the leader after --skip steps (performance.now at
              each 'step' event); with local steps the mean over whole rounds (exchange to exchange)
  compute     the same page alone: its ms/step (no exchange; the data comes over its link too)
  wait        exchange wait: mesh.stats().waitMs over the steady part (sampled at step --skip and
              at the last step), mean over the pages, as a share of the step and in ms
  B/peer/step mesh.stats().bytesSent / steps on the leader
  data wait   mesh.stats().dataWaitMs likewise (the step waiting for its batch from the app)
  scaling     group tokens/s / (the page alone's tokens/s), tokens/s = P * batch * seq_len / ms
  hashes      every page ends on one hash (the run is stopped at --steps, so the last step may be
              N or N+1: the pages' hashes must agree)

    python bench/bench_wire.py                                   # the whole matrix (long)
    python bench/bench_wire.py --profiles home --peers 2 --settings default --steps 20
    python bench/bench_wire.py --exchange f64,int8               # once the codec's setting exists
    python bench/bench_wire.py --lanes 1,16                      # connections per pair, compared in one run
    python bench/bench_wire.py --frame-kib 4,8,16                # frame sizes, likewise
    python bench/bench_wire.py --e2e                             # + the 300-step default run on loopback
    python bench/bench_wire.py --audit-rates 0,0.1               # gradient audits off and at the default chance (run/audits.js)
    python bench/bench_wire.py --local-steps 1,4,16 --audit-rates 0,0.1  # local steps (H > 1: the rate is per round)
    python bench/bench_wire.py --target-step 200 --profiles lan,home --peers 2 --settings default
                                                                 # + time to the loss one page reaches at step 200

Time to target loss (--target-step S, issue 25 §3): every run goes S steps; the loss curve is
smoothed as the mean of the last SMOOTH steps' group losses; the target is the smoothed loss the
page alone reaches at step S; a run's time to target = performance.now() at the first step whose
smoothed loss is at or below it, minus the run's start (ms), and `ttt speedup` = the page alone's
time / the group's. A group whose loss per step differs (more tokens per step, or a setting that
changes the update) is judged by this, not by ms/step.
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
sys.path.insert(0, os.path.join(ROOT, "bench"))

from tools.netlab import Netlab, profile                                   # noqa: E402
from tests.app_server import state, wait_state                             # noqa: E402
from tests.netlab_pages import LabPages, lab_app, room_group, room_url      # noqa: E402
from bench_mesh import DEFAULT, LARGE, RECORD, load, n_params               # noqa: E402

SETTINGS = {"default": DEFAULT, "large": LARGE}
SMOOTH = 10                # steps in the smoothed loss of time to target
RECORD_LOSS = """() => { window.bench.loss = {}; window.daisy.on('step', (e) => { window.bench.loss[e.step] = e.loss; }); }"""


def smoothed(losses: dict, upto: int) -> dict:
    """{step: loss} -> {step: mean of the last SMOOTH losses} for steps SMOOTH..upto."""
    return {k: statistics.fmean(losses[j] for j in range(k - SMOOTH + 1, k + 1))
            for k in range(SMOOTH, upto + 1) if all(j in losses for j in range(k - SMOOTH + 1, k + 1))}


def time_to_target(bench: dict, target: float, upto: int):
    """ms from the run's start to the first step whose smoothed loss <= target, or None."""
    curve = smoothed({int(k): v for k, v in bench["loss"].items()}, upto)
    hit = next((k for k in sorted(curve) if curve[k] <= target), None)
    return None if hit is None else bench["t"][str(hit)] - bench["runStart"]


def cores() -> int:
    return len(os.sched_getaffinity(0))


def run_group(group, settings: dict, exchange: str | None, steps: int, skip: int, timeout_ms: int,
              audit: float | None = None) -> dict:
    """One run of `steps` steps on the linked pages of `group` (group[0] starts it)."""
    for page in group:
        page.evaluate(RECORD, [skip, steps])
        page.evaluate(RECORD_LOSS)
    cfg = {**settings, "steps": max(100, steps)}
    if exchange is not None:
        cfg["exchange"] = exchange
    if audit is not None:
        cfg["auditRate"] = audit
    for _ in range(40):        # right after a run the others' states may still say "training" (reported twice a second)
        t0 = time.monotonic()
        err = group[0].evaluate("(cfg) => window.daisy.start(cfg).then(() => '', (e) => e.message || String(e))", cfg)
        if "already going" not in err:
            break
        time.sleep(0.5)
    if err:
        raise RuntimeError(f"start refused: {err}")
    finals = []
    for page in group:
        wait_state(page, "!s.running && ['done', 'stopped', 'failed'].includes(s.runState)", "run ended", timeout_ms)
        finals.append(state(page))
    wall = time.monotonic() - t0
    for s in finals:
        if s["runState"] not in ("done", "stopped") or s["step"] < steps:
            return {"failed": f"{s['runState']} at step {s['step']}: {s.get('message')}"}
    assert len({s["hash"] for s in finals}) == 1, [s["hash"][:16] for s in finals]
    benches = [page.evaluate("window.bench") for page in group]
    lead = benches[0]
    ts = [lead["t"][str(k)] for k in range(1, steps + 1)]
    steady = [b - a for a, b in zip(ts, ts[1:])][skip:] or [b - a for a, b in zip(ts, ts[1:])] or [ts[0] - lead["runStart"]]
    H = settings.get("local_steps", 1)
    if H > 1:            # local steps: pages run ahead between exchanges; time whole rounds (mean, exchange to exchange)
        a, b = -(-max(skip, 1) // H) * H, steps // H * H
        steady = [(lead["t"][str(b)] - lead["t"][str(a)]) / (b - a)] if b > a else [(ts[-1] - lead["runStart"]) / steps]
    waits, dwaits = [], []
    for b in benches:
        a, e = b["at"] or {"now": b["runStart"], "waitMs": 0, "dataWaitMs": 0}, b["end"]
        span = e["now"] - a["now"]
        waits.append((e["waitMs"] - a["waitMs"]) / span if span > 0 else 0.0)
        dwaits.append((e["dataWaitMs"] - a["dataWaitMs"]) / span if span > 0 else 0.0)
    end = lead["end"]
    return {"ms": statistics.median(steady), "wait": statistics.mean(waits), "dwait": statistics.mean(dwaits),
            "bytes": end["bytesSent"] / max(1, end["steps"]), "wall": wall, "step": finals[0]["step"],
            "engine": finals[0].get("engine"), "topology": end.get("topology"), "lead": lead}


def bench_case(pages, base, P: int, settings: dict, exchange, steps, skip, reps, timeout_ms, pin: bool, gpu: str,
               lanes: int | None = None, frame_kib: int | None = None, audit: float | None = None,
               target: float | None = None) -> dict:
    n = cores()
    cpus = [i % n for i in range(P)] if pin else None
    hooks = ([f"lanes: {int(lanes)}"] if lanes else []) + ([f"frameCap: {int(frame_kib) * 1024}"] if frame_kib else [])
    hook = f"window.__daisyTest = {{{', '.join(hooks)}}};" if hooks else None
    group = room_group(pages, room_url(base, f"&gpu={gpu}"), list(range(P)), cpus, hook)
    try:
        runs = [run_group(group, settings, exchange, steps, skip, timeout_ms, audit) for _ in range(reps)]
    finally:
        pages.close_all()
        time.sleep(0.5)                   # the goodbyes reach the server before the next group
    failed = [r["failed"] for r in runs if "failed" in r]
    if failed:                            # a run that did not finish is a result too (a row saying why)
        return {"failed": failed[0], "runs_failed": len(failed)}
    med = {k: statistics.median(r[k] for r in runs) for k in ("ms", "wait", "dwait", "bytes", "wall")}
    out = {**med, "ms_runs": [round(r["ms"], 1) for r in runs], "engine": runs[0]["engine"],
           "topology": runs[0]["topology"], "tok_s": P * settings["batch"] * settings["seq_len"] * 1000 / med["ms"]}
    if target is not None or P == 1:
        curves = [smoothed({int(k): v for k, v in r["lead"]["loss"].items()}, steps) for r in runs]
        out["target"] = target if target is not None else statistics.median(c[steps] for c in curves if steps in c) \
            if any(steps in c for c in curves) else None
        if out["target"] is not None:
            ttts = [time_to_target(r["lead"], out["target"], steps) for r in runs]
            out["ttt_runs"] = [None if t is None else round(t) for t in ttts]
            reached = [t for t in ttts if t is not None]
            out["ttt"] = statistics.median(reached) if len(reached) == len(ttts) else None
            out["target_steps"] = steps
    return out


def row_line(r: dict) -> str:
    if "failed" in r:
        return (f"| {r['profile']} | {r['settings']} | {r['exchange']} | {r['lanes']} | {r['P']} | — | "
                f"failed ({r['runs_failed']} of the runs): {r['failed'][:160]} | | | | | | | | {r['load']} |")
    wait_ms = r["wait"] * r["ms"]
    return (f"| {r['profile']} | {r['settings']} | {r['exchange']} | {r['lanes']} | {r['P']} | {r['topology'] or '—'} | "
            f"{r['ms']:.0f} ({', '.join(map(str, r['ms_runs']))}) | {r['compute_ms']:.0f} | "
            f"{wait_ms:.0f} ({100 * r['wait']:.0f} %) | {100 * r['dwait']:.1f} % | {r['bytes']:,.0f} | {r['tok_s']:.0f} | "
            f"{r['alone_tok_s']:.0f} | {r['tok_s'] / r['alone_tok_s']:.2f}× | {ttt_cell(r)} | {r['load']} |")


def ttt_cell(r: dict) -> str:
    """time to target: the group's ms (runs), and the page alone's time / the group's."""
    if r.get("alone_ttt") is None:
        return "—"
    if r.get("ttt") is None:
        return f"not reached in {r.get('target_steps')} steps (target {r['target']:.4f})"
    return (f"{r['ttt']:.0f} ms ({', '.join(map(str, r['ttt_runs']))}) vs {r['alone_ttt']:.0f}: "
            f"**{r['alone_ttt'] / r['ttt']:.2f}×** (target {r['target']:.4f})")


HEADER = ("| profile | settings | exchange | lanes | P | topology | ms/step (runs) | compute alone, ms/step | exchange wait, ms (share) "
          "| data wait | B sent /peer/step | group tok/s | one page alone, tok/s | scaling | time to target loss | load avg |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", default="lan,home,far")
    ap.add_argument("--peers", default="2,3,4")
    ap.add_argument("--settings", default="default,large")
    ap.add_argument("--exchange", default="", help="comma-separated, e.g. f64,int8 (empty: the run's default)")
    ap.add_argument("--steps", type=int, default=30, help="steps per run at the default settings")
    ap.add_argument("--large-steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=3, help="steps left out of ms/step and wait (warm-up)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--lanes", default="", help="comma-separated connections per pair to compare, e.g. 1,8 "
                    "(window.__daisyTest.lanes; empty: the page's LANES)")
    ap.add_argument("--frame-kib", default="", help="comma-separated frame caps to compare, KiB (window.__daisyTest.frameCap; "
                    "empty: the page's)")
    ap.add_argument("--gpu", default="off", help="the pages' ?gpu= (off: the CPU path, one engine for every row)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin each page's browser to a core")
    ap.add_argument("--local-steps", default="", help="comma-separated local steps H to compare, e.g. 1,4,16 (the run "
                    "setting local_steps, docs/VERIFICATION.md; with H > 1 an audit rate is per round)")
    ap.add_argument("--audit-rates", default="", help="comma-separated audit chances (per slot and step) to compare, e.g. 0,0.1 "
                    "(the run's auditRate; empty: the page's default)")
    ap.add_argument("--e2e", action="store_true", help="also the 300-step default 2-page run on loopback (bench_mesh)")
    ap.add_argument("--target-step", type=int, default=None,
                    help="time to target loss: every run goes this many steps; the target is the loss the page "
                         "alone reaches at it (module docstring)")
    args = ap.parse_args()
    profiles = args.profiles.split(",")
    peers = [int(x) for x in args.peers.split(",")]
    exchanges = args.exchange.split(",") if args.exchange else [None]
    lane_counts = [int(x) for x in args.lanes.split(",")] if args.lanes else [None]
    frame_caps = [int(x) for x in args.frame_kib.split(",")] if args.frame_kib else [None]
    audits = [float(x) for x in args.audit_rates.split(",")] if args.audit_rates else [None]
    local = [int(x) for x in args.local_steps.split(",")] if args.local_steps else [1]
    print(f"cores {cores()}, load {load()}, |g| f64 default {8 * n_params(DEFAULT):,} B, large {8 * n_params(LARGE):,} B",
          flush=True)
    T0, rows = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="daisy-bench-wire-") as tmp:
        for prof in profiles:
            with Netlab([profile(prof)] * max(peers)) as lab, lab_app(lab, tmp, f"wire-{prof}") as base, \
                    LabPages(lab, base) as pages:
                for name in args.settings.split(","):
                    settings = SETTINGS[name]
                    steps = args.steps if name == "default" else args.large_steps
                    steps = args.target_step or steps
                    skip = min(args.skip, steps - 2) if name == "default" else 1
                    for exchange in exchanges:
                        timeout = 1_800_000
                        alone = bench_case(pages, base, 1, settings, exchange, steps, skip, args.reps, timeout, not args.no_pin, args.gpu)
                        print(json.dumps({"profile": prof, "settings": name, "exchange": exchange, "P": 1,
                                          **{k: v for k, v in alone.items() if k != "lead"}}), flush=True)
                        for P in peers:
                            cases = [(l, f, a, H) for l in lane_counts for f in frame_caps for a in audits for H in local]
                            for lanes, kib, audit, H in dict.fromkeys(cases):
                                target = alone.get("target") if args.target_step else None
                                run_settings = settings if H == 1 else {**settings, "local_steps": H}
                                r = bench_case(pages, base, P, run_settings, exchange, steps, skip, args.reps, timeout,
                                               not args.no_pin, args.gpu, lanes, kib, audit, target)
                                if args.target_step:
                                    r["alone_ttt"] = alone.get("ttt")
                                label = f"{lanes or 'default'}" + (f" × {kib} KiB" if kib else "")
                                row = {"profile": prof, "settings": name,
                                       "exchange": (exchange or "default") + ("" if audit is None else f", audits {audit}")
                                                   + ("" if H == 1 else f", local steps {H}"),
                                       "lanes": label, "P": P, **r, "compute_ms": alone.get("ms"),
                                       "alone_tok_s": alone.get("tok_s"), "load": load()}
                                rows.append(row)
                                print(json.dumps({k: v for k, v in row.items() if k != "lead"}), flush=True)
                                print(row_line(row), flush=True)
                print(f"router counters ({prof}): {json.dumps(lab.stats())}", flush=True)
    print(HEADER)
    for r in rows:
        print(row_line(r))
    if args.e2e:
        from bench_mesh import bench_e2e, reference_last_hash
        from tests.app_server import running_app
        from tests.page_browser import chromium_pages
        with tempfile.TemporaryDirectory(prefix="daisy-bench-wire-e2e-") as tmp:
            with running_app(tmp, "e2e", {"HF_HUB_OFFLINE": "1", "DAISY_ICE_SERVERS": "[]"}) as base, chromium_pages() as pages:
                e2e = bench_e2e(pages, base, args.reps)
        want, _ = reference_last_hash(2, 300)
        ok = all(set(r["hashes"]) == {want} for r in e2e)
        walls = [r["wall"] for r in e2e]
        print(f"300-step default run on loopback, 2 pages (one browser, bench_mesh.bench_e2e): wall "
              f"{statistics.median(walls):.1f} s (runs {', '.join(f'{w:.1f}' for w in walls)}); final hash == reference: {ok}")
    print(f"bench wall {time.monotonic() - T0:.0f} s, load {load()}")


if __name__ == "__main__":
    main()
