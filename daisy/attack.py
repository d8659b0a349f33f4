"""The audited run and its attacker: python -m daisy.train --peers P --attack SPEC [--audit-rate R]
(docs/VERIFICATION.md §13). frontend_js/attack.js is the twin; the two print the same lines.

    --attack "slot=1,from=39,kind=scale:-1000"     peer 1 sends -1000 x its gradient from step index 39
    --attack "slot=1+3,from=39,kind=scale:-1000"   peers 1 and 3 collude (each passes the other's audit)
    --attack "slot=1,from=150,kind=scale:-1000,leave=151"   peer 1 forges at 150, withholds its
                                                    commitments from 150 on and leaves before 151
    --attack "slot=1,from=150,kind=scale:-1000" --stop-after 151   peer 1 forges at 150, then a Stop:
                                                    the end's barrier recomputes it and removes it
    --audit-rate 0.5                                each slot's contribution audited with chance 0.5 per
                                                    step (default 0.1; 0 = none; 1 = every slot, every step)

The attacking peers are named by their slot at the run's start; a peer keeps its id when slots
renumber after a removal. Kinds (each forged message is committed to honestly, so only an audit
or a cheap check can catch it):
    scale:F        F x its gradient                 nan           every value NaN
    noise          uniform noise of the gradient's max-norm, nothing of the gradient
    const          one fixed +-1 direction (the same every step) x the gradient's max-norm
    stale          its gradient of the step it computed before (earlier weights)
    otherbatch     the gradient of a batch no slot trains on (seed, step, P + slot)
    mismatch       its gradient with the first value one ulp up: matches its commitment, not its batch
    liar-auditor   honest gradients; as an auditor it accuses whomever it audits
    liar-owner     honest gradients; as a reduce-scatter shard's owner (P >= 4) its reduced shard is
                   forged (forge_reduced: every value negated), the same to every peer, so the
                   replicas agree on poisoned weights; an audit of its slot also checks its reduce
                   (check_reduced_shard) and catches it. In an all-gather run it has no shard: honest.
    moments, unchained   (--local-steps H > 1 only) its Adam state forged at each round's end: the
                   runner of local steps, daisy/attack_rounds.py, audits rounds

A step: every slot's messages and commitment; cheap checks; the seeded audits, each recomputed by
its auditor; a failed audit judged by recomputation removes the audited peer or its accuser; a
removal rolls the group back to the state after that peer's last passed audit and recomputes
from there without it (steps recomputed print again; the last line printed for a step is the
run's). A departure (leave=) and the run's end (its last step, --stop-after) are barriers: every
contribution not covered by a passed audit is recomputed first (depart, finish). At the end, stderr names the kept timeline's roster: `python -m daisy.train --roster R`
prints the same last line for every step.
"""
import hashlib
import json
import re
from dataclasses import dataclass

import numpy as np

from . import prng
from .audit import (MAX_AUDIT_RATE, Evidence, trusted_step as audit_trusted, audit_load, audit_pairs, beacon, cheap_check, check_reduced_shard, contribution_digest,
                    judge, message_bounds, message_hashes, reference_nonce, rollback_step, slot_digest,
                    slot_messages)
from .collective import flatten_grads, unflatten
from .exchange_codec import BLOCK, SCALE_BYTES, CodecError, codec_for
from .model import param_shapes
from .reduce import reduce_losses
from .train import Group, Trainer, copy_replica

KINDS = ("scale:F", "nan", "noise", "const", "stale", "otherbatch", "mismatch", "liar-auditor", "liar-owner",
         "moments", "unchained")      # the last two: runs of local steps only (daisy/attack_rounds.py)


# -- the attack setting -----------------------------------------------------------------------
@dataclass(frozen=True)
class Attack:
    peers: tuple          # attacking peer ids (their slots at the run's start)
    start: int            # the first 0-based step index they attack
    kind: str             # a name of KINDS ("scale" for scale:F)
    factor: float         # F of scale:F, else 1.0
    leave: int | None = None  # the attackers leave before this step index, withholding their
                              # commitments from `start` on (a departure is a barrier)


