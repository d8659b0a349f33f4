"""The reference trainer's command line, `python -m daisy.train` (daisy/train.py's `__main__`
runs this module's main): P simulated peers in one process, each with its own replica; every
line says whether the replicas' hashes agree. Twin of frontend_js/cli.mjs: the same flags, the
same lines (--json byte for byte), the same messages for bad arguments.

    python -m daisy.train --peers 2 --steps 300 --json
    python -m daisy.train --stop-after 100 --save run.pt      # first 100 steps of a 300-step run
    python -m daisy.train --resume run.pt                      # the remaining 200, bit-exactly
    python -m daisy.train --data-url http://127.0.0.1:7860     # the Space's keyed batches
    python -m daisy.train --roster "0:2,10:3,15:2"             # a run with churn (below)
    python -m daisy.train --peers 3 --attack "slot=1,from=39,kind=scale:-1000"   # audited (daisy/attack.py)
    python -m daisy.train --local-steps 8                      # exchange every 8th step (below)
    python -m daisy.train --local-steps 4 --attack "slot=1,from=8,kind=moments"   # audited rounds (daisy/attack_rounds.py)

--roster STEP:PEERS,... is the run's peer count per step (0-based step index: peers from that
step on; steps strictly increasing, the first at or before the run's start step; with --resume
the steps are the run's absolute step indices). Where P grows, each new replica is a copy of
replica 0 (weights, Adam m, v, t), what a joining device receives; where P shrinks, the highest
slots are dropped, or the slots an entry STEP:PEERS:SLOTS names ("0:3,8:2:1": slot 1 leaves at
step 8; the others keep their order and their own state; PEERS above the ones that stay appends
joiners). With --local-steps H every entry after the start is at a round's start (a multiple of
H) and a joiner takes the group's weights with a fresh Adam state. --peers N is the schedule "0:N"
(docs/VERIFICATION.md, "Roster schedule").

With --local-steps H > 1 each replica takes H Adam steps on its own batches between exchanges,
then the group averages the weight deltas through the codec and steps to their mean
(docs/VERIFICATION.md "Local steps"): one exchange per H steps, for links slower than a step's
compute. The step itself, the Group and the roster rules are daisy/train.py; where a slot's
batch comes from, daisy/batch_source.py (--data-url: HttpBatches, with a bounded prefetch of the
next steps and the outage wait; else StreamBatches over the built-in corpus or --data).
"""
import argparse
import json
import sys
from pathlib import Path

