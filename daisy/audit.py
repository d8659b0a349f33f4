"""Audited gradients: the pure rules (docs/VERIFICATION.md §13). frontend_js/audit.js is the twin.

A slot's contribution to step s is a pure function of (weights, batch key, step, slot, run
seed), so any honest peer can recompute it and demand byte equality:

    messages    the exact bytes the slot sends: the exchange codec's messages of its gradient
                (daisy/exchange_codec.py), one in the all-gather topology, one per shard in
                reduce-scatter
    commitment  SHA-256 of each message, and the slot's digest over its step, slot, loss and
                those hashes (sent with the gradient)
    cheap check a message of the wrong size, a non-finite loss or value: evidence by itself
    audit       the seeded choice of (auditor, audited) pairs from the run seed, the step and a
                beacon over every digest and every peer's revealed nonce, so no peer knows the
                choice before its commitment is sent; the auditor recomputes and compares
    evidence    (run, step, slot, accuser, committed, recomputed): every honest peer recomputes;
                the audited slot is removed if its digest does not reproduce, else the accuser
"""
import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from . import prng
from .collective import ALL_GATHER, topology_for
from .exchange_codec import CodecError

COMMIT_TAG = b"daisy-commit-v1"
BEACON_TAG = b"daisy-beacon-v1"
NONCE_TAG = b"daisy-audit-nonce-v1"
STATE_TAG = b"daisy-adam-state-v1"
DEFAULT_AUDIT_RATE = 0.1        # the chance that a slot's contribution to a step is audited (a run setting)
DEFAULT_ROUND_AUDIT_RATE = 0.1  # local steps: the chance that a slot's round is audited (docs/VERIFICATION.md §13)


def default_audit_rate(local_steps: int) -> float:
    """The run's audit rate when none is given: per step, or per round of local steps."""
    return DEFAULT_ROUND_AUDIT_RATE if local_steps > 1 else DEFAULT_AUDIT_RATE


MAX_AUDIT_RATE = 1.0            # every slot audited at every step
AUDIT_WINDOW = 16               # W: steps an audit may take (its verdict comes by step + W), and the
                                # window over which auditors' loads are balanced (docs/VERIFICATION.md §13)


# -- the messages a slot contributes (the exchange codec's, daisy/exchange_codec.py) -------------
def message_bounds(N: int, P: int, codec) -> list:
    """[(lo, hi)] of the flat gradient each message of a slot carries: the whole gradient in
    the all-gather topology, shard k of codec.shard_bounds(N, P) in reduce-scatter."""
    if topology_for(P) == ALL_GATHER:
        return [(0, N)]
    b = codec.shard_bounds(N, P)
    return [(b[k], b[k + 1]) for k in range(P)]


def slot_messages(flat: np.ndarray, P: int, seed: int, step: int, slot: int, codec) -> list:
    """The messages slot `slot` sends at `step` in a group of P: [bytes] in message order, each
    the codec's encode of its slice (offset = the slice's first index)."""
    return [codec.encode(flat[lo:hi], seed=seed, step=step, slot=slot, offset=lo)
            for lo, hi in message_bounds(len(flat), P, codec)]


# -- commitments --------------------------------------------------------------------------------
def message_hashes(messages: list) -> list:
    """SHA-256 of each message (32 bytes each): a receiver checks the bytes it got against it."""
    return [hashlib.sha256(m).digest() for m in messages]


def slot_digest(step: int, slot: int, loss: float, hashes: list) -> bytes:
    """The slot's commitment for the step: SHA-256(tag, step u32le, slot u32le, loss f64le,
    each message hash in message order). Binding step and slot makes an old commitment useless."""
    h = hashlib.sha256(COMMIT_TAG)
    h.update(struct.pack("<IId", step, slot, loss))
    for x in hashes:
        h.update(x)
    return h.digest()


def contribution_digest(flat: np.ndarray, loss: float, P: int, seed: int, step: int, slot: int,
                        codec) -> bytes:
    """What an auditor recomputes: the digest of (loss, flat) as slot `slot` must send it."""
    return slot_digest(step, slot, loss, message_hashes(slot_messages(flat, P, seed, step, slot, codec)))