def parse_attack(text: str) -> Attack:
    """"slot=1,from=39,kind=scale:-1000" -> Attack; ValueError naming the bad part (the messages
    are mirrored by frontend_js/attack.js)."""
    got = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        if not eq or name not in ("slot", "from", "kind", "leave"):
            raise ValueError(f"--attack part '{part}' is not slot=S[+S...], from=STEP, kind=KIND or leave=STEP")
        if name in got:
            raise ValueError(f"--attack names {name} twice")
        got[name] = value
    if "slot" not in got or "kind" not in got:
        raise ValueError("--attack needs slot=S and kind=KIND (from=STEP is 0 unless given)")
    if re.fullmatch(r"[0-9]{1,2}(\+[0-9]{1,2})*", got["slot"]) is None:
        raise ValueError(f"--attack slot '{got['slot']}' is not a slot or slots joined by + (e.g. 1 or 1+3)")
    peers = tuple(int(s) for s in got["slot"].split("+"))
    if len(set(peers)) != len(peers):
        raise ValueError(f"--attack slot '{got['slot']}' names a slot twice")
    start = got.get("from", "0")
    if re.fullmatch(r"[0-9]{1,9}", start) is None:
        raise ValueError(f"--attack from '{start}' is not a 0-based step index")
    kind, factor = got["kind"], 1.0
    m = re.fullmatch(r"scale:(-?[0-9]{1,9}(\.[0-9]{1,9})?)", kind)
    if m is not None:
        kind, factor = "scale", float(m.group(1))
    elif kind not in KINDS or kind == "scale:F":
        raise ValueError(f"--attack kind '{kind}' is not one of {', '.join(KINDS)}")
    leave = got.get("leave")
    if leave is not None and (re.fullmatch(r"[0-9]{1,9}", leave) is None or int(leave) <= int(start)):
        raise ValueError(f"--attack leave '{leave}' is not a 0-based step index after from={start}")
    return Attack(peers, int(start), kind, factor, None if leave is None else int(leave))


def parse_audit_rate(text: str) -> float:
    """"0.1" -> 0.1: the chance that a slot's contribution to a step is audited, 0..1 (the
    messages are mirrored by frontend_js/attack.js)."""
    if re.fullmatch(r"[0-9]{1,2}(\.[0-9]{1,9})?", text) is None or not 0.0 <= float(text) <= MAX_AUDIT_RATE:
        raise ValueError(f"--audit-rate must be a chance from 0 to 1 (each slot's contribution audited "
                         f"with it at each step), got {text}")
    return float(text)


def check_attack(attack: Attack, P: int, steps: int, local_steps: int = 1) -> None:
    """The attack fits a run of P peers and `steps` steps; at least one peer stays honest. With
    local steps H > 1 a leaver leaves at a round's start; `moments` and `unchained` need local
    steps."""
    for s in attack.peers:
        if s >= P:
            raise ValueError(f"--attack slot {s} is outside the group of {P} peers")
    if len(attack.peers) >= P:
        raise ValueError(f"--attack names every one of the {P} peers; at least one must be honest")
    if attack.start >= steps:
        raise ValueError(f"--attack from {attack.start} is past the run's last step index {steps - 1}")
    if attack.leave is not None and attack.leave >= steps:
        raise ValueError(f"--attack leave {attack.leave} is past the run's last step index {steps - 1}")
    if attack.kind in ("moments", "unchained") and local_steps == 1:
        raise ValueError(f"--attack kind '{attack.kind}' forges a round's Adam state: only with --local-steps above 1")
    if attack.leave is not None and local_steps > 1 and attack.leave % local_steps != 0:
        raise ValueError(f"--attack leave {attack.leave}: with --local-steps {local_steps} a peer leaves at a "
                         f"round's start (a multiple of {local_steps})")