from . import data
from .attack import AuditedRun, check_attack, parse_attack, parse_audit_rate, run_audited
from .attack_rounds import RoundAuditedRun
from .audit import default_audit_rate
from .batch_source import BatchError, HttpBatches, StreamBatches, data_info
from .config import Config, ConfigError
from .files.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .train import MAX_PEERS, Group, Replica, check_roster, copy_replica, left_at, parse_roster, peers_at


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m daisy.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    # model settings default to None so --resume can tell which were given explicitly
    ap.add_argument("--peers", type=int, default=None, help=f"simulated peers, 1..{MAX_PEERS} (2)")
    ap.add_argument("--roster", default=None, metavar="STEP:PEERS[:SLOTS],...",
                    help='peers per step: "0:2,10:3" = steps 0..9 on 2 peers, from 10 on 3 (a new '
                         "replica copies replica 0; shrinking drops the highest slots, or the ones "
                         '"8:2:1" names: slot 1 leaves at step 8)')
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
    ap.add_argument("--exchange", default=None, metavar="CODEC",
                    help="how gradients travel between peers: f64 or int8 (f64; daisy/exchange_codec.py)")
    ap.add_argument("--local-steps", type=int, default=None,
                    help="steps each peer takes between exchanges, 1..64 (1): H > 1 averages the peers' "
                         "weights (int8 deltas) every H steps (docs/VERIFICATION.md)")
    ap.add_argument("--data", default=None, help="a parquet file with a 'text' column (default: built-in corpus)")
    ap.add_argument("--data-url", default=None, metavar="http://HOST:PORT",
                    help="train on the keyed batches of a DaisyChain server's /data/batch (the "
                         "batches a browser peer gets); prints the server's data id")
    ap.add_argument("--data-id", default=None,
                    help="with --data-url: refuse to train unless the server's data id is this one")
    ap.add_argument("--json", action="store_true", help="one JSON object per step: step, loss, hashes")
    ap.add_argument("--save", default=None, help="write a .pt checkpoint (peer 0's replica) at the end")
    ap.add_argument("--resume", default=None, help="continue the run of a .pt checkpoint bit-exactly")
    ap.add_argument("--attack", default=None, metavar="slot=S,from=STEP,kind=KIND",
                    help="an audited run in which peer S forges its gradient from step index STEP on "
                         "(daisy/attack.py: kinds, audits, removal)")
    ap.add_argument("--audit-rate", default=None,
                    help="an audited run in which each slot's contribution to a step is audited with "
                         "this chance, 0..1 (0.1 with --attack)")
    args = ap.parse_args(argv)
    if args.data is not None and args.data_url is not None:
        ap.error("give --data or --data-url, not both")
    if args.data_id is not None and args.data_url is None:
        ap.error("--data-id checks the server of --data-url; give --data-url too")
    if args.data_url is not None and not args.data_url.startswith(("http://", "https://")):
        ap.error(f"--data-url must be an http:// or https:// URL, got {args.data_url!r}")
    if args.peers is not None and args.roster is not None:
        ap.error("give --roster or --peers, not both (--peers N is the roster 0:N)")
    if args.peers is not None and not 1 <= args.peers <= MAX_PEERS:
        ap.error(f"peers (--peers) must be in 1..{MAX_PEERS}, got {args.peers}")
    try:
        args.schedule = (parse_roster(args.roster) if args.roster is not None
                         else [(0, 2 if args.peers is None else args.peers)])
    except ValueError as e:
        ap.error(str(e))
    args.attack_spec = None
    if args.attack is not None or args.audit_rate is not None:
        audited_args(ap, args)
    flags = {"steps": args.steps, "width": args.width, "seq_len": args.seq_len, "batch": args.batch,
             "lr_x1000": args.lr, "layers": args.layers, "heads": args.heads, "seed": args.seed,
             "exchange": args.exchange, "local_steps": args.local_steps}
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
    if cfg.local_steps > 1 and args.save is not None and args.stop_after not in (None, cfg.steps):
        ap.error("--save with --local-steps only at the run's end: between exchanges every replica has "
                 "its own weights and Adam state, which a checkpoint of one replica does not hold")
    if (cfg.local_steps > 1 and args.audit_rate is not None and args.stop_after not in (None, cfg.steps)
            and args.stop_after % cfg.local_steps != 0):
        ap.error(f"--stop-after with --local-steps {cfg.local_steps} and audits ends at a round's exchange "
                 f"(a multiple of {cfg.local_steps}, or the run's steps), got {args.stop_after}")
    if args.roster is not None:
        try:
            check_roster(args.schedule, args.roster, 0, cfg.steps, cfg.local_steps)
        except ValueError as e:
            ap.error(str(e))
    if args.attack_spec is not None:
        try:
            check_attack(args.attack_spec, args.schedule[0][1], cfg.steps, cfg.local_steps)
        except ValueError as e:
            ap.error(str(e))
    return args, cfg


def audited_args(ap, args) -> None:
    """--attack / --audit-rate: an audited run (daisy/attack.py) of --peers from step 0."""
    if args.roster is not None or args.resume is not None or args.save is not None:
        ap.error("--attack and --audit-rate run --peers P from step 0: drop --roster, --resume and --save")
    try:
        args.audit_rate = (default_audit_rate(args.local_steps or 1) if args.audit_rate is None
                           else parse_audit_rate(args.audit_rate))
    except ValueError as e:
        ap.error(str(e))
    if args.attack is not None:
        try:
            args.attack_spec = parse_attack(args.attack)
        except ValueError as e:
            ap.error(str(e))


