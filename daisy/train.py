"""The reference trainer: P simulated peers in one process, each with its own replica.

Per step s (0-based): every peer i computes (loss_i, g_i) on batch (seed, s, slot i) with its own
copy of the weights; the group reduces G = reduce_gradients(g); every peer applies Adam with G
to its own copy and hashes it. Honest replicas print P equal hashes on every line.

    python -m daisy.train --peers 2 --steps 300 --json
    python -m daisy.train --stop-after 100 --save run.pt      # first 100 steps of a 300-step run
    python -m daisy.train --resume run.pt                      # the remaining 200, bit-exactly
    python -m daisy.train --data-url http://127.0.0.1:7860     # the Space's keyed batches
    python -m daisy.train --roster "0:2,10:3,15:2"             # a run with churn (below)

--roster STEP:PEERS,... is the run's peer count per step (0-based step index: peers from that
step on; steps strictly increasing, the first at or before the run's start step; with --resume
the steps are the run's absolute step indices). Where P grows, each new replica is a copy of
replica 0 (weights, Adam m, v, t), what a joining device receives; where P shrinks, the highest
slots are dropped. --peers N is the schedule "0:N" (docs/VERIFICATION.md, "Roster schedule").

A step, per replica: local step (loss, grads on its own batch) -> collective.exchange(...) ->
the slot-ordered reduce (daisy.collective, daisy.reduce) -> Adam -> hash. Where a slot's batch
comes from is a BatchSource: StreamBatches (a token stream in memory: the built-in corpus or
--data) or HttpBatches (the Space's GET /data/batch, with a bounded prefetch of the next steps).
"""
import argparse
import copy
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import data
from .collective import SimulatedCollective
from .config import Config, ConfigError
from .hashing import weight_hash
from .model import init_params, loss_and_grads, param_shapes
from .optim import adam_init, adam_step
from .units import qmatmul

MAX_PEERS = 64
PREFETCH_STEPS = 4          # HttpBatches asks for this many steps ahead of the one it serves
                            # (bench/bench_data_prefetch.py: 2 still waited ~0.2 s per 30 steps
                            # on a 100 ms hub, 4 waited ~0)
PREFETCH_WORKERS = 4        # at most this many batch requests in flight
HTTP_TIMEOUT_S = 60         # a cold FineWeb-Edu row group can take a while on a slow hub


# -- where a slot's batch comes from -----------------------------------------------------------
class BatchError(data.DataError):
    """A batch cannot be had (server unreachable, HTTP error, data changed); the message says why."""


class StreamBatches:
    """Batches of a token stream in memory, by daisy.data.get_batch."""

    def __init__(self, stream: np.ndarray):
        self.stream = stream

    def get(self, seed: int, step: int, slot: int, B: int, T: int):
        """-> x (B, T), y (B, T) int64 token ids of the batch (seed, step, slot)."""
        return data.get_batch(self.stream, seed, step, slot, B, T)

    def check(self, seq_len: int) -> None:
        data.batch_starts(len(self.stream), 0, 0, 0, 1, seq_len)     # stream long enough?

    def close(self) -> None:
        pass