# -- forged gradients (pure: the attacker's honest (flat) and the step's keys in, bytes' values out)
def max_norm(flat: np.ndarray) -> float:
    return float(np.max(np.abs(flat)))


def forge(kind: str, factor: float, flat: np.ndarray, seed: int, step: int, slot: int) -> np.ndarray:
    """The forged flat gradient of the kinds that need only the honest one (scale, nan, noise,
    const, mismatch)."""
    n = np.arange(len(flat), dtype=np.uint32)
    if kind == "scale":
        return flat * factor
    if kind == "nan":
        return np.full(len(flat), np.nan)
    if kind == "noise":
        u = prng.uniform(prng.key(prng.PURPOSE_ATTACK, seed, step, slot), n)
        return (2.0 * u - 1.0) * max_norm(flat)
    if kind == "const":
        sign = np.where(prng.draw(prng.key(prng.PURPOSE_ATTACK, seed), n) & np.uint32(1), 1.0, -1.0)
        return sign * max_norm(flat)
    if kind == "mismatch":
        out = flat.copy()
        out[0] = np.nextafter(out[0], np.inf)
        return out
    raise ValueError(f"forge: {kind} needs more than the honest gradient")


def forge_reduced(message: bytes, codec) -> bytes:
    """A lying owner's REDUCED message: the honest one with every value negated, still well formed
    (f64: each float64's sign bit flipped; int8: each code negated, the block scales kept), so it
    decodes to exactly minus the honest shard."""
    if codec.name == "f64":
        out = np.frombuffer(message, dtype=np.uint8).copy()
        out[7::8] ^= 0x80
        return out.tobytes()
    out = bytearray(message)
    for at in range(0, len(out), SCALE_BYTES + BLOCK):
        codes = np.frombuffer(bytes(out[at + SCALE_BYTES:at + SCALE_BYTES + BLOCK]), dtype=np.int8)
        out[at + SCALE_BYTES:at + SCALE_BYTES + len(codes)] = (-codes).tobytes()   # codes are -127..127
    return bytes(out)


