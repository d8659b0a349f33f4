// Audited gradients: the pure rules, mirroring daisy/audit.py (docs/VERIFICATION.md §13).
// A slot's contribution to step s is a pure function of (weights, batch key, step, slot, run seed),
// so any honest peer can recompute it and demand byte equality:
//   messages     the exact bytes the slot sends: the exchange codec's messages of its gradient
//                (exchange_codec.js), one in the all-gather topology, one per shard in reduce-scatter
//   commitment   SHA-256 of each message, and the slot's digest over its step, slot, loss and those
//                hashes (sent with the gradient)
//   cheap check  a message of the wrong size, a non-finite loss or value: evidence by itself
//   audit        the seeded choice of [auditor, audited] pairs from the run seed, the step and a
//                beacon over every digest and every peer's revealed nonce, so no peer knows the
//                choice before its commitment is sent; the auditor recomputes and compares
//   evidence     {run, step, slot, accuser, committed, recomputed}: every honest peer recomputes;
//                the audited slot is removed if its digest does not reproduce, else the accuser
// Bytes are Uint8Array; digests are 32-byte Uint8Array, shown as hex.
import { PURPOSE_AUDIT, draw, key } from './prng.js';
import { Sha256 } from './hashing.js';
import { topologyFor } from './collective.js';
import { CodecError } from './exchange_codec.js';

const ascii = (s) => Uint8Array.from(s, (c) => c.charCodeAt(0));
export const COMMIT_TAG = ascii('daisy-commit-v1');
export const BEACON_TAG = ascii('daisy-beacon-v1');
export const NONCE_TAG = ascii('daisy-audit-nonce-v1');
export const DEFAULT_AUDIT_RATE = 1;          // audits per step in the group (a run setting)

export const sha256 = (...parts) => { const h = new Sha256(); for (const p of parts) h.update(p); return h.digest(); };
const sameBytes = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const f64Bytes = (values) => new Uint8Array(Float64Array.from(values).buffer);

// ---- the messages a slot contributes (the exchange codec's, exchange_codec.js) ----------------------

// [[lo, hi]] of the flat gradient each message of a slot carries: the whole gradient in the
// all-gather topology, shard k of codec.shardBounds(N, P) in reduce-scatter
export function messageBounds(N, P, codec) {
  if (topologyFor(P) === 'allgather') return [[0, N]];
  const b = codec.shardBounds(N, P);
  return Array.from({ length: P }, (_, k) => [b[k], b[k + 1]]);
}

// the messages slot `slot` sends at `step` in a group of P, in message order: each the codec's
// encode of its slice (offset = the slice's first index)
export const slotMessages = (flat, P, seed, step, slot, codec) =>
  messageBounds(flat.length, P, codec).map(([lo, hi]) => codec.encode(flat.subarray(lo, hi), { seed, step, slot, offset: lo }));

// ---- commitments ---------------------------------------------------------------------------------

// SHA-256 of each message: a receiver checks the bytes it got against it
export const messageHashes = (messages) => messages.map((m) => sha256(m));

// the slot's commitment: SHA-256(tag, step u32le, slot u32le, loss f64le, each message hash)
export function slotDigest(step, slot, loss, hashes) {
  const head = new DataView(new ArrayBuffer(16));
  head.setUint32(0, step, true); head.setUint32(4, slot, true); head.setFloat64(8, loss, true);
  return sha256(COMMIT_TAG, new Uint8Array(head.buffer), ...hashes);
}

// what an auditor recomputes: the digest of (loss, flat) as slot `slot` must send it
export const contributionDigest = (flat, loss, P, seed, step, slot, codec) =>
  slotDigest(step, slot, loss, messageHashes(slotMessages(flat, P, seed, step, slot, codec)));

// ---- cheap checks: evidence by itself --------------------------------------------------------------

// null if the slot's messages have the codec's sizes and decode, and every value and the loss
// are finite; else the reason (the words of the panel)
export function cheapCheck(loss, messages, N, P, codec) {
  const bounds = messageBounds(N, P, codec);
  if (messages.length !== bounds.length) return `has ${messages.length} messages, the group needs ${bounds.length}`;
  for (let k = 0; k < bounds.length; k++) {
    const due = codec.messageBytes(bounds[k][1] - bounds[k][0]);
    if (messages[k].length !== due) return `is ${messages[k].length} bytes where ${due} are due`;
  }
  if (!Number.isFinite(loss)) return 'has a loss that is not finite';
  for (let k = 0; k < bounds.length; k++) {
    let values;
    try {
      values = codec.decode(messages[k], bounds[k][1] - bounds[k][0]);
    } catch (e) {
      if (e instanceof CodecError) return `is malformed (${e.message})`;
      throw e;
    }
    if (!values.every(Number.isFinite)) return 'is not finite';
  }
  return null;
}

// ---- the audit choice ----------------------------------------------------------------------------

// the reference run's stand-in for a peer's secret nonce of a step (a page draws 32 random bytes
// and sends SHA-256 of them with its commitment, the bytes after every commitment arrived)
export function referenceNonce(seed, step, slot) {
  const words = new DataView(new ArrayBuffer(12));
  words.setUint32(0, seed, true); words.setUint32(4, step, true); words.setUint32(8, slot, true);
  return sha256(NONCE_TAG, new Uint8Array(words.buffer));
}

export const nonceCommitment = (nonce) => sha256(nonce);

