"""Benchmark (not a test): how long the reference trainer waits for its keyed batches when the
hub answers every request after DELAY_MS (tests/testhub.py `delay_s`), with and without the two
prefetches: the server's (`DAISY_DATA_PREFETCH_STEPS`, row groups of the next steps into its
cache) and the client's (`HttpBatches`, the next steps' batches over HTTP).

Each configuration gets a fresh `python -m daisy.space.datastream` (empty caches) on the same slow
hub, then trains the default model with P replicas for STEPS steps through `HttpBatches`
(`python -m daisy.train --data-url` does the same). Reported per configuration: data wait per
step (the time get() blocked, summed over slots; first step separately, it is always cold),
step time, and the hub's request count.

    python bench/bench_data_prefetch.py [--steps 30] [--peers 2] [--delay-ms 100]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from daisy.config import Config  # noqa: E402
from daisy.batch_source import HttpBatches  # noqa: E402
from daisy.train import Group  # noqa: E402
from tests.test_data import DataServer  # noqa: E402
from tests.testhub import TestHub, shard_path, write_fineweb_shard  # noqa: E402

SHARDS, ROW_GROUPS, ROWS = 2, 40, 120    # 80 small row groups: most batches of a run are cold


def run(tmp, hub, name, server_steps, client_steps, peers, steps):
    server = DataServer(tmp, name, {"HF_ENDPOINT": hub.endpoint,
                                    "DAISY_DATA_PREFETCH_STEPS": str(server_steps)})
    try:
        server.wait_up(time.monotonic() + 60)
        data_id = server.get("/data/info").json()["data_id"]   # listing + commit: not part of a step
        hub.reset_counts()
        cfg = Config()
        batches = HttpBatches(cfg, base=server.url, data_id=data_id, ahead=client_steps)
        group = Group(cfg, peers, batches)
        step_s, waits = [], []
        for _ in range(steps):
            n = len(batches.waits_s)
            t0 = time.perf_counter()
            group.step()
            step_s.append(time.perf_counter() - t0)
            waits.append(sum(batches.waits_s[n:]))
        batches.close()
        return dict(first_wait=waits[0], wait=statistics.median(waits[1:]), wait_sum=sum(waits[1:]),
                    step=statistics.median(step_s[1:]), requests=len(hub.requests))
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--peers", type=int, default=2)
    ap.add_argument("--delay-ms", type=float, default=100)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-prefetch-")
    files = {}
    for i in range(SHARDS):
        local = os.path.join(tmp, f"shard{i}.parquet")
        write_fineweb_shard(local, ROW_GROUPS, ROWS, seed=i + 1)
        files[shard_path(i)] = open(local, "rb").read()
    hub = TestHub(files, delay_s=args.delay_ms / 1000)
    hub.start()
    print(f"hub delay {args.delay_ms:.0f} ms/request, {SHARDS} shards x {ROW_GROUPS} row groups, "
          f"default model, {args.peers} replicas, {args.steps} steps; git "
          + subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                           capture_output=True, text=True).stdout.strip())
    print("| server prefetch (steps) | client prefetch (steps) | first step data wait (ms) "
          "| data wait per step, median of the rest (ms) | data wait, rest in all (ms) "
          "| step, median (ms) | hub requests |")
    print("|---|---|---|---|---|---|---|")
    try:
        for i, (srv, cli) in enumerate([(0, 0), (2, 0), (0, 2), (2, 2), (0, 4), (2, 4), (4, 4)]):
            r = run(tmp, hub, f"c{i}", srv, cli, args.peers, args.steps)
            print(f"| {srv} | {cli} | {r['first_wait'] * 1e3:.0f} | {r['wait'] * 1e3:.1f} | "
                  f"{r['wait_sum'] * 1e3:.0f} | {r['step'] * 1e3:.0f} | {r['requests']} |", flush=True)
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