# -- the audited run --------------------------------------------------------------------------
class AuditedRun:
    """A Group (daisy/train.py) trained with commitments, audits and removal (module docstring);
    a removal replaces the Group by one of the survivors, restored to the rollback's state."""

    def __init__(self, cfg, group, attack: Attack | None, rate: float):
        self.cfg, self.group, self.attack, self.rate = cfg, group, attack, rate
        self.shapes = param_shapes(cfg)
        self.codec = codec_for(cfg.exchange)
        self.ids = list(range(len(group.replicas)))           # peer id of each slot
        self.passes = {p: {None: 0} for p in self.ids}        # peer -> {auditor: step after its pass}
        self.excluded_from = {}                               # convicted peer -> step it is left out from
        self.snapshots = {0: copy_replica(group.replicas[0])}       # step -> state after that step
        self.schedule = {}                                    # step index -> P (kept timeline)
        self.previous = {}                                    # attacker id -> its last honest flat
        self.assigned = {}                                    # step -> its audits' auditor slots (since the
                                                              # roster's last change: audit_load)
        self.changed = 0                                      # the step of the roster's last change
        self.before = {}                                      # step -> (state after it, its digests): what a
                                                              # departure's or the end's barrier checks
        self.audits = 0
        self.recomputed = 0

    def attacking(self, pid: int, s: int) -> bool:
        a = self.attack
        return a is not None and pid in a.peers and s >= a.start

    def honest(self, trainer, s: int, slot: int):
        """(loss, flat gradient) of the trainer's replica on the batch (seed, s, slot)."""
        loss, grads = trainer.local_step(s, slot)
        return loss, flatten_grads(grads, self.shapes)

    def contribute(self, s: int, slot: int):
        """What the peer in `slot` sends at step index s: (loss, flat)."""
        pid, trainer = self.ids[slot], self.group.trainers[slot]
        loss, flat = self.honest(trainer, s, slot)
        if not self.attacking(pid, s) or self.attack.kind in ("liar-auditor", "liar-owner"):
            return loss, flat
        kind, previous = self.attack.kind, self.previous.get(pid, flat)
        self.previous[pid] = flat
        if kind == "stale":
            return loss, previous
        if kind == "otherbatch":
            return loss, self.honest(trainer, s, len(self.ids) + slot)[1]
        return loss, forge(kind, self.attack.factor, flat, self.cfg.seed, s, slot)

    def recompute(self, s: int, slot: int, P: int) -> bytes:
        """The digest an honest peer recomputes for `slot` at s (from its own pre-step replica;
        every honest replica is the same, the first honest one is used)."""
        loss, flat = self.honest(self.group.trainers[self.honest_slot(s)], s, slot)
        return contribution_digest(flat, loss, P, self.cfg.seed, s, slot, self.codec)

    def audit(self, s: int, auditor: int, audited: int, committed: bytes, P: int):
        """(the digest the auditor reports for the audited slot, None: a gradient's audit has no
        transcript that could break on its own; daisy/attack_rounds.py's rounds have one)."""
        self.audits += 1
        a_pid, d_pid = self.ids[auditor], self.ids[audited]
        if self.attacking(a_pid, s):
            if self.attack.kind == "liar-auditor":
                return hashlib.sha256(b"a false accusation" + committed).digest(), None
            if self.attacking(d_pid, s):
                return committed, None                        # colluders pass each other
        return self.recompute(s, audited, P), None

    unit = ("gradient from peer", "gradient")   # a slot's audited contribution, in the run's words (attack.js unit)

    def judge_pairs(self, pairs, at: int, step: int, digests, messages, N: int, P: int, emit):
        """The drawn pairs' audits of the contributions made from `at` (the step; a round's start)
        and sent at 0-based step index `step`: -> the pairs that passed, or None once a peer was
        removed (the auditor for a false accusation, else the audited: a transcript that breaks,
        a digest that does not reproduce, a reduced shard that does not)."""
        cfg, (of_peer, unit) = self.cfg, self.unit
        passed = []
        for auditor, audited in pairs:
            reported, broken = self.audit(at, auditor, audited, digests[audited], P)
            if broken is not None:
                self.remove(audited, at, f"{of_peer} {self.ids[audited]} did not reproduce at step {step + 1}: "
                                         f"removed ({broken}; audited by peer {self.ids[auditor]})", emit)
                return None
            if reported == digests[audited]:
                reason = self.check_owner(step, audited, messages, N)
                if reason is not None:
                    why = (f"reduced shard from peer {self.ids[audited]} did not reproduce at step {step + 1}: "
                           f"removed ({reason}; audited by peer {self.ids[auditor]})")
                    self.remove(audited, at, why, emit)
                    return None
                passed.append((auditor, audited))
                continue
            ev = Evidence(run=str(cfg.seed), step=step, slot=audited, accuser=auditor,
                          committed=digests[audited].hex(), recomputed=reported.hex())
            if judge(ev, self.recompute(at, audited, P).hex()) == "audited":
                why = (f"{of_peer} {self.ids[audited]} did not reproduce at step {step + 1}: "
                       f"removed (committed {ev.committed[:16]}, recomputed {ev.recomputed[:16]} "
                       f"by peer {self.ids[auditor]})")
                self.remove(audited, at, why, emit)
                return None
            why = (f"peer {self.ids[auditor]} accused peer {self.ids[audited]} at step {step + 1}, "
                   f"whose {unit} reproduced: peer {self.ids[auditor]} removed")
            self.remove(auditor, at, why, emit)
            return None
        return passed

    def step(self, emit) -> None:
        """Compute step index s = the replicas' step: apply it, or remove a peer and roll back."""
        cfg, s, P = self.cfg, self.group.replicas[0].step, len(self.ids)
        leavers = [pid for pid in self.ids if self.attack is not None and self.attack.leave == s and pid in self.attack.peers]
        if leavers:
            return self.depart(leavers, s, emit)
        self.before[s] = copy_replica(self.group.replicas[self.honest_slot(s)])
        sent = [self.contribute(s, slot) for slot in range(P)]
        messages = [self.messages(flat, P, s, slot) for slot, (_, flat) in enumerate(sent)]
        digests = [slot_digest(s, slot, loss, message_hashes(m))
                   for slot, ((loss, _), m) in enumerate(zip(sent, messages))]
        N = len(sent[0][1])
        for slot, ((loss, _), m) in enumerate(zip(sent, messages)):
            reason = cheap_check(loss, m, N, P, self.codec)
            if reason is not None:
                return self.remove(slot, s, f"gradient from peer {self.ids[slot]} {reason} at step "
                                            f"{s + 1}: removed", emit)
        nonces = [reference_nonce(cfg.seed, s, slot) for slot in range(P)]
        self.before[s] = (self.before[s], digests)
        self.before = {t: x for t, x in self.before.items() if t >= min(self.checked_from().values())}
        pairs = [] if self.withheld(s) else audit_pairs(cfg.seed, s, P, self.rate, beacon(digests, nonces),
                                                       audit_load(self.assigned, s, P))
        self.assigned[s] = [auditor for auditor, _ in pairs]
        passed = self.judge_pairs(pairs, s, s, digests, messages, N, P, emit)
        if passed is not None:
            self.apply(s, sent, messages, passed, emit)

    def withheld(self, s: int) -> bool:
        """The leavers withhold their commitments (AUDIT) from attack.start on: the audits of steps
        from start - 1 on are not drawn (the beacon of a step needs every nonce, revealed with the
        next step's commitment)."""
        a = self.attack
        return a is not None and a.leave is not None and s >= a.start - 1 and any(p in self.ids for p in a.peers)

    def depart(self, leavers: list, s: int, emit) -> None:
        """A departure is a barrier: before the roster drops a leaver, every contribution of its
        since its last passed audit (or the roster's last change) is recomputed, earliest first;
        one that does not reproduce convicts it (an audit's removal and rollback). Else it leaves
        and the run goes on without it from step s."""
        for pid in leavers:
            slot = self.ids.index(pid)
            start = max(self.changed, audit_trusted(self.passes[pid], set(self.excluded_from)))
            for u in range(start, s):
                state, digests = self.before[u]
                loss, flat = self.honest(Trainer(self.cfg, copy_replica(state), self.group.batches, self.group.mm), u, slot)
                if contribution_digest(flat, loss, len(self.ids), self.cfg.seed, u, slot, self.codec) != digests[slot]:
                    why = (f"gradient from peer {pid} did not reproduce at step {u + 1}: removed "
                           f"(checked when it left)")
                    return self.remove(slot, u, why, emit)
        state = copy_replica(self.group.replicas[self.honest_slot(s)])
        for pid in leavers:
            emit.left(s, pid)
            del self.ids[self.ids.index(pid)]
            del self.passes[pid]
        g = self.group
        self.group = Group(self.cfg, len(self.ids), g.batches, g.mm, replicas=[copy_replica(state) for _ in self.ids])
        self.assigned, self.changed = {}, s
        self.before = {}

    def checked_from(self) -> dict:
        """peer -> the first step of its contributions not covered by a passed audit: after its
        latest pass by an auditor never convicted, or the roster's last change."""
        excluded = set(self.excluded_from)
        return {pid: max(self.changed, audit_trusted(self.passes[pid], excluded)) for pid in self.ids}

    def finish(self, end: int, emit) -> bool:
        """A run's end (its last step, or a Stop: --stop-after) is a barrier: every contribution
        since its sender's last passed audit (or the roster's last change) is recomputed, earliest
        step first, slots in order at a step; the first that does not reproduce convicts its
        sender (an audit's removal and rollback; the caller computes the steps from there again).
        Audits off (rate 0): none. -> whether it removed a peer."""
        if self.rate == 0:
            return False
        start = self.checked_from()
        for u in range(min(start.values()), end):
            state, digests = self.before[u]
            for slot, pid in enumerate(self.ids):
                if u < start[pid]:
                    continue
                loss, flat = self.honest(Trainer(self.cfg, copy_replica(state), self.group.batches, self.group.mm), u, slot)
                if contribution_digest(flat, loss, len(self.ids), self.cfg.seed, u, slot, self.codec) != digests[slot]:
                    why = (f"gradient from peer {pid} did not reproduce at step {u + 1}: removed "
                           f"(checked at the run's end)")
                    self.remove(slot, u, why, emit)
                    return True
        return False

    def reduced_message(self, s: int, k: int, messages, N: int) -> bytes:
        """The REDUCED message the owner of shard k sends at s (reduce-scatter): the codec's
        reduce of the slots' messages of shard k, forged by a lying owner."""
        lo, hi = message_bounds(N, len(self.ids), self.codec)[k]
        decoded = [self.codec.decode(ms[k], hi - lo) for ms in messages]
        message = self.codec.reduce_message(decoded, seed=self.cfg.seed, step=s, offset=lo)
        pid = self.ids[k]
        if self.attacking(pid, s) and self.attack.kind == "liar-owner":
            return forge_reduced(message, self.codec)
        return message

    def check_owner(self, s: int, k: int, messages, N: int):
        """An audit of slot k also audits its reduce, when it owns a shard (reduce-scatter): its
        transcript (the slots' messages of shard k, each as committed) against the REDUCED it
        sent. None when it reproduces (or in an all-gather run), else the reason."""
        if len(messages[0]) == 1:
            return None
        lo, hi = message_bounds(N, len(self.ids), self.codec)[k]
        transcript = [ms[k] for ms in messages]
        committed = [hashlib.sha256(m).digest() for m in transcript]
        reduced = self.codec.decode(self.reduced_message(s, k, messages, N), hi - lo)
        return check_reduced_shard(transcript, committed, reduced, hi - lo, self.codec, self.cfg.seed, s, lo)

    def messages(self, flat: np.ndarray, P: int, s: int, slot: int) -> list:
        """The slot's messages; a forged gradient the codec refuses to encode (int8: a value
        that is not finite or too large) is sent as its raw float64 bytes, as a forger would."""
        try:
            return slot_messages(flat, P, self.cfg.seed, s, slot, self.codec)
        except CodecError:
            return [flat[lo:hi].astype("<f8").tobytes() for lo, hi in message_bounds(len(flat), P, self.codec)]

    def apply(self, s: int, sent, messages, passed, emit) -> None:
        """G from the checked messages (daisy.collective.codec_reduce's rule), Adam on every replica."""
        P, N, seed = len(self.ids), len(sent[0][1]), self.cfg.seed
        flat = np.zeros(N)
        bounds = message_bounds(N, P, self.codec)
        for k, (lo, hi) in enumerate(bounds):
            if len(bounds) > 1:          # reduce-scatter: each shard as its owner sent it
                flat[lo:hi] = self.codec.decode(self.reduced_message(s, k, messages, N), hi - lo)
                continue
            decoded = [self.codec.decode(ms[k], hi - lo) for ms in messages]
            flat[lo:hi] = self.codec.reduce(decoded, seed=seed, step=s, offset=lo)
        G = unflatten(flat, self.shapes)
        hashes = [trainer.apply(G)[1] for trainer in self.group.trainers]
        loss = reduce_losses({slot: l for slot, (l, _) in enumerate(sent)})
        self.schedule[s] = P
        for auditor, audited in passed:
            self.passes[self.ids[audited]][self.ids[auditor]] = s + 1
        if passed:
            self.snapshots[s + 1] = copy_replica(self.group.replicas[self.honest_slot(s)])
        self.keep_snapshots()
        emit.step(s + 1, loss, hashes)

    def honest_slot(self, s: int) -> int:
        return next(slot for slot, q in enumerate(self.ids) if not self.attacking(q, s))

    def keep_snapshots(self) -> None:
        """Keep the states a rollback may need: every step some pass (or join) points at."""
        needed = {t for by in self.passes.values() for t in by.values()}
        self.snapshots = {t: st for t, st in self.snapshots.items() if t in needed}

    def remove(self, slot: int, s: int, why: str, emit) -> None:
        """Convict the peer in `slot`: every replica goes back to the state rollback_step names,
        the later steps are recomputed without it (and without every peer convicted before)."""
        pid = self.ids[slot]
        back = rollback_step(pid, self.passes, self.excluded_from)
        emit.removed(s + 1, pid, why, back)
        self.excluded_from[pid] = back
        for c in self.excluded_from:
            self.excluded_from[c] = min(self.excluded_from[c], back)
        del self.ids[slot]
        self.assigned, self.changed = {}, back        # slots renumber: loads count from `back` on
        self.before = {t: x for t, x in self.before.items() if t < back}
        for by in self.passes.values():               # passes in the steps undone are void
            for a in [a for a, t in by.items() if t > back]:
                del by[a]
        state = self.snapshots[back]
        g = self.group
        self.group = Group(self.cfg, len(self.ids), g.batches, g.mm, replicas=[copy_replica(state) for _ in self.ids])
        self.keep_snapshots()
        self.recomputed += s - back
        self.schedule = {t: p for t, p in self.schedule.items() if t < back}

    def roster(self) -> str:
        """The kept timeline's P per step as a --roster schedule ("0:3,38:2")."""
        out, last = [], None
        for t in sorted(self.schedule):
            if self.schedule[t] != last:
                out.append(f"{t}:{self.schedule[t]}")
                last = self.schedule[t]
        return ",".join(out)


