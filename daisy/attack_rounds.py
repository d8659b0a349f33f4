"""The audited run of local steps: python -m daisy.train --local-steps H --attack SPEC
[--audit-rate R] (docs/VERIFICATION.md §13 "Rounds of local steps"). frontend_js/attack_rounds.js
is the twin; the two print the same lines.

The audited unit is a slot's round: its H inner steps from the anchor and its own Adam state,
and the delta D_i = anchor - W_i it sends at the round's exchange (step e). A round is a pure
function of the anchor (the same on every replica), the batches (seed, s, i), and the slot's Adam
state at the round's start, so a slot commits, with its messages, to the hash of its Adam state
at the round's end (round_digest, adam_state_hash); an auditor asks for the audited slot's state
at the round's start (its transcript), checks it against the slot's commitment of its round
before (check_start_state; the run's start and a rollback's state are known to all), recomputes
the H steps and compares digests. The beacon, nonces, pairs and codec are keyed on e; the loads
of audit_pairs are counted over the last W rounds. Attack kinds are attack.py's applied to the
delta (stale: its delta of the round before; otherbatch: its round on the batches (seed, s, P +
slot)), and one more:
    moments        honest deltas; at each round's end its Adam m negated (its next round climbs),
                   committed to as it is: a lie of this round, caught when this round is audited
    unchained      honest deltas and commitments; each next round starts from its m negated, not
                   the state it committed to: caught when that next round is audited (its
                   transcript does not hash to its commitment: evidence by itself)
A removal rolls the group back to the round start after the convicted peer's last passed audit;
each survivor restores its own state there and keeps its order, so the kept run is
`python -m daisy.train --local-steps H --roster R` with R naming the slots that left.
"""
import hashlib

import numpy as np

from .attack import AuditedRun, forge
from .audit import (adam_state_hash, audit_load, audit_pairs, beacon, check_start_state, cheap_check,
                    message_bounds, message_hashes, reference_nonce, rollback_step, round_digest, round_end,
                    trusted_step as audit_trusted)
from .collective import flatten_grads, unflatten
from .hashing import weight_hash
from .reduce import reduce_losses
from .train import Group, Trainer, copy_replica


def negate_m(replica) -> None:
    """The forgers' Adam state: m negated in place."""
    for name in replica.adam["m"]:
        replica.adam["m"][name] = -replica.adam["m"][name]