# -- rounds of local steps (docs/VERIFICATION.md §13 "Rounds of local steps") ---------------------
def round_end(s: int, H: int, steps: int) -> int:
    """The 0-based step that ends the round holding step s: the next multiple of H, less one, or
    the run's last step (daisy.train.is_exchange_step)."""
    return min((s // H + 1) * H, steps) - 1


def adam_state_hash(adam) -> bytes:
    """What a slot commits to of its own Adam state at a round's end (the state it starts the
    next round from): SHA-256(tag, t u32le, every m tensor's float64le bytes in param order,
    then every v tensor's). Its weights need no hash: at a round's start they are the anchor."""
    h = hashlib.sha256(STATE_TAG)
    h.update(struct.pack("<I", adam["t"]))
    for part in ("m", "v"):
        for w in adam[part].values():
            h.update(np.ascontiguousarray(w, dtype="<f8").tobytes())
    return h.digest()


def state_transcript_bytes(N: int) -> int:
    """The bytes of a slot's Adam state as an auditor receives it: t (u32) and m, v (N float64
    each). An auditor refuses a transcript of any other size before reading it."""
    return 4 + 2 * 8 * N


def round_digest(step: int, slot: int, loss: float, hashes: list, state_hash: bytes) -> bytes:
    """A slot's commitment for a round ending at `step`: slot_digest over its messages' hashes
    and, last, the hash of its Adam state at the round's end (adam_state_hash)."""
    return slot_digest(step, slot, loss, [*hashes, state_hash])


def check_start_state(adam, committed: bytes):
    """The audited slot's Adam state at the round's start (its transcript) against what it
    committed at its round before (the run's start or a rollback: the state all peers know).
    None if it hashes to it, else the reason (evidence by itself: the transcript and the
    commitment)."""
    if adam_state_hash(adam) != committed:
        return "its Adam state at the round's start is not the one it committed to"
    return None


# -- cheap checks: evidence by itself -----------------------------------------------------------
def cheap_check(loss: float, messages: list, N: int, P: int, codec):
    """None if the slot's messages have the codec's sizes and decode, and every value and the
    loss are finite; else the reason (the words of the panel)."""
    bounds = message_bounds(N, P, codec)
    if len(messages) != len(bounds):
        return f"has {len(messages)} messages, the group needs {len(bounds)}"
    for m, (lo, hi) in zip(messages, bounds):
        if len(m) != codec.message_bytes(hi - lo):
            return f"is {len(m)} bytes where {codec.message_bytes(hi - lo)} are due"
    if not np.isfinite(loss):
        return "has a loss that is not finite"
    for m, (lo, hi) in zip(messages, bounds):
        try:
            values = codec.decode(m, hi - lo)
        except CodecError as e:
            return f"is malformed ({e})"
        if not np.isfinite(values).all():
            return "is not finite"
    return None


# -- the audit choice ---------------------------------------------------------------------------
def reference_nonce(seed: int, step: int, slot: int) -> bytes:
    """The reference run's stand-in for a peer's secret nonce of a step (a page draws 32 random
    bytes and sends SHA-256 of them with its commitment, the bytes themselves after every
    commitment of the step arrived)."""
    return hashlib.sha256(NONCE_TAG + struct.pack("<III", seed, step, slot)).digest()


def beacon(digests: list, nonces: list) -> bytes:
    """SHA-256(tag, every slot's digest in slot order, every slot's nonce in slot order)."""
    h = hashlib.sha256(BEACON_TAG)
    for d in digests:
        h.update(d)
    for n in nonces:
        h.update(n)
    return h.digest()


def audit_threshold(rate: float) -> int:
    """A slot is audited when its draw is below this: floor(rate x 2^32) (rate x 2^32 is exact)."""
    return int(rate * 2**32)


def audit_load(assigned: dict, step: int, P: int) -> list:
    """[P counts]: the audits each slot was given in the W steps before `step`. assigned: {step:
    [auditor slot of each of its audits]}, since the roster's last change."""
    load = [0] * P
    for t in range(max(0, step - AUDIT_WINDOW), step):
        for a in assigned.get(t, ()):
            load[a] += 1
    return load


def audit_pairs(seed: int, step: int, P: int, rate: float, beacon_bytes: bytes, load=None) -> list:
    """[(auditor, audited)] of the step, audited in slot order: slot i is audited when draw(k, i)
    < audit_threshold(rate) (a chance of `rate`, each slot on its own); its auditor is the other
    slot with the least load (audit_load, counting the audits given earlier in this step), ties
    broken by draw(k, P + i) mod their number (in slot order). No audits when P = 1.
    k = key(PURPOSE_AUDIT, seed, step, the beacon's 8 little-endian u32 words)."""
    if P < 2 or rate <= 0:
        return []
    k = prng.key(prng.PURPOSE_AUDIT, seed, step, *struct.unpack("<8I", beacon_bytes))
    load, below, pairs = list(load or [0] * P), audit_threshold(rate), []
    for i in range(P):
        if prng.draw(k, i) >= below:
            continue
        others = [j for j in range(P) if j != i]
        least = min(load[j] for j in others)
        tied = [j for j in others if load[j] == least]
        auditor = tied[prng.draw(k, P + i) % len(tied)]
        load[auditor] += 1
        pairs.append((auditor, i))
    return pairs


# -- evidence -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evidence:
    """A failed audit as broadcast: the run, the step (0-based index), the audited slot, the
    accusing slot, the audited slot's committed digest and the accuser's recomputed one (hex)."""
    run: str
    step: int
    slot: int
    accuser: int
    committed: str
    recomputed: str


def judge(evidence: Evidence, reproduced: str) -> str:
    """Who is removed, given the digest the checking peer recomputed itself for the audited
    slot: "audited" when the committed digest does not reproduce, else "accuser" (a false
    accusation). The accuser's own claimed hash decides nothing."""
    return "audited" if reproduced != evidence.committed else "accuser"


def trusted_step(passes: dict, convicted) -> int:
    """The state after the last step whose audit of a peer was passed by an auditor never
    convicted. passes: {auditor id: the step after the latest audit of the peer it passed}, with
    the peer's join under the auditor None (the run's start: 0). A convicted auditor's passes
    prove nothing (two colluders pass each other)."""
    return max(t for a, t in passes.items() if a is None or a not in convicted)


def rollback_step(peer, passes: dict, excluded_from: dict) -> int:
    """The step a conviction of `peer` rolls the group back to. passes: {peer id: its passes (as
    trusted_step)}; excluded_from: {each peer convicted before: the step from which the kept
    run leaves it out}. The peer's contributions after its trusted step were never checked; and
    its conviction voids the passes it gave, so a peer convicted before whose trusted step now
    falls below where it was left out takes the group back there too."""
    convicted = set(excluded_from) | {peer}
    back = trusted_step(passes[peer], convicted)
    for c, since in excluded_from.items():
        back = min(back, trusted_step(passes[c], convicted)) if trusted_step(passes[c], convicted) < since else back
    return back


# -- reduce-scatter: an owner's reduced shard ---------------------------------------------------
def check_reduced_shard(slices: list, committed_hashes: list, reduced: np.ndarray, n: int, codec,
                        seed: int, step: int, offset: int):
    """The audit of a shard owner: `slices` are the P messages of its shard [offset, offset + n)
    it received (its transcript, slot order), `committed_hashes` each slot's committed hash of
    that message, and `reduced` the reduced shard it sent, as decoded (n float64 values). None
    if codec.reduce of the transcript reproduces it bit for bit, else the reason."""
    for s, (m, h) in enumerate(zip(slices, committed_hashes)):
        if hashlib.sha256(m).digest() != h:
            return f"its transcript's slice of slot {s} is not the one slot {s} committed to"
    out = codec.reduce([codec.decode(m, n) for m in slices], seed=seed, step=step, offset=offset)
    if out.astype("<f8").tobytes() != np.ascontiguousarray(reduced, dtype="<f8").tobytes():
        return "its reduced shard did not reproduce"
    return None


# -- what the audits buy: detection per step ---------------------------------------------------
def detection_probability(P: int, rate: float, cheaters: int = 1, liar: bool = False) -> float:
    """The chance that a step's audits catch a lie, when `cheaters` of the P slots forge their
    gradients and pass each other's audits (liar=False), or when one slot is a lying auditor
    (liar=True: it is caught when it audits anyone). Each slot is audited with chance `rate`;
    its auditor is taken as uniform over the other P - 1 slots (audit_pairs balances their loads
    instead, which changes who audits, not how often on average)."""
    if P < 2 or rate <= 0:
        return 0.0
    q = min(rate, 1.0)
    if liar:                     # each other slot audited, and given to the liar
        return 1.0 - (1.0 - q / (P - 1)) ** (P - 1)
    c = cheaters                 # a cheater audited by an honest auditor
    return 1.0 - (1.0 - q * (P - c) / (P - 1)) ** c


def audit_work(rate: float) -> float:
    """Local steps of audit work per page per step: rate x P audits per step in the group, shared
    by the P pages (audit_pairs balances them)."""
    return rate


def expected_steps(p: float) -> float:
    """Mean steps from the first forged step to its detection (geometric: 1/p)."""
    return 1.0 / p


def median_steps(p: float) -> int:
    """Median of the same: the least n with 1 - (1 - p)^n >= 1/2."""
    from math import ceil, log
    return 1 if p >= 1.0 else max(1, ceil(log(0.5) / log(1.0 - p)))
