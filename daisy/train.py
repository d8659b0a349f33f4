"""The reference trainer: P simulated peers in one process, each with its own replica.

Per step s (0-based): every peer i computes (loss_i, g_i) on batch (seed, s, slot i) with its own
copy of the weights; the group reduces G = reduce_gradients(g); every peer applies Adam with G
to its own copy and hashes it. Honest replicas print P equal hashes on every line.

    python -m daisy.train --peers 2 --steps 300 --json
    python -m daisy.train --stop-after 100 --save run.pt      # first 100 steps of a 300-step run
    python -m daisy.train --resume run.pt                      # the remaining 200, bit-exactly
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
    # model settings default to None so --resume can tell which were given explicitly
    ap.add_argument("--peers", type=int, default=2, help=f"simulated peers, 1..{MAX_PEERS} (2)")
    ap.add_argument("--steps", type=int, default=None, help="steps of the run, 100..10000 (300)")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="stop after this many steps of the run (fixtures, quick checks)")
    ap.add_argument("--width", type=int, default=None, help="model width, 16..128 (32)")
    ap.add_argument("--seq-len", type=int, default=None, help="sequence length, 16..128 (32)")
    ap.add_argument("--batch", type=int, default=None, help="batch per device, 2..32 (8)")
    ap.add_argument("--lr", type=int, default=None, help="learning rate x1000, 5..50 (10)")
    ap.add_argument("--layers", type=int, default=None, help="transformer blocks, 1..8 (2)")
    ap.add_argument("--heads", type=int, default=None, help="attention heads, 1..8 (4)")
    ap.add_argument("--seed", type=int, default=None, help="run seed, 0..2^32-1 (1234)")
    ap.add_argument("--data", default=None, help="a parquet file with a 'text' column (default: built-in corpus)")
    ap.add_argument("--json", action="store_true", help="one JSON object per step: step, loss, hashes")
    ap.add_argument("--save", default=None, help="write a .pt checkpoint (peer 0's replica) at the end")
    ap.add_argument("--resume", default=None, help="continue the run of a .pt checkpoint bit-exactly")
    args = ap.parse_args(argv)
    if not 1 <= args.peers <= MAX_PEERS:
        ap.error(f"peers (--peers) must be in 1..{MAX_PEERS}, got {args.peers}")
    flags = {"steps": args.steps, "width": args.width, "seq_len": args.seq_len, "batch": args.batch,
             "lr_x1000": args.lr, "layers": args.layers, "heads": args.heads, "seed": args.seed}
    given = {k: v for k, v in flags.items() if v is not None}
    if args.resume is not None:
        if given:
            ap.error(f"--resume uses the checkpoint's settings; drop {', '.join(sorted(given))}")
        return args, None
    try:
        cfg = Config(**given)
    except ConfigError as e:
        ap.error(str(e))
    if args.stop_after is not None and not 1 <= args.stop_after <= cfg.steps:
        ap.error(f"--stop-after must be in 1..{cfg.steps} (the run's steps), got {args.stop_after}")
    return args, cfg


def load_group(path, peers: int, stream):
    """A group of `peers` replicas, each restored from the checkpoint at path."""
    from .checkpoint import load_checkpoint
    ck = load_checkpoint(path)
    cfg = Config.from_dict(ck.config)
    replicas = []
    for _ in range(peers):
        adam = copy.deepcopy(ck.adam)
        replicas.append(Replica(copy.deepcopy(ck.params), adam))
    return cfg, Group(cfg, peers, stream, replicas=replicas), ck


def main(argv=None) -> int:
    args, cfg = parse_args(sys.argv[1:] if argv is None else argv)
    from .checkpoint import CheckpointError
    try:
        stream = data.builtin_stream() if args.data is None else data.parquet_stream(args.data)
        if args.resume is not None:
            cfg, group, ck = load_group(args.resume, args.peers, stream)
            if (ck.extra or {}).get("data") not in (None, data_label(args.data)):
                print(f"warning: the checkpoint was trained on {ck.extra['data']}, "
                      f"this run reads {data_label(args.data)}", file=sys.stderr)
        else:
            group = Group(cfg, args.peers, stream)
        data.batch_starts(len(stream), cfg.seed, 0, 0, 1, cfg.seq_len)   # stream long enough?
    except (data.DataError, CheckpointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    left = cfg.steps - group.replicas[0].step
    n = left if args.stop_after is None else min(args.stop_after, left)
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
    if args.save is not None:
        from .checkpoint import save_checkpoint
        r = group.replicas[0]
        save_checkpoint(args.save, config=cfg, params=r.params, step=r.step, adam_m=r.adam["m"],
                        adam_v=r.adam["v"], adam_t=r.adam["t"], extra={"data": data_label(args.data)})
        print(f"saved step {r.step} to {args.save}", file=sys.stderr)
    return 0


def data_label(path) -> str:
    from pathlib import Path
    return "builtin" if path is None else f"parquet:{Path(path).name}"


if __name__ == "__main__":
    sys.exit(main())