def resume_group(ck, cfg: Config, peers: int, batches):
    """A group of `peers` replicas, each restored from the checkpoint ck."""
    replicas = [copy_replica(Replica(ck.params, ck.adam)) for _ in range(peers)]
    return Group(cfg, peers, batches, replicas=replicas)


def open_batches(args, cfg: Config):
    """The run's BatchSource and its label (kept in checkpoints): --data-url, --data or builtin."""
    if args.data_url is not None:
        info = data_info(args.data_url)
        data_id = info.get("data_id")
        if not data_id:
            raise BatchError("data_unavailable", f"the data server at {args.data_url} has no data to serve: "
                                                 f"{info.get('error') or info.get('reason') or 'no data_id'}")
        if args.data_id is not None and data_id != args.data_id:
            raise BatchError("data_changed", f"the data server at {args.data_url} serves {data_id}, "
                                             f"not {args.data_id} (--data-id)")
        print(f"data: {data_id} from {args.data_url} (source {info.get('source')}"
              + (f", {info['reason']}" if info.get("reason") else "") + ")", file=sys.stderr)
        return HttpBatches(cfg, base=args.data_url, data_id=data_id), data_id
    if args.data is not None:
        return StreamBatches(data.parquet_stream(args.data), cfg), data_label(args.data)
    return StreamBatches(data.builtin_stream(), cfg), data_label(None)


def main(argv=None) -> int:
    args, cfg = parse_args(sys.argv[1:] if argv is None else argv)
    batches = None
    try:
        ck = None
        if args.resume is not None:
            ck = load_checkpoint(args.resume)
            cfg = Config.from_dict(ck.config)
        batches, label = open_batches(args, cfg)
        if ck is not None:
            group = resume_group(ck, cfg, 1, batches)                  # train() sets the roster's P
            if args.roster is not None:
                try:
                    check_roster(args.schedule, args.roster, group.replicas[0].step, cfg.steps, cfg.local_steps)
                except ValueError as e:
                    print(f"error: {e} (resuming {args.resume})", file=sys.stderr)
                    return 2
            if (ck.extra or {}).get("data") not in (None, label):
                print(f"warning: the checkpoint was trained on {ck.extra['data']}, "
                      f"this run reads {label}", file=sys.stderr)
        else:
            group = Group(cfg, peers_at(args.schedule, 0), batches)
        if args.audit_rate is not None:
            runner = RoundAuditedRun if cfg.local_steps > 1 else AuditedRun      # local steps: rounds are audited
            return run_audited(args, cfg, group, sys.stdout, sys.stderr, runner)
        rc = train(args, cfg, group, label)
        if isinstance(batches, HttpBatches):
            print(f"data: {batches.wait_summary()}", file=sys.stderr)
        return rc
    except (data.DataError, CheckpointError, OSError) as e:      # BatchError is a DataError
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if batches is not None:
            batches.close()


def train(args, cfg: Config, group: Group, label: str) -> int:
    left = cfg.steps - group.replicas[0].step
    n = left if args.stop_after is None else min(args.stop_after, left)
    for _ in range(n):
        s = group.replicas[0].step
        group.resize(peers_at(args.schedule, s), left_at(args.schedule, s))
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
        r = group.replicas[0]
        save_checkpoint(args.save, config=cfg, params=r.params, step=r.step, adam_m=r.adam["m"],
                        adam_v=r.adam["v"], adam_t=r.adam["t"], extra={"data": label})
        print(f"saved step {r.step} to {args.save}", file=sys.stderr)
    return 0


def data_label(path) -> str:
    return "builtin" if path is None else f"parquet:{Path(path).name}"


if __name__ == "__main__":
    sys.exit(main())
