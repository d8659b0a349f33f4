"""The reference trainer: P simulated peers in one process, each with its own replica. Its
command line, `python -m daisy.train`, is daisy/cli.py (this module's `__main__` runs it).

Per step s (0-based): every peer i computes (loss_i, g_i) on batch (seed, s, slot i) with its own
copy of the weights; the group reduces G = reduce_gradients(g); every peer applies Adam with G
to its own copy and hashes it. Honest replicas print P equal hashes on every line.

A step, per replica: local step (loss, grads on its own batch) -> collective.exchange(...) ->
the slot-ordered reduce (daisy.collective, daisy.reduce) -> Adam -> hash: Trainer.local_step,
then Trainer.apply with G (twin of frontend_js/train.js). With local steps H > 1 each replica
takes H Adam steps on its own batches between exchanges, then the group averages the weight
deltas through the codec and steps to their mean (Group.local_step; docs/VERIFICATION.md
"Local steps"): one exchange per H steps, for links slower than a step's compute. Where a slot's
batch comes from is a BatchSource (daisy/batch_source.py): StreamBatches (a token stream in
memory: the built-in corpus or --data) or HttpBatches (the Space's GET /data/batch, with a
bounded prefetch of the next steps and the outage wait). The roster schedule (--roster
STEP:PEERS[:SLOTS],...: the peers of each step, the slots that leave) is parse_roster,
check_roster, peers_at and left_at below.
"""
import copy
import re
from collections import OrderedDict

import numpy as np

from .batch_source import StreamBatches
from .collective import SimulatedCollective
from .config import Config
from .hashing import weight_hash
from .model import init_params, loss_and_grads, param_shapes
from .optim import adam_init, adam_step
from .reduce import reduce_losses
from .units import qmatmul

MAX_PEERS = 64


class Replica:
    """One peer's state: weights and Adam moments; in a run of local steps (Config.local_steps
    H > 1) also the group's weights at the last exchange (`anchor`; None otherwise). Between
    exchanges `params` and `adam` are this replica's own; at an exchange every replica's params
    become the new anchor (docs/VERIFICATION.md "Local steps"). t0: the step its Adam state
    started at (0; a joiner of a run of local steps starts a fresh one at a round's start)."""

    def __init__(self, params, adam, anchor=None, t0=0):
        self.params, self.adam, self.anchor, self.t0 = params, adam, anchor, t0

    @property
    def step(self) -> int:
        return self.t0 + self.adam["t"]


def copy_replica(r: Replica) -> Replica:
    """The replica's whole state, copied: what a joining device receives, what an audit's
    rollback restores (the one snapshot rule; frontend_js/train.js cloneReplica is its twin)."""
    return Replica(copy.deepcopy(r.params), copy.deepcopy(r.adam), copy.deepcopy(r.anchor), r.t0)


def local_joiner(r: Replica) -> Replica:
    """A joiner of a run of local steps, at a round's start (r: any replica there): the group's
    weights (W = A, which a joiner checks against the group's hash) and a fresh Adam state
    (m = v = 0, t = 0: nothing another device's own moments would have to be trusted for)."""
    return Replica(copy.deepcopy(r.anchor), adam_init(r.anchor), copy.deepcopy(r.anchor), r.step)


def is_exchange_step(cfg: Config, s: int) -> bool:
    """Whether 0-based step s ends with an exchange: every step when H = 1; else the last step
    of each round of H (s + 1 a multiple of H) and the run's last step."""
    return cfg.local_steps == 1 or (s + 1) % cfg.local_steps == 0 or s + 1 == cfg.steps


