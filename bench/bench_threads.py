"""The threaded CPU backend vs PyTorch float32 CPU (2 threads), in the same run:
`python bench/bench_threads.py [--rounds 3] [--node NODE] [--configs default,largest] [--threads 1,2] [--workers 2]`.

Per config, ROUNDS alternating rounds of: bench_reference.time_torch (the same architecture in
PyTorch float32, torch.set_num_threads(2)) and bench/bench_threads.mjs in node (the wasm-simd
backend, then threads.js's backend on each thread count, then unit_workers.js's on each --workers
count; hashes checked equal). Each number is
the median of the rounds, each round a median of reps segments of one run after its warm-up. Prints a markdown table with the
ratio to PyTorch. To emulate a 2-core device on a bigger one, run it under `taskset -c 0,1`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_reference import time_torch   # noqa: E402
from daisy import data                    # noqa: E402
from daisy.config import Config           # noqa: E402

CONFIGS = {"default": {}, "largest": {"width": 128, "seq_len": 128, "batch": 32, "layers": 2}}
# (steps, reps, warm-up steps) per config: a largest-settings step takes ~1 s on one core
PLAN = {"default": (10, 3, 20), "largest": (3, 3, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--node", default=os.environ.get("NODE", "node"))
    ap.add_argument("--configs", default="default,largest")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--workers", default="2", help="unit-worker counts (the unisolated page's path); '' for none")
    args = ap.parse_args()
    stream = data.builtin_stream()
    node_version = subprocess.run([args.node, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"node {node_version}; {len(os.sched_getaffinity(0))} cores available; {args.rounds} alternating rounds\n")
    print("| config | path (one peer) | ms/step | ratio to PyTorch |")
    print("|---|---|---|---|")
    for name in args.configs.split(","):
        steps, reps, warmup = PLAN[name]
        cfg = Config(**CONFIGS[name])
        torch_ms, runs = [], []
        for _ in range(args.rounds):
            torch_ms.append(time_torch(cfg, stream, steps=steps, reps=reps))
            r = subprocess.run([args.node, "bench/bench_threads.mjs", "--config", name, "--threads", args.threads,
                                *(["--workers", args.workers] if args.workers else []),
                                "--steps", str(steps), "--reps", str(reps), "--warmup", str(warmup), "--json"],
                               cwd=ROOT, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"bench_threads.mjs failed ({name}):\n{r.stderr[-3000:]}")
            runs.append(json.loads(r.stdout))
        t = statistics.median(torch_ms)
        print(f"| {name} | PyTorch float32 CPU (2 threads) | {t:.2f} | 1.00 |")
        for k in runs[0]["ms"]:
            v = statistics.median(j["ms"][k] for j in runs)
            print(f"| {name} | JS {k} | {v:.2f} | {v / t:.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
