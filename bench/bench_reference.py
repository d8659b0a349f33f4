"""Benchmark (not a test): the numpy reference's ms/step for the default config next to the same
architecture trained in float32 PyTorch on CPU, in the same run, and both final losses after
300 steps on the same data (same init, same batches, Adam lr 0.01).

    python bench/bench_reference.py [--reps 5] [--steps 30]

torch==2.13.0 (CPU) installs from a local file on the project machines: pip install torch==2.13.0.
Without torch this prints the reference's numbers only and exits 0.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from daisy import data
from daisy.config import Config
from daisy.train import Group


def time_reference(cfg, stream, steps, reps):
    times = []
    for _ in range(reps):
        g = Group(cfg, 1, stream)
        g.step()                                              # warm-up
        t = time.perf_counter()
        for _ in range(steps):
            g.step()
        times.append((time.perf_counter() - t) / steps * 1000)
    return statistics.median(times)


def torch_runner(cfg, stream):
    import torch
    from daisy.model import init_params
    from daisy.torch_model import DaisyGPT
    torch.set_num_threads(2)
    model = DaisyGPT(**cfg.to_dict())
    model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in init_params(cfg).items()})
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    state = {"s": 0}

    def step():
        x, y = data.get_batch(stream, cfg.seed, state["s"], 0, cfg.batch, cfg.seq_len)
        state["s"] += 1
        logits = model(torch.from_numpy(x))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def time_torch(cfg, stream, steps, reps):
    times = []
    for _ in range(reps):
        step = torch_runner(cfg, stream)
        step()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - t) / steps * 1000)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-losses", action="store_true", help="skip the 300-step loss comparison")
    args = ap.parse_args()
    cfg, stream = Config(), data.builtin_stream()
    ref_ms = time_reference(cfg, stream, args.steps, args.reps)
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"reference (numpy, INT8 units): {ref_ms:.2f} ms/step (default config, 1 peer)")
        print("torch not installed: pip install torch==2.13.0 for the PyTorch baseline")
        return 0
    torch_ms = time_torch(cfg, stream, args.steps, args.reps)
    print("| implementation | ms/step (median of %d x %d steps) | ratio to PyTorch |" % (args.reps, args.steps))
    print("|---|---|---|")
    print(f"| PyTorch float32 CPU (2 threads) | {torch_ms:.2f} | 1.00 |")
    print(f"| daisy reference (numpy, INT8 units, float64) | {ref_ms:.2f} | {ref_ms / torch_ms:.2f} |")
    if not args.no_losses:
        g = Group(cfg, 1, stream)
        ours = [g.step()[1] for _ in range(cfg.steps)]
        step = torch_runner(cfg, stream)
        theirs = [step() for _ in range(cfg.steps)]
        print(f"\nloss after {cfg.steps} steps (mean of the last 20): daisy INT8 {np.mean(ours[-20:]):.4f}, "
              f"PyTorch float32 {np.mean(theirs[-20:]):.4f} (first step: {ours[0]:.4f} / {theirs[0]:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