class Trainer:
    """One replica's training step (twin of frontend_js/train.js Trainer): local_step on its own
    batch with its own weights, then apply the group's G. batches: a BatchSource
    (daisy/batch_source.py); mm: the INT8 unit's matmul."""

    def __init__(self, cfg: Config, replica: Replica, batches, mm=qmatmul):
        self.cfg, self.replica, self.batches, self.mm = cfg, replica, batches, mm

    def local_step(self, step: int, slot: int):
        """(loss, grads) of this replica on the batch of (seed, step, slot)."""
        x, y = self.batches.get(step, slot)                               # (B, T) each
        return loss_and_grads(self.replica.params, self.cfg, x, y, self.mm)

    def apply(self, G):
        """Adam with the group's G, then the hash -> (step number after it, hash)."""
        adam_step(self.replica.params, G, self.replica.adam, self.cfg.lr)
        return self.replica.step, weight_hash(self.replica.params)

    # -- local steps (cfg.local_steps = H > 1; docs/VERIFICATION.md "Local steps") --------------
    def local_apply(self, g) -> None:
        """An inner step: Adam with this replica's own gradient, no exchange."""
        adam_step(self.replica.params, g, self.replica.adam, self.cfg.lr)

    def delta(self):
        """What this replica sends at an exchange: D_i = anchor - params, per tensor."""
        r = self.replica
        return OrderedDict((name, r.anchor[name] - w) for name, w in r.params.items())

    def outer(self, D):
        """The outer step with the group's D (the slot-ordered mean of the D_i, through the
        codec): anchor = anchor - D, the replicas' weights averaged; params = anchor.
        -> (step number, hash of the new weights)."""
        r = self.replica
        for name in r.anchor:
            r.anchor[name] = r.anchor[name] - D[name]
        r.params = copy.deepcopy(r.anchor)
        return r.step, weight_hash(r.params)


def with_local_state(r: Replica) -> Replica:
    """A replica entering a run of local steps at an exchange: anchor = its weights."""
    if r.anchor is None:
        r.anchor = copy.deepcopy(r.params)
    return r


def check_loss(loss: float, step: int) -> None:
    if not np.isfinite(loss):
        raise FloatingPointError(f"loss became {loss} at step {step}: lower the learning rate")


class Group:
    """P replicas training in lockstep; `batches` is a BatchSource or a token stream."""

    def __init__(self, cfg: Config, peers: int, batches, mm=qmatmul, replicas=None):
        self.cfg, self.mm = cfg, mm
        self.batches = StreamBatches(batches, cfg) if isinstance(batches, np.ndarray) else batches
        if replicas is None:
            params = init_params(cfg)
            replicas = [Replica(copy.deepcopy(params), adam_init(params)) for _ in range(peers)]
        if cfg.local_steps > 1:
            replicas = [with_local_state(r) for r in replicas]
        self.replicas = replicas
        self.trainers = [Trainer(cfg, r, self.batches, mm) for r in replicas]
        self.collective = SimulatedCollective(param_shapes(cfg), seed=cfg.seed, exchange=cfg.exchange)

    def resize(self, peers: int, left=()) -> None:
        """Slots 0..peers-1 from now on: the slots `left` names leave first (the others keep
        their order and their own state under their new slot numbers), then a new slot gets a
        copy of replica 0 (weights, Adam m, v, t), what a joining device receives (with local
        steps: the anchor and a fresh Adam state, `local_joiner`); shrinking without `left`
        drops the highest slots. (With local steps each replica's Adam state is its own: which
        slot left matters.)"""
        if left:
            kept = [i for i in range(len(self.replicas)) if i not in left]
            self.replicas = [self.replicas[i] for i in kept]
            self.trainers = [self.trainers[i] for i in kept]
        join = local_joiner if self.cfg.local_steps > 1 else copy_replica
        grown = [join(self.replicas[0]) for _ in range(peers - len(self.replicas))]
        self.replicas = self.replicas[:peers] + grown
        self.trainers = self.trainers[:peers] + [Trainer(self.cfg, r, self.batches, self.mm) for r in grown]

    def step(self):
        """Run one step; returns (step number after it, group loss, [hash per peer])."""
        s = self.replicas[0].step
        roster = list(range(len(self.trainers)))       # slot i = replica i
        if self.cfg.local_steps > 1:
            return self.local_step(s, roster)
        handles = []
        for slot, t in enumerate(self.trainers):       # each peer's local step
            loss_i, grads_i = t.local_step(s, slot)
            handles.append(self.collective.exchange(s, roster, slot, loss_i, grads_i))
        applied = []
        for t, h in zip(self.trainers, handles):
            loss, G = h.result()                       # the same bits for every slot
            applied.append(t.apply(G))
        check_loss(loss, s + 1)
        return s + 1, loss, [hash_ for _, hash_ in applied]

    def local_step(self, s: int, roster):
        """A step of local steps: each replica's own Adam step; at an exchange step the deltas go
        through the collective (its codec, keyed on step s) and every replica takes the outer
        step. The loss is the slot-ordered reduce of the replicas' losses; the hashes are each
        replica's anchor (the group's weights at its last exchange: equal on every replica; its
        own weights between exchanges are its own)."""
        losses, hashes = {}, []
        for slot, t in enumerate(self.trainers):
            losses[slot], g = t.local_step(s, slot)
            t.local_apply(g)
        loss = reduce_losses(losses)
        if is_exchange_step(self.cfg, s):
            handles = [self.collective.exchange(s, roster, slot, losses[slot], t.delta())
                       for slot, t in enumerate(self.trainers)]
            for t, h in zip(self.trainers, handles):
                loss, D = h.result()
                hashes.append(t.outer(D)[1])
        else:
            hashes = [weight_hash(t.replica.anchor) for t in self.trainers]
        check_loss(loss, s + 1)
        return s + 1, loss, hashes