class HttpBatches:
    """The Space's keyed batches: GET {base_url}/data/batch?seed=&step=&slot=&batch=&seq_len=
    answers B*(T+1) little-endian uint16 tokens, rows row-major (daisy/space/datastream.py).

    Serving (seed, step, slot) also asks for steps step+1..step+PREFETCH_STEPS of that slot in
    the background (a pool of PREFETCH_WORKERS threads, so at most that many requests in
    flight; answers kept until taken, keys of earlier steps dropped), so a step does not wait
    on the network. Every batch must carry the data id /data/info gave (X-Daisy-Data-Id): a
    server that switched corpora mid-run stops the run instead of silently changing the data."""

    def __init__(self, base_url: str, *, prefetch_steps: int = PREFETCH_STEPS,
                 workers: int = PREFETCH_WORKERS, timeout_s: float = HTTP_TIMEOUT_S):
        self.base_url = base_url.rstrip("/")
        self.prefetch_steps, self.timeout_s = prefetch_steps, timeout_s
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="daisy-batch")
        self.inflight = {}            # (seed, step, slot, B, T) -> Future of (x, y)
        self.lock = threading.Lock()
        self.waits_s: list[float] = []  # per get(): time the caller waited for its batch
        self.info = self._get_json("/data/info")
        self.data_id = self.info.get("data_id")
        if not self.data_id:
            raise BatchError(f"the data server at {self.base_url} has no data to serve: "
                             f"{self.info.get('error') or self.info.get('reason') or 'no data_id'}")

    def _open(self, path: str, params: dict | None = None):
        url = self.base_url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            return urllib.request.urlopen(url, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            body = e.read().decode("utf-8", "replace")
            try:
                message = json.loads(body)["error"]
            except (ValueError, KeyError, TypeError):
                message = " ".join(body.split())[:200] or e.reason
            raise BatchError(f"the data server answered HTTP {e.code} to {path}: {message}") from None
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", None) or e
            raise BatchError(f"cannot reach the data server at {self.base_url}: {why}") from None

    def _get_json(self, path: str) -> dict:
        with self._open(path) as r:
            try:
                return json.loads(r.read())
            except ValueError:
                raise BatchError(f"{self.base_url}{path} did not answer JSON: is it a DaisyChain "
                                 f"server?") from None

    def _fetch(self, key):
        seed, step, slot, B, T = key
        with self._open("/data/batch", dict(seed=seed, step=step, slot=slot, batch=B, seq_len=T)) as r:
            got_id, body = r.headers.get("X-Daisy-Data-Id"), r.read()
            reason = r.headers.get("X-Daisy-Fallback-Reason")
        if got_id != self.data_id:
            raise BatchError(f"the data server's data changed during the run: batch {key[:3]} "
                             f"is {got_id}, the run started on {self.data_id}"
                             + (f" ({reason})" if reason else ""))
        if len(body) != 2 * B * (T + 1):
            raise BatchError(f"batch {key[:3]}: {len(body)} bytes, expected {2 * B * (T + 1)}")
        return data.split_rows(np.frombuffer(body, dtype="<u2"), B, T)

    def _future(self, key):
        # callers hold self.lock
        f = self.inflight.get(key)
        if f is None:
            f = self.inflight[key] = self.pool.submit(self._fetch, key)
        return f

    def get(self, seed: int, step: int, slot: int, B: int, T: int):
        """-> x (B, T), y (B, T) int64 token ids of the batch (seed, step, slot)."""
        key = (seed, step, slot, B, T)
        with self.lock:
            f = self._future(key)
            for ahead in range(1, self.prefetch_steps + 1):
                self._future((seed, step + ahead, slot, B, T))
            # batches of this slot at or before this step are never asked for again
            for k in [k for k in self.inflight if k[2] == slot and k[1] <= step]:
                del self.inflight[k]
        t0 = time.perf_counter()
        try:
            return f.result()
        finally:
            self.waits_s.append(time.perf_counter() - t0)

    def wait_summary(self) -> str:
        w = self.waits_s
        if not w:
            return "no batches fetched"
        return (f"{len(w)} batches, waited {sum(w) * 1e3:.0f} ms in all "
                f"(max {max(w) * 1e3:.0f} ms, first {w[0] * 1e3:.0f} ms)")

    def check(self, seq_len: int) -> None:
        pass                          # the server validates every request

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Replica:
    """One peer's state: weights and Adam moments."""

    def __init__(self, params, adam):
        self.params, self.adam = params, adam

    @property
    def step(self) -> int:
        return self.adam["t"]


def copy_replica(r: Replica) -> Replica:
    return Replica(copy.deepcopy(r.params), copy.deepcopy(r.adam))


class Group:
    """P replicas training in lockstep; `batches` is a BatchSource or a token stream."""

    def __init__(self, cfg: Config, peers: int, batches, mm=qmatmul, replicas=None):
        self.cfg, self.mm = cfg, mm
        self.batches = StreamBatches(batches) if isinstance(batches, np.ndarray) else batches
        if replicas is None:
            params = init_params(cfg)
            replicas = [Replica(copy.deepcopy(params), adam_init(params)) for _ in range(peers)]
        self.replicas = replicas
        self.collective = SimulatedCollective(param_shapes(cfg), seed=cfg.seed, exchange=cfg.exchange)

    def resize(self, peers: int) -> None:
        """Slots 0..peers-1 from now on: a new slot gets a copy of replica 0 (weights, Adam m, v,
        t), what a joining device receives; shrinking drops the highest slots."""
        grown = [copy_replica(self.replicas[0]) for _ in range(peers - len(self.replicas))]
        self.replicas = self.replicas[:peers] + grown

    def step(self):
        """Run one step; returns (step number after it, group loss, [hash per peer])."""
        cfg, s = self.cfg, self.replicas[0].step
        roster = list(range(len(self.replicas)))       # slot i = replica i
        handles = []
        for slot, r in enumerate(self.replicas):       # each peer's local step
            x, y = self.batches.get(cfg.seed, s, slot, cfg.batch, cfg.seq_len)   # (B, T) each
            loss_i, grads_i = loss_and_grads(r.params, cfg, x, y, self.mm)
            handles.append(self.collective.exchange(s, roster, slot, loss_i, grads_i))
        for r, h in zip(self.replicas, handles):
            loss, G = h.result()                       # the same bits for every slot
            adam_step(r.params, G, r.adam, cfg.lr)
        if not np.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at step {s + 1}: lower the learning rate")
        return s + 1, loss, [weight_hash(r.params) for r in self.replicas]


# -- the roster schedule: how many peers compute each step -----------------------------------
def parse_roster(text: str) -> list[tuple[int, int]]:
    """"0:2,10:3" -> [(0, 2), (10, 3)]: from 0-based step index 0 on 2 peers, from 10 on 3.
    Raises ValueError naming the bad entry (the messages are mirrored by frontend_js/train.js)."""
    entries, schedule = text.split(","), []
    for i, entry in enumerate(entries):
        if re.fullmatch(r"[0-9]{1,9}:[0-9]{1,9}", entry) is None:
            raise ValueError(f"--roster entry '{entry}' is not STEP:PEERS (a 0-based step index "
                             f"and a peer count, e.g. 0:2,10:3)")
        step, peers = (int(x) for x in entry.split(":"))
        if not 1 <= peers <= MAX_PEERS:
            raise ValueError(f"--roster entry '{entry}': peers must be in 1..{MAX_PEERS}")
        if schedule and step <= schedule[-1][0]:
            raise ValueError(f"--roster entry '{entry}': steps must be strictly increasing "
                             f"(it follows '{entries[i - 1]}')")
        schedule.append((step, peers))
    return schedule


def check_roster(schedule, text: str, start: int, steps: int) -> None:
    """The schedule covers a run of `steps` steps that starts (or resumes) at step index `start`."""
    entries = text.split(",")
    if schedule[0][0] > start:
        raise ValueError(f"--roster entry '{entries[0]}': the first entry must be at or before "
                         f"step {start}, where this run starts")
    if schedule[-1][0] >= steps:
        raise ValueError(f"--roster entry '{entries[-1]}' is past the run's last step index "
                         f"{steps - 1}")


def peers_at(schedule, step: int) -> int:
    """P of 0-based step index `step`: the last entry at or before it."""
    return [p for s, p in schedule if s <= step][-1]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m daisy.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    # model settings default to None so --resume can tell which were given explicitly
    ap.add_argument("--peers", type=int, default=None, help=f"simulated peers, 1..{MAX_PEERS} (2)")
    ap.add_argument("--roster", default=None, metavar="STEP:PEERS,...",
                    help='peers per step: "0:2,10:3" = steps 0..9 on 2 peers, from 10 on 3 (a new '
                         "replica copies replica 0; shrinking drops the highest slots)")
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
    ap.add_argument("--data", default=None, help="a parquet file with a 'text' column (default: built-in corpus)")
    ap.add_argument("--data-url", default=None, metavar="http://HOST:PORT",
                    help="train on the keyed batches of a DaisyChain server's /data/batch (the "
                         "batches a browser peer gets); prints the server's data id")
    ap.add_argument("--data-id", default=None,
                    help="with --data-url: refuse to train unless the server's data id is this one")
    ap.add_argument("--json", action="store_true", help="one JSON object per step: step, loss, hashes")
    ap.add_argument("--save", default=None, help="write a .pt checkpoint (peer 0's replica) at the end")
    ap.add_argument("--resume", default=None, help="continue the run of a .pt checkpoint bit-exactly")
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
    flags = {"steps": args.steps, "width": args.width, "seq_len": args.seq_len, "batch": args.batch,
             "lr_x1000": args.lr, "layers": args.layers, "heads": args.heads, "seed": args.seed,
             "exchange": args.exchange}
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
    if args.roster is not None:
        try:
            check_roster(args.schedule, args.roster, 0, cfg.steps)
        except ValueError as e:
            ap.error(str(e))
    return args, cfg


def load_group(path, peers: int, batches):
    """A group of `peers` replicas, each restored from the checkpoint at path."""
    from .files.checkpoint import load_checkpoint
    ck = load_checkpoint(path)
    cfg = Config.from_dict(ck.config)
    replicas = [copy_replica(Replica(ck.params, ck.adam)) for _ in range(peers)]
    return cfg, Group(cfg, peers, batches, replicas=replicas), ck


def open_batches(args):
    """The run's BatchSource and its label (kept in checkpoints): --data-url, --data or builtin."""
    if args.data_url is not None:
        batches = HttpBatches(args.data_url)
        if args.data_id is not None and batches.data_id != args.data_id:
            batches.close()
            raise BatchError(f"the data server at {args.data_url} serves {batches.data_id}, "
                             f"not {args.data_id} (--data-id)")
        info = batches.info
        print(f"data: {batches.data_id} from {args.data_url} (source {info.get('source')}"
              + (f", {info['reason']}" if info.get("reason") else "") + ")", file=sys.stderr)
        return batches, batches.data_id
    if args.data is not None:
        return StreamBatches(data.parquet_stream(args.data)), data_label(args.data)
    return StreamBatches(data.builtin_stream()), data_label(None)


def main(argv=None) -> int:
    args, cfg = parse_args(sys.argv[1:] if argv is None else argv)
    from .files.checkpoint import CheckpointError
    batches = None
    try:
        batches, label = open_batches(args)
        if args.resume is not None:
            cfg, group, ck = load_group(args.resume, 1, batches)    # train() sets the roster's P
            if args.roster is not None:
                try:
                    check_roster(args.schedule, args.roster, group.replicas[0].step, cfg.steps)
                except ValueError as e:
                    print(f"error: {e} (resuming {args.resume})", file=sys.stderr)
                    return 2
            if (ck.extra or {}).get("data") not in (None, label):
                print(f"warning: the checkpoint was trained on {ck.extra['data']}, "
                      f"this run reads {label}", file=sys.stderr)
        else:
            group = Group(cfg, peers_at(args.schedule, 0), batches)
        batches.check(cfg.seq_len)
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
        group.resize(peers_at(args.schedule, group.replicas[0].step))
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
        from .files.checkpoint import save_checkpoint
        r = group.replicas[0]
        save_checkpoint(args.save, config=cfg, params=r.params, step=r.step, adam_m=r.adam["m"],
                        adam_v=r.adam["v"], adam_t=r.adam["t"], extra={"data": label})
        print(f"saved step {r.step} to {args.save}", file=sys.stderr)
    return 0


def data_label(path) -> str:
    from pathlib import Path
    return "builtin" if path is None else f"parquet:{Path(path).name}"


if __name__ == "__main__":
    sys.exit(main())
