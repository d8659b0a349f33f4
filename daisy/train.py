"""The reference trainer: P simulated peers in one process, each with its own replica.

Per step s (0-based): every peer i computes (loss_i, g_i) on batch (seed, s, slot i) with its own
copy of the weights; the group reduces G = reduce_gradients(g); every peer applies Adam with G
to its own copy and hashes it. Honest replicas print P equal hashes on every line.

    python -m daisy.train --peers 2 --steps 300 --json
"""
import argparse
import copy
import json
import sys

import numpy as np

from . import data
from .config import Config, ConfigError, RANGES
from .hashing import weight_hash
from .model import init_params, loss_and_grads
from .optim import adam_init, adam_step
from .reduce import reduce_gradients, reduce_losses
from .units import qmatmul

MAX_PEERS = 64


class Replica:
    """One peer's state: weights and Adam moments."""

    def __init__(self, params, adam):
        self.params, self.adam = params, adam

    @property
    def step(self) -> int:
        return self.adam["t"]


class Group:
    """P replicas training in lockstep on one token stream."""

    def __init__(self, cfg: Config, peers: int, stream: np.ndarray, mm=qmatmul, replicas=None):
        self.cfg, self.stream, self.mm = cfg, stream, mm
        if replicas is None:
            params = init_params(cfg)
            replicas = [Replica(copy.deepcopy(params), adam_init(params)) for _ in range(peers)]
        self.replicas = replicas

    def step(self):
        """Run one step; returns (step number after it, group loss, [hash per peer])."""
        cfg, s = self.cfg, self.replicas[0].step
        losses, grads = {}, {}
        for slot, r in enumerate(self.replicas):
            x, y = data.get_batch(self.stream, cfg.seed, s, slot, cfg.batch, cfg.seq_len)
            losses[slot], grads[slot] = loss_and_grads(r.params, cfg, x, y, self.mm)
        G = reduce_gradients(grads)
        for r in self.replicas:
            adam_step(r.params, G, r.adam, cfg.lr)
        loss = reduce_losses(losses)
        if not np.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at step {s + 1}: lower the learning rate")
        return s + 1, loss, [weight_hash(r.params) for r in self.replicas]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m daisy.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Config()
    ap.add_argument("--peers", type=int, default=2, help=f"simulated peers, 1..{MAX_PEERS} (2)")
    ap.add_argument("--steps", type=int, default=d.steps, help="steps of the run, 100..10000 (300)")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop after this many steps of the run (fixtures, quick checks)")
    ap.add_argument("--width", type=int, default=d.width, help="model width, 16..128 (32)")
    ap.add_argument("--seq-len", type=int, default=d.seq_len, help="sequence length, 16..128 (32)")
    ap.add_argument("--batch", type=int, default=d.batch, help="batch per device, 2..32 (8)")
    ap.add_argument("--lr", type=int, default=d.lr_x1000, help="learning rate x1000, 5..50 (10)")
    ap.add_argument("--layers", type=int, default=d.layers, help="transformer blocks, 1..8 (2)")
    ap.add_argument("--heads", type=int, default=d.heads, help="attention heads, 1..8 (4)")
    ap.add_argument("--seed", type=int, default=d.seed, help="run seed, 0..2^32-1 (1234)")
    ap.add_argument("--data", default=None, help="a parquet file with a 'text' column (default: built-in corpus)")
    ap.add_argument("--json", action="store_true", help="one JSON object per step: step, loss, hashes")
    args = ap.parse_args(argv)
    if not 1 <= args.peers <= MAX_PEERS:
        ap.error(f"peers (--peers) must be in 1..{MAX_PEERS}, got {args.peers}")
    try:
        cfg = Config(width=args.width, seq_len=args.seq_len, batch=args.batch, steps=args.steps,
                     lr_x1000=args.lr, layers=args.layers, heads=args.heads, seed=args.seed)
    except ConfigError as e:
        ap.error(str(e))
    if args.stop_after is not None and not 1 <= args.stop_after <= cfg.steps:
        ap.error(f"--stop-after must be in 1..{cfg.steps} (the run's steps), got {args.stop_after}")
    return args, cfg


def main(argv=None) -> int:
    args, cfg = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        stream = data.builtin_stream() if args.data is None else data.parquet_stream(args.data)
        data.batch_starts(len(stream), cfg.seed, 0, 0, 1, cfg.seq_len)   # stream long enough?
    except data.DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    group = Group(cfg, args.peers, stream)
    n = cfg.steps if args.stop_after is None else args.stop_after
    for _ in range(n):
        step, loss, hashes = group.step()
        if args.json:
            print(json.dumps({"step": step, "loss": loss, "hashes": hashes}), flush=True)
        else:
            agree = "agree" if len(set(hashes)) == 1 else "DISAGREE"
            print(f"step {step:5d}  loss {loss:.4f}  hash {hashes[0][:16]}  "
                  f"({len(hashes)} peers {agree})", flush=True)
        if len(set(hashes)) != 1:
            print("error: replicas diverged; stopping (never fork)", file=sys.stderr)
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