# -- the CLI's output -------------------------------------------------------------------------
class Printer:
    """The lines of an audited run: the usual step lines, and one line per removal."""

    def __init__(self, as_json: bool, out):
        self.as_json, self.out = as_json, out
        self.agree = True             # the last step's replicas all had one hash

    def step(self, step: int, loss: float, hashes: list) -> None:
        if self.as_json:
            line = json.dumps({"step": step, "loss": loss, "hashes": hashes})
        else:
            agree = "agree" if len(set(hashes)) == 1 else "DISAGREE"
            line = f"step {step:5d}  loss {loss:.4f}  hash {hashes[0][:16]}  ({len(hashes)} peers {agree})"
        print(line, file=self.out, flush=True)
        self.agree = len(set(hashes)) == 1

    def left(self, step: int, peer: int) -> None:
        """A leaver whose contributions since its last pass all reproduced: gone from `step` on."""
        if self.as_json:
            line = json.dumps({"event": "left", "step": step, "peer": peer})
        else:
            line = f"audit: peer {peer} left before step {step + 1}; its steps since its last passed audit reproduced"
        print(line, file=self.out, flush=True)

    def removed(self, step: int, peer: int, why: str, back: int) -> None:
        if self.as_json:
            line = json.dumps({"event": "removed", "step": step, "peer": peer, "why": why, "rollback_to": back})
        else:
            line = f"audit: {why}; rolled back to step {back}"
        print(line, file=self.out, flush=True)


def run_audited(args, cfg, group, out, err, runner=AuditedRun) -> int:
    """python -m daisy.train --attack/--audit-rate: train to the run's end (or --stop-after).
    runner: AuditedRun, or with local steps daisy/attack_rounds.py's RoundAuditedRun (cli.py picks)."""
    run = runner(cfg, group, args.attack_spec, args.audit_rate)
    emit = Printer(args.json, out)
    end = cfg.steps if args.stop_after is None else args.stop_after
    while True:
        while run.group.replicas[0].step < end:
            run.step(emit)
            if not emit.agree:
                print("error: replicas diverged; stopping (never fork)", file=err)
                return 3
        if not run.finish(end, emit):          # the end's barrier: a removal computes the steps again
            break
    print(f"audit: {run.audits} audits, {run.recomputed} steps recomputed; the run's roster: "
          f"{run.roster()}", file=err)
    return 0