class RoundAuditedRun(AuditedRun):
    """AuditedRun (daisy/attack.py) with a round of H local steps as the step: self.step(emit)
    computes, audits and applies (or rolls back) one round. Keys by step are round starts."""

    unit = ("round of peer", "round")

    def __init__(self, cfg, group, attack, rate: float):
        super().__init__(cfg, group, attack, rate)
        self.snapshots = {0: {pid: copy_replica(r) for pid, r in zip(self.ids, group.replicas)}}
        self.schedule = {}                                    # round start -> its peers (ids), kept timeline
        self.committed = {pid: adam_state_hash(r.adam) for pid, r in zip(self.ids, group.replicas)}
        self.unchain = set()                                  # peers that go on from a state they did not commit to

    def end_of(self, s: int) -> int:
        return round_end(s, self.cfg.local_steps, self.cfg.steps)

    def honest_round(self, replica, r0: int, e: int, slot: int):
        """The round of `replica` (advanced in place) on the batches (seed, s, slot), s = r0..e
        -> ([loss of each step], flat delta)."""
        t, losses = Trainer(self.cfg, replica, self.group.batches, self.group.mm), []
        for s in range(r0, e + 1):
            loss, g = t.local_step(s, slot)
            t.local_apply(g)
            losses.append(loss)
        return losses, flatten_grads(t.delta(), self.shapes)

    def contribute(self, r0: int, e: int, slot: int):
        """What the peer in `slot` sends at the round's exchange: ([losses], flat delta); its
        replica holds its state at the round's end (forged moments for `moments`)."""
        pid, replica = self.ids[slot], self.group.replicas[slot]
        start = copy_replica(replica)
        losses, flat = self.honest_round(replica, r0, e, slot)
        if not self.attacking(pid, e) or self.attack.kind in ("liar-auditor", "liar-owner"):
            return losses, flat
        kind, previous = self.attack.kind, self.previous.get(pid, flat)
        self.previous[pid] = flat
        if kind == "moments":
            negate_m(replica)
            return losses, flat
        if kind == "unchained":          # committed to the honest state, then goes on from another
            self.unchain.add(pid)
            return losses, flat
        if kind == "stale":
            return losses, previous
        if kind == "otherbatch":
            return losses, self.honest_round(start, r0, e, len(self.ids) + slot)[1]
        return losses, forge(kind, self.attack.factor, flat, self.cfg.seed, e, slot)

    def recompute(self, u: int, slot: int, P: int, replica=None) -> bytes:
        """The digest an honest peer recomputes for `slot`'s round from round start u: from the
        slot's own state there (its transcript; what it committed to at its round before), or
        from `replica` (advanced to the round's end in place)."""
        replica = copy_replica(self.before[u][0][slot]) if replica is None else replica
        e = self.end_of(u)
        losses, flat = self.honest_round(replica, u, e, slot)
        return round_digest(e, slot, losses[-1], message_hashes(self.messages(flat, P, e, slot)),
                            adam_state_hash(replica.adam))

    def broken_chain(self, u: int, slot: int):
        """The slot's transcript (its state at round start u, as it holds it) against what it
        committed to at its round before: None, or the reason (evidence by itself)."""
        starts, _, chain, _ = self.before[u]
        return check_start_state(starts[slot].adam, chain[slot])

    def audit(self, u: int, auditor: int, audited: int, committed: bytes, P: int):
        """(the digest the auditor reports for the audited slot, or None with the reason its
        transcript breaks the chain)."""
        self.audits += 1
        a_pid, d_pid = self.ids[auditor], self.ids[audited]
        e = self.end_of(u)
        if self.attacking(a_pid, e):
            if self.attack.kind == "liar-auditor":
                return hashlib.sha256(b"a false accusation" + committed).digest(), None
            if self.attacking(d_pid, e):
                return committed, None                        # colluders pass each other
        reason = self.broken_chain(u, audited)
        if reason is not None:
            return None, reason
        return self.recompute(u, audited, P), None

    def step(self, emit) -> None:
        """Compute the round from r0 = the replicas' step: apply it, or remove a peer and roll back."""
        cfg, r0, P = self.cfg, self.group.replicas[0].step, len(self.ids)
        e = self.end_of(r0)
        leavers = [pid for pid in self.ids if self.attack is not None and self.attack.leave == r0 and pid in self.attack.peers]
        if leavers:
            return self.depart(leavers, r0, emit)
        committed = [copy_replica(r) for r in self.group.replicas]      # the states of self.committed
        for slot, pid in enumerate(self.ids):
            if pid in self.unchain:          # (the attack kind unchained: not the state it committed to)
                negate_m(self.group.replicas[slot])
        self.unchain = set()
        self.before[r0] = [copy_replica(r) for r in self.group.replicas]
        sent = [self.contribute(r0, e, slot) for slot in range(P)]
        messages = [self.messages(flat, P, e, slot) for slot, (_, flat) in enumerate(sent)]
        states = [adam_state_hash(r.adam) for r in self.group.replicas]
        digests = [round_digest(e, slot, losses[-1], message_hashes(m), states[slot])
                   for slot, ((losses, _), m) in enumerate(zip(sent, messages))]
        N = len(sent[0][1])
        for slot, ((losses, _), m) in enumerate(zip(sent, messages)):
            reason = cheap_check(losses[-1], m, N, P, self.codec)
            if reason is not None:
                return self.remove(slot, r0, f"delta from peer {self.ids[slot]} {reason} at step "
                                             f"{e + 1}: removed", emit)
        nonces = [reference_nonce(cfg.seed, e, slot) for slot in range(P)]
        self.before[r0] = (self.before[r0], digests, [self.committed[pid] for pid in self.ids], committed)
        self.before = {t: x for t, x in self.before.items() if t >= min(self.checked_from().values())}
        k = r0 // cfg.local_steps                         # the loads count rounds
        pairs = [] if self.withheld(e) else audit_pairs(cfg.seed, e, P, self.rate, beacon(digests, nonces),
                                                       audit_load(self.assigned, k, P))
        self.assigned[k] = [auditor for auditor, _ in pairs]
        passed = self.judge_pairs(pairs, r0, e, digests, messages, N, P, emit)
        if passed is not None:
            self.apply(r0, e, sent, messages, states, passed, emit)

    def withheld(self, e: int) -> bool:
        """The leavers withhold their commitments from the round holding attack.start on: that
        round's audits and its round before's are not drawn (a beacon needs every nonce,
        revealed with the next round's commitment)."""
        a = self.attack
        if a is None or a.leave is None or not any(p in self.ids for p in a.peers):
            return False
        return e >= a.start or (e + 1 < self.cfg.steps and self.end_of(e + 1) >= a.start)

    def recheck(self, slots_from: dict, end: int, where: str, emit) -> bool:
        """A barrier: every round from slots_from[slot] (a round start) to `end` is recomputed,
        earliest first, slots in order; the first that does not reproduce convicts its sender.
        Forward, as a page can (docs/VERIFICATION.md §13 "Pages"): from the state the slot
        committed to at slots_from[slot] (what its last pass's auditor recomputed, or a state all
        know), each round from the end state of the one before: the chain is the commitments,
        never the slot's own states. -> whether it removed a peer."""
        running = {}                                          # slot -> its Adam state, recomputed forward
        for u in sorted(t for t in self.before if t < end):
            digests = self.before[u][1]
            for slot, pid in enumerate(self.ids):
                if slot not in slots_from or u < slots_from[slot]:
                    continue
                replica = copy_replica(self.before[u][3][slot])      # W = A there: the group's weights
                replica.adam = running.get(slot, replica.adam)
                if self.recompute(u, slot, len(self.ids), replica) != digests[slot]:
                    why = (f"round of peer {pid} did not reproduce at step {self.end_of(u) + 1}: removed "
                           f"(checked {where})")
                    self.remove(slot, u, why, emit)
                    return True
                running[slot] = replica.adam
        return False

    def depart(self, leavers: list, r0: int, emit) -> None:
        """A departure (at a round start) is a barrier; then the leavers go and each survivor
        keeps its own state under its new slot."""
        excluded = set(self.excluded_from)
        check = {self.ids.index(pid): max(self.changed, audit_trusted(self.passes[pid], excluded)) for pid in leavers}
        if self.recheck(check, r0, "when it left", emit):
            return
        for pid in leavers:
            emit.left(r0, pid)
            del self.passes[pid]
        keep = [slot for slot, pid in enumerate(self.ids) if pid not in leavers]
        self.regroup([self.ids[slot] for slot in keep], [self.group.replicas[slot] for slot in keep])
        self.changed = r0
        self.before = {}

    def finish(self, end: int, emit) -> bool:
        if self.rate == 0:
            return False
        start = self.checked_from()
        return self.recheck({slot: start[pid] for slot, pid in enumerate(self.ids)}, end, "at the run's end", emit)

    def regroup(self, ids: list, replicas: list) -> None:
        """The group from now on: these peers, each with its own state (copied), in this order."""
        self.ids = list(ids)
        g = self.group
        self.group = Group(self.cfg, len(ids), g.batches, g.mm, replicas=[copy_replica(r) for r in replicas])
        self.committed = {pid: adam_state_hash(r.adam) for pid, r in zip(ids, replicas)}
        self.assigned = {}
        self.unchain = set()                                  # (restored states are the committed ones)

    def apply(self, r0: int, e: int, sent, messages, states, passed, emit) -> None:
        """D from the checked messages (the codec's slot-ordered mean, as AuditedRun.apply does
        with G), the outer step on every replica; the round's lines."""
        P, N = len(self.ids), len(sent[0][1])
        flat = self.reduce(e, messages, N)
        D = unflatten(flat, self.shapes)
        before = weight_hash(self.group.replicas[0].anchor)
        hashes = [t.outer(D)[1] for t in self.group.trainers]
        for s in range(r0, e + 1):
            self.schedule[s] = tuple(self.ids)
            loss = reduce_losses({slot: losses[s - r0] for slot, (losses, _) in enumerate(sent)})
            emit.step(s + 1, loss, hashes if s == e else [before] * P)
        self.committed = dict(zip(self.ids, states))
        for auditor, audited in passed:
            self.passes[self.ids[audited]][self.ids[auditor]] = e + 1
        if passed:
            self.snapshots[e + 1] = {pid: copy_replica(r) for pid, r in zip(self.ids, self.group.replicas)}
        self.keep_snapshots()

    def reduce(self, e: int, messages, N: int) -> np.ndarray:
        P, flat = len(self.ids), np.zeros(N)
        bounds = message_bounds(N, P, self.codec)
        for k, (lo, hi) in enumerate(bounds):
            if len(bounds) > 1:          # reduce-scatter: each shard as its owner sent it
                flat[lo:hi] = self.codec.decode(self.reduced_message(e, k, messages, N), hi - lo)
                continue
            decoded = [self.codec.decode(ms[k], hi - lo) for ms in messages]
            flat[lo:hi] = self.codec.reduce(decoded, seed=self.cfg.seed, step=e, offset=lo)
        return flat

    def remove(self, slot: int, r0: int, why: str, emit) -> None:
        """Convict the peer in `slot` (caught in the round from r0): every survivor goes back to
        its own state at the round start rollback_step names, in its order there."""
        pid = self.ids[slot]
        back = rollback_step(pid, self.passes, self.excluded_from)
        emit.removed(self.end_of(r0) + 1, pid, why, back)
        self.excluded_from[pid] = back
        for c in self.excluded_from:
            self.excluded_from[c] = min(self.excluded_from[c], back)
        snap = self.snapshots[back]
        ids = [p for p in snap if p in self.ids and p != pid]     # a leaver stays gone
        self.regroup(ids, [snap[p] for p in ids])
        self.changed = back
        self.before = {t: x for t, x in self.before.items() if t < back}
        for by in self.passes.values():               # passes in the rounds undone are void
            for a in [a for a, t in by.items() if t > back]:
                del by[a]
        self.keep_snapshots()
        self.recomputed += r0 - back
        self.schedule = {t: p for t, p in self.schedule.items() if t < back}

    def roster(self) -> str:
        """The kept timeline as a --roster schedule naming the slots that left ("0:3,8:2:1")."""
        out, last = [], None
        for t in sorted(self.schedule):
            ids = self.schedule[t]
            if last is None:
                out.append(f"{t}:{len(ids)}")
            elif ids != last:
                left = ".".join(str(i) for i, p in enumerate(last) if p not in ids)
                out.append(f"{t}:{len(ids)}:{left}")
            last = ids
        return ",".join(out)