// SHA-256(tag, every slot's digest in slot order, every slot's nonce in slot order)
export const beacon = (digests, nonces) => sha256(BEACON_TAG, ...digests, ...nonces);

// [[auditor, audited]] of the step: min(rate, P) distinct audited slots (a partial Fisher-Yates
// shuffle), each with an auditor drawn from the other P - 1 slots; none when P = 1.
// k = key(PURPOSE_AUDIT, seed, step, the beacon's 8 little-endian u32 words)
export function auditPairs(seed, step, P, rate, beaconBytes) {
  if (P < 2) return [];
  const dv = new DataView(beaconBytes.buffer, beaconBytes.byteOffset, 32);
  const words = Array.from({ length: 8 }, (_, i) => dv.getUint32(4 * i, true));
  const k = key(PURPOSE_AUDIT, seed, step, ...words);
  const slots = Array.from({ length: P }, (_, i) => i);
  const pairs = [];
  for (let a = 0; a < Math.min(rate, P); a++) {
    const j = a + (draw(k, a) % (P - a));
    [slots[a], slots[j]] = [slots[j], slots[a]];
    const audited = slots[a];
    pairs.push([(audited + 1 + (draw(k, P + a) % (P - 1))) % P, audited]);
  }
  return pairs;
}

// ---- evidence ----------------------------------------------------------------------------------------

// a failed audit as broadcast: the run, the step (0-based index), the audited slot, the accusing
// slot, the audited slot's committed digest and the accuser's recomputed one (hex)
export class Evidence {
  constructor({ run, step, slot, accuser, committed, recomputed }) {
    this.run = run; this.step = step; this.slot = slot; this.accuser = accuser;
    this.committed = committed; this.recomputed = recomputed;
    Object.freeze(this);
  }
}

// who is removed, given the digest the checking peer recomputed itself (hex): 'audited' when the
// committed digest does not reproduce, else 'accuser' (a false accusation)
export const judge = (ev, reproduced) => (reproduced !== ev.committed ? 'audited' : 'accuser');

// The state after the last step whose audit of a peer was passed by an auditor never convicted.
// passes: Map auditor id -> the step after the latest audit of the peer it passed, the peer's join
// under the auditor null (the run's start: 0). A convicted auditor's passes prove nothing.
export function trustedStep(passes, convicted) {
  let t = -Infinity;
  for (const [a, step] of passes) if (a === null || !convicted.has(a)) t = Math.max(t, step);
  return t;
}

// The step a conviction of `peer` rolls the group back to. passes: Map peer id -> its passes (as
// trustedStep); excludedFrom: Map each peer convicted before -> the step from which the kept run
// leaves it out. Its contributions after its trusted step were never checked; its conviction
// voids the passes it gave, so a peer convicted before whose trusted step now falls below where
// it was left out takes the group back there too.
export function rollbackStep(peer, passes, excludedFrom) {
  const convicted = new Set([...excludedFrom.keys(), peer]);
  let back = trustedStep(passes.get(peer), convicted);
  for (const [c, since] of excludedFrom) {
    const t = trustedStep(passes.get(c), convicted);
    if (t < since) back = Math.min(back, t);
  }
  return back;
}

// ---- reduce-scatter: an owner's reduced shard ----------------------------------------------------------

// The audit of a shard owner: `slices` the P messages of its shard [offset, offset + n) it received
// (its transcript, slot order), `committedHashes` each slot's committed hash of that message,
// `reduced` the reduced shard it sent as decoded (n float64 values). null if codec.reduce of the
// transcript reproduces it bit for bit, else the reason.
export function checkReducedShard(slices, committedHashes, reduced, n, codec, seed, step, offset) {
  for (let s = 0; s < slices.length; s++) {
    if (!sameBytes(sha256(slices[s]), committedHashes[s])) {
      return `its transcript's slice of slot ${s} is not the one slot ${s} committed to`;
    }
  }
  const out = codec.reduce(slices.map((m) => codec.decode(m, n)), { seed, step, offset });
  if (!sameBytes(f64Bytes(out), f64Bytes(reduced))) return 'its reduced shard did not reproduce';
  return null;
}

// ---- what the audits buy: detection per step (daisy/audit.py) ---------------------------------------

const comb = (n, k) => { let c = 1; for (let i = 1; i <= k; i++) c = (c * (n - k + i)) / i; return k < 0 || k > n ? 0 : c; };

// The chance that a step's audits catch a lie, when `cheaters` of the P slots forge their
// gradients and pass each other's audits (liar false), or one slot is a lying auditor (liar true)
export function detectionProbability(P, rate, cheaters = 1, liar = false) {
  const r = Math.min(rate, P);
  if (P < 2 || r === 0) return 0;
  if (liar) {
    const q = (P - 2) / (P - 1);
    return 1 - ((r / P) * q ** (r - 1) + (1 - r / P) * q ** r);
  }
  const c = cheaters;
  let miss = 0;
  for (let j = 0; j <= Math.min(c, r); j++) miss += (comb(c, j) * comb(P - c, r - j)) / comb(P, r) * ((c - 1) / (P - 1)) ** j;
  return 1 - miss;
}

// mean steps from the first forged step to its detection (geometric: 1/p)
export const expectedSteps = (p) => 1 / p;

// median of the same: the least n with 1 - (1 - p)^n >= 1/2
export const medianSteps = (p) => (p >= 1 ? 1 : Math.max(1, Math.ceil(Math.log(0.5) / Math.log(1 - p))));
