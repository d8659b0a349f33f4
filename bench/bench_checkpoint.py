"""Checkpoint write/load time at the largest settings, next to torch.save/torch.load of the same
tensors in the same run (the baseline). Prints a table; results go to TEST_RESULTS.md.

    python bench/bench_checkpoint.py [--runs 7]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from daisy.files.checkpoint import load_checkpoint, param_shapes, save_checkpoint  # noqa: E402

LARGEST = dict(width=128, seq_len=128, batch=32, steps=10000, lr_x1000=50, layers=8, heads=8,
               seed=2**32 - 1)


def median_ms(fn, runs, cleanup=lambda: None):
    """fn timed `runs` times after one warm-up; cleanup (untimed) runs after each call.
    -> (median wall ms, min wall ms, max wall ms, median CPU ms of this process)."""
    fn()                                             # warm-up: page cache, imports
    cleanup()
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        cleanup()
    return statistics.median(wall), min(wall), max(wall), statistics.median(cpu)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    import torch                                     # baseline only; the app never imports torch

    rng = np.random.default_rng(1)
    shapes = param_shapes(LARGEST)
    params, m, v = ({n: rng.standard_normal(s) for n, s in shapes.items()} for _ in range(3))
    tdict = {"model": {n: torch.from_numpy(a) for n, a in params.items()},
             "optim": {"m": {n: torch.from_numpy(a) for n, a in m.items()},
                       "v": {n: torch.from_numpy(a) for n, a in v.items()}}}
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = os.path.join(tmp, "ours.pt"), os.path.join(tmp, "torch.pt")
        fresh = os.path.join(tmp, "fresh.pt")        # writes go to a new file, as a download does
        remove_fresh = lambda: os.unlink(fresh)
        rows = [
            ("daisy save_checkpoint", median_ms(lambda: save_checkpoint(
                fresh, config=LARGEST, params=params, step=123, adam_m=m, adam_v=v),
                args.runs, remove_fresh)),
            ("torch.save (baseline)", median_ms(lambda: torch.save(tdict, fresh), args.runs,
                                                remove_fresh)),
        ]
        save_checkpoint(ours, config=LARGEST, params=params, step=123, adam_m=m, adam_v=v)
        torch.save(tdict, theirs)
        size_ours, size_theirs = os.path.getsize(ours), os.path.getsize(theirs)
        rows += [
            ("daisy load_checkpoint", median_ms(lambda: load_checkpoint(ours), args.runs)),
            ("torch.load weights_only (baseline)",
             median_ms(lambda: torch.load(theirs, weights_only=True), args.runs)),
        ]
    n_params = sum(int(np.prod(s)) for s in shapes.values())
    load = os.getloadavg()[0]
    print(f"largest settings {LARGEST}: {n_params:,} params; files: ours {size_ours:,} B, "
          f"torch {size_theirs:,} B; median of {args.runs} runs (after 1 warm-up); "
          f"{os.cpu_count()} CPUs, 1-min load average {load:.1f}")
    print(f"{'operation':36} {'wall ms':>8} {'min':>7} {'max':>7} {'vs torch':>8} {'CPU ms':>7} {'vs torch':>8}")
    for i, (name, (med, lo, hi, cpu)) in enumerate(rows):
        base, base_cpu = rows[i | 1][1][0], rows[i | 1][1][3]   # the torch row of the same pair
        print(f"{name:36} {med:8.1f} {lo:7.1f} {hi:7.1f} {med / base:7.2f}x {cpu:7.1f} "
              f"{cpu / base_cpu:7.2f}x")
    target = 100.0
    ok = rows[0][1][0] < target and rows[2][1][0] < target
    print(f"target: write and load each < {target:.0f} ms (median wall): {'MET' if ok else 'NOT MET'}")


if __name__ == "__main__":
    main()
