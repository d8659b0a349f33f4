"""Group runs over the WebRTC mesh: `python app.py` on 127.0.0.1 (HF_HUB_OFFLINE=1, no STUN),
P pages in ONE headless Chromium (tests/page_browser.py flags: WebGPU on SwiftShader, loopback
WebRTC), each page a peer; the pages train one model together. A benchmark, not a test (pytest
does not collect bench/).

Per configuration (path = ?gpu=off CPU path or ?gpu=all WebGPU path; P pages), repeated --reps
times, median reported:
  ms/step     median of the step-to-step intervals (page's performance.now at each 'step' event)
              after the first --skip steps, on the leader
  tok/s       group tokens/s = P * batch * seq_len / (ms/step)
  B/peer/step payload bytes a peer sent per step (mesh.stats().bytesSent / steps), against
              |g| = 8 * N params and 2(P-1)/P * |g| (what a ring all-reduce would send)
  wait%       exchange wait (mesh.stats().waitMs) over the steady part: the stats are sampled in
              the 'step' handler at step --skip and at the last step; wait% = dWait / dTime,
              averaged over the pages (dataWait% likewise with dataWaitMs)
Plus: the 300-step default run with 2 pages end to end (Start clicked -> both pages done; final
hash vs `python -m daisy.train --peers 2`), the largest settings with 2 pages, and (--four) a
4-page row at a tiny config (reduce-scatter + all-gather).

    python bench/bench_mesh.py                 # everything, prints the tables
    python bench/bench_mesh.py --only cpu      # one part: cpu | gpu | e2e | large | four
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from daisy.config import Config                                          # noqa: E402
from daisy.model import param_count                                       # noqa: E402
from tests.app_server import open_peer, running_app, state, wait_state    # noqa: E402
from tests.page_browser import chromium_pages                             # noqa: E402

DEFAULT = {"width": 32, "seq_len": 32, "batch": 8, "lr_x1000": 10}
LARGE = {"width": 128, "seq_len": 128, "batch": 32}
TINY = {"width": 16, "seq_len": 16, "batch": 2, "layers": 1, "heads": 4}

RECORD = """([skip, stopAt]) => {
  window.bench = { t: {}, at: null, end: null, runStart: null };
  window.daisy.on('run-started', () => { window.bench.runStart = performance.now(); });
  window.daisy.on('step', (e) => {
    const now = performance.now(), b = window.bench;
    b.t[e.step] = now;
    const s = window.daisy.mesh.stats();
    if (e.step === skip) b.at = { now, ...s };
    b.end = { now, step: e.step, ...s };
    if (stopAt && e.step === stopAt) window.daisy.stop();
  });
}"""


def n_params(settings: dict) -> int:
    keys = {k: v for k, v in settings.items() if k in ("width", "seq_len", "batch", "layers", "heads")}
    return param_count(Config(**keys))


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def linked(page, others, timeout_ms=30_000) -> None:
    ids = [state(o)["peerId"] for o in others]
    cond = " && ".join(f"s.links[{json.dumps(i)}] === 'linked'" for i in ids) or "true"
    wait_state(page, cond, f"links to {ids}", timeout_ms=timeout_ms)


def open_group(pages, url: str, n: int) -> list:
    group = [open_peer(pages, url, f"p{i}") for i in range(n)]
    for page in group:
        linked(page, [o for o in group if o is not page])
    # the links are up; the peer list (who is in the group) must hold everyone too
    for page in group:
        wait_state(page, f"s.peers.length >= {n}", "peer list", 20_000)
    return group


def close_group(pages) -> None:
    pages.close_pages()
    time.sleep(0.5)                  # the goodbyes reach the server before the next group opens


def ended(page, timeout_ms: int) -> dict:
    wait_state(page, "!s.running && ['done', 'stopped', 'failed'].includes(s.runState)", "run ended", timeout_ms)
    return state(page)


def one_run(group, settings: dict, steps: int, skip: int, timeout_ms: int) -> dict:
    for page in group:
        page.evaluate(RECORD, [skip, steps if steps < 100 else 0])
    t0 = time.monotonic()
    err = group[0].evaluate("(cfg) => window.daisy.start(cfg).then(() => '', (e) => e.message || String(e))",
                            {**settings, "steps": max(100, steps)})
    assert not err, err
    finals = [ended(page, timeout_ms) for page in group]
    wall = time.monotonic() - t0
    for s in finals:     # stop() ends the group after the step in flight: N or N+1
        assert s["runState"] in ("done", "stopped") and s["step"] >= steps, s.get("message")
    steps = finals[0]["step"]
    assert len({s["hash"] for s in finals}) == 1, [s["hash"] for s in finals]
    benches = [page.evaluate("window.bench") for page in group]
    lead = benches[0]
    ts = [lead["t"][str(k)] for k in range(1, steps + 1)]
    ms_all = [b - a for a, b in zip(ts, ts[1:])]
    steady = ms_all[skip:] if len(ms_all) > skip else ms_all
    waits, dwaits = [], []
    for b in benches:
        a, e = b["at"], b["end"]
        if a is None:                      # fewer steps than skip: the whole run
            a = {"now": b["runStart"], "waitMs": 0, "dataWaitMs": 0}
        span = e["now"] - a["now"]
        waits.append((e["waitMs"] - a["waitMs"]) / span if span > 0 else float("nan"))
        dwaits.append((e["dataWaitMs"] - a["dataWaitMs"]) / span if span > 0 else float("nan"))
    end = lead["end"]
    return {"ms": statistics.median(steady), "first_ms": ts[0] - (lead["runStart"] or ts[0]),
            "bytes": end["bytesSent"] / max(1, end["steps"]), "topology": end["topology"],
            "wait": statistics.mean(waits), "dwait": statistics.mean(dwaits), "wall": wall,
            "hash": finals[0]["hash"], "all_wait_ms": end["waitMs"], "run_ms": end["now"] - (lead["runStart"] or 0)}


def bench_config(pages, base, gpu, P, settings, steps, skip, reps, timeout_ms):
    group = open_group(pages, f"{base}/?gpu={gpu}", P)
    runs = []
    try:
        for _ in range(reps):
            runs.append(one_run(group, settings, steps, skip, timeout_ms))
        path = state(group[0]).get("path")          # known once the compute path was set up
    finally:
        close_group(pages)
    med = {k: statistics.median(r[k] for r in runs) for k in ("ms", "bytes", "wait", "dwait", "wall")}
    g = 8 * n_params(settings)
    tok = P * settings["batch"] * settings["seq_len"]
    row = {"gpu": gpu, "P": P, "steps": steps, "topology": runs[0]["topology"], "ms": med["ms"],
           "ms_runs": [round(r["ms"], 1) for r in runs], "tok_s": tok * 1000 / med["ms"],
           "bytes": med["bytes"], "g": g, "ring": 2 * (P - 1) / P * g, "wait": med["wait"],
           "dwait": med["dwait"], "wall": med["wall"], "load": load(), "path": path}
    print(json.dumps(row), flush=True)
    return row


def table(rows) -> str:
    out = ["| path | P | topology | steps | ms/step (median of 3; runs) | group tok/s | bytes sent /peer/step | / \\|g\\| | / 2(P−1)/P·\\|g\\| | exchange wait | data wait | load avg |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio_ring = f"{r['bytes'] / r['ring']:.2f}" if r["ring"] else "—"
        out.append(f"| ?gpu={r['gpu']} ({r['path']}) | {r['P']} | {r['topology']} | {r['steps']} | {r['ms']:.1f} ({', '.join(map(str, r['ms_runs']))}) | "
                   f"{r['tok_s']:.0f} | {r['bytes']:,.0f} | {r['bytes'] / r['g']:.2f} | {ratio_ring} | "
                   f"{100 * r['wait']:.0f}% | {100 * r['dwait']:.1f}% | {r['load']} |")
    return "\n".join(out)


def reference_last_hash(peers: int, steps: int) -> tuple[str, float]:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "daisy.train", "--peers", str(peers), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
    assert len(lines) == steps, len(lines)
    return lines[-1]["hashes"][0], time.monotonic() - t0


def bench_e2e(pages, base, reps):
    results = []
    for _ in range(reps):
        group = open_group(pages, f"{base}/", 2)
        try:
            a, b = group
            for page in group:
                page.evaluate(RECORD, [10, 0])
            t0 = time.monotonic()
            b.get_by_role("button", name="Start training", exact=True).click()
            finals = [ended(page, 300_000) for page in group]
            wall = time.monotonic() - t0
            lead = b.evaluate("window.bench")
            ts = [lead["t"][str(k)] for k in range(1, 301)]
            ms = statistics.median([y - x for x, y in zip(ts[10:], ts[11:])])
            results.append({"wall": wall, "hashes": [s["hash"] for s in finals], "steps": [s["step"] for s in finals],
                            "states": [s["runState"] for s in finals], "ms": ms,
                            "wait": lead["end"]["waitMs"] / (lead["end"]["now"] - lead["runStart"]),
                            "load": load()})
            print(json.dumps(results[-1]), flush=True)
        finally:
            close_group(pages)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="cpu | gpu | e2e | large | four (comma-separated)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--gpu-steps", type=int, default=20)
    ap.add_argument("--large-steps", type=int, default=5)
    args = ap.parse_args()
    parts = set(args.only.split(",")) if args.only else {"cpu", "gpu", "e2e", "large", "four"}
    print(f"cores {os.cpu_count()}, load {load()}, |g| default = {8 * n_params(DEFAULT):,} bytes "
          f"({n_params(DEFAULT):,} params), large = {8 * n_params(LARGE):,} bytes", flush=True)
    T0 = time.monotonic()
    rows, e2e, large = [], None, []
    with tempfile.TemporaryDirectory(prefix="daisy-bench-mesh-") as tmp:
        with running_app(tmp, "bench", {"HF_HUB_OFFLINE": "1", "DAISY_ICE_SERVERS": "[]"}) as base:
            with chromium_pages() as pages:
                if "cpu" in parts:
                    for P in (1, 2, 3):
                        rows.append(bench_config(pages, base, "off", P, DEFAULT, args.steps, 10, args.reps, 300_000))
                if "gpu" in parts:
                    for P in (1, 2, 3):
                        rows.append(bench_config(pages, base, "all", P, DEFAULT, args.gpu_steps, 10, args.reps, 300_000))
                if "four" in parts:
                    rows.append(bench_config(pages, base, "off", 4, TINY, args.steps, 10, args.reps, 300_000))
                if "large" in parts:
                    large.append(bench_config(pages, base, "off", 2, LARGE, args.large_steps, 1, args.reps, 600_000))
                if "e2e" in parts:
                    e2e = bench_e2e(pages, base, args.reps)
    if rows:
        print(table(rows))
    if large:
        print("largest settings (width 128, seq 128, batch 32), 2 pages, CPU path (ms/step over steps 2..N):")
        print(table(large))
    if e2e:
        want, ref_s = reference_last_hash(2, 300)
        walls = [r["wall"] for r in e2e]
        ok = all(set(r["hashes"]) == {want} and r["steps"] == [300, 300] for r in e2e)
        print(f"300-step default run, 2 pages, Start clicked -> both done: wall {statistics.median(walls):.1f} s "
              f"(runs {', '.join(f'{w:.1f}' for w in walls)}), ms/step {statistics.median(r['ms'] for r in e2e):.1f}, "
              f"exchange wait {100 * statistics.median(r['wait'] for r in e2e):.0f}%; "
              f"final hash == `python -m daisy.train --peers 2` step 300 ({want[:16]}): {ok} (reference took {ref_s:.1f} s)")
    print(f"bench wall {time.monotonic() - T0:.0f} s, load {load()}")


if __name__ == "__main__":
    main()