# -- the roster schedule: how many peers compute each step -----------------------------------
def parse_roster(text: str) -> list[tuple]:
    """"0:2,10:3" -> [(0, 2), (10, 3)]: from 0-based step index 0 on 2 peers, from 10 on 3. An
    entry may name the slots that leave (STEP:PEERS:SLOTS, the slots of the roster before it
    joined by '.'): "0:3,8:1:0.2" -> [(0, 3), (8, 1, (0, 2))], slots 0 and 2 leave at step 8 and
    slot 1 goes on as slot 0; PEERS above the ones that stay appends joiners after them; a
    shrink without SLOTS drops the highest slots. Raises
    ValueError naming the bad entry (the messages are mirrored by frontend_js/train.js)."""
    entries, schedule = text.split(","), []
    for i, entry in enumerate(entries):
        if re.fullmatch(r"[0-9]{1,9}:[0-9]{1,9}(:[0-9]{1,2}(\.[0-9]{1,2}){0,62})?", entry) is None:
            raise ValueError(f"--roster entry '{entry}' is not STEP:PEERS (a 0-based step index "
                             f"and a peer count, e.g. 0:2,10:3) or STEP:PEERS:SLOTS (the slots "
                             f"that leave, e.g. 8:1:0.2)")
        fields = entry.split(":")
        step, peers = int(fields[0]), int(fields[1])
        if not 1 <= peers <= MAX_PEERS:
            raise ValueError(f"--roster entry '{entry}': peers must be in 1..{MAX_PEERS}")
        if schedule and step <= schedule[-1][0]:
            raise ValueError(f"--roster entry '{entry}': steps must be strictly increasing "
                             f"(it follows '{entries[i - 1]}')")
        if len(fields) == 3:
            left = tuple(int(x) for x in fields[2].split("."))
            before = schedule[-1][1] if schedule else 0
            if any(b <= a for a, b in zip(left, left[1:])) or left[-1] >= before:
                raise ValueError(f"--roster entry '{entry}': the slots that leave must be increasing "
                                 f"slots of the {before} peers before it")
            if before - len(left) > peers:
                raise ValueError(f"--roster entry '{entry}': {before - len(left)} of the {before} "
                                 f"peers stay, more than {peers}")
            schedule.append((step, peers, left))
        else:
            schedule.append((step, peers))
    return schedule


def check_roster(schedule, text: str, start: int, steps: int, local_steps: int = 1) -> None:
    """The schedule covers a run of `steps` steps that starts (or resumes) at step index `start`;
    with local steps H > 1 the roster changes only at a round's start (a multiple of H: the
    step after an exchange; docs/VERIFICATION.md "Local steps")."""
    entries = text.split(",")
    if schedule[0][0] > start:
        raise ValueError(f"--roster entry '{entries[0]}': the first entry must be at or before "
                         f"step {start}, where this run starts")
    if schedule[-1][0] >= steps:
        raise ValueError(f"--roster entry '{entries[-1]}' is past the run's last step index "
                         f"{steps - 1}")
    for entry, e in zip(entries, schedule):
        if local_steps > 1 and e[0] > start and e[0] % local_steps != 0:
            raise ValueError(f"--roster entry '{entry}': with --local-steps {local_steps} the roster "
                             f"changes only at a round's start (a step index that is a multiple "
                             f"of {local_steps})")


def peers_at(schedule, step: int) -> int:
    """P of 0-based step index `step`: the last entry at or before it."""
    return [e[1] for e in schedule if e[0] <= step][-1]


def left_at(schedule, step: int) -> tuple:
    """The slots that leave at 0-based step index `step` (an entry there naming them), else ()."""
    return next((e[2] for e in schedule if e[0] == step and len(e) == 3), ())


if __name__ == "__main__":          # python -m daisy.train, the documented command (daisy/cli.py)
    import sys
    from .cli import main
    sys.exit(main())
