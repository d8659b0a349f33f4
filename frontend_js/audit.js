// Audited gradients: the pure rules, mirroring daisy/audit.py (docs/VERIFICATION.md §12).
// A slot's contribution to step s is a pure function of (weights, batch key, step, slot, run seed),
// so any honest peer can recompute it and demand byte equality:
//   messages     the exact bytes the slot sends: the exchange codec's message of its gradient, one
//                message in the all-gather topology, one per shard in reduce-scatter
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
import { reduceShard, shardBounds, topologyFor } from './collective.js';

const ascii = (s) => Uint8Array.from(s, (c) => c.charCodeAt(0));
export const COMMIT_TAG = ascii('daisy-commit-v1');
export const BEACON_TAG = ascii('daisy-beacon-v1');
export const NONCE_TAG = ascii('daisy-audit-nonce-v1');
export const DEFAULT_AUDIT_RATE = 1;          // audits per step in the group (a run setting)

const sha256 = (...parts) => { const h = new Sha256(); for (const p of parts) h.update(p); return h.digest(); };
export const toHex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
const sameBytes = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// ---- the messages a slot contributes (the exchange codec's seam, BRIEF) -------------------------

// The exchange codec's message of `values` (flat gradient indices offset.. of slot `slot`). f64
// until the codec lands: the raw little-endian float64 bytes (the one line to swap for
// codecFor(cfg.exchange).encode).
export function encodeMessage(values, seed, step, slot, offset) {
  const out = new Uint8Array(8 * values.length);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < values.length; i++) dv.setFloat64(8 * i, values[i], true);
  return out;
}

// the codec's decode: message -> n float64 values (size checked by cheapCheck first)
export function decodeMessage(message, n) {
  const dv = new DataView(message.buffer, message.byteOffset, message.byteLength);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = dv.getFloat64(8 * i, true);
  return out;
}

// [[lo, hi]] of the flat gradient each message of a slot carries: the whole gradient in the
// all-gather topology, shard k of shardBounds(N, P) in reduce-scatter (collective.js)
export function messageBounds(N, P) {
  if (topologyFor(P) === 'allgather') return [[0, N]];
  const b = shardBounds(N, P);
  return Array.from({ length: P }, (_, k) => [b[k], b[k + 1]]);
}

// the messages slot `slot` sends at `step` in a group of P, in message order
export const slotMessages = (flat, P, seed, step, slot) =>
  messageBounds(flat.length, P).map(([lo, hi]) => encodeMessage(flat.subarray(lo, hi), seed, step, slot, lo));

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
export const contributionDigest = (flat, loss, P, seed, step, slot) =>
  slotDigest(step, slot, loss, messageHashes(slotMessages(flat, P, seed, step, slot)));

// ---- cheap checks: evidence by itself --------------------------------------------------------------

// null if the slot's messages have the right sizes and every value and the loss are finite;
// else the reason (the words of the panel)
export function cheapCheck(loss, messages, N, P) {
  const bounds = messageBounds(N, P);
  if (messages.length !== bounds.length) return `has ${messages.length} messages, the group needs ${bounds.length}`;
  for (let k = 0; k < bounds.length; k++) {
    const due = 8 * (bounds[k][1] - bounds[k][0]);
    if (messages[k].length !== due) return `is ${messages[k].length} bytes where ${due} are due`;
  }
  if (!Number.isFinite(loss)) return 'has a loss that is not finite';
  for (let k = 0; k < bounds.length; k++) {
    if (!decodeMessage(messages[k], bounds[k][1] - bounds[k][0]).every(Number.isFinite)) return 'is not finite';
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

// the step a removal of `peer` rolls back to: the state after its last passed audit (or its join)
export const rollbackStep = (lastPass, peer) => lastPass.get(peer);

// ---- reduce-scatter: an owner's reduced shard ----------------------------------------------------------

// The audit of a shard owner: `slices` the P messages of its shard it received (slot order),
// `committedHashes` each slot's committed hash of that message, `reduced` the reduced shard it sent
// as decoded (n float64 values). null if it reproduces bit for bit, else the reason.
export function checkReducedShard(slices, committedHashes, reduced, n) {
  for (let s = 0; s < slices.length; s++) {
    if (slices[s].length !== 8 * n || !sameBytes(sha256(slices[s]), committedHashes[s])) {
      return `its transcript's slice of slot ${s} is not the one slot ${s} committed to`;
    }
  }
  const out = reduceShard(slices.map((m) => decodeMessage(m, n)));
  if (!sameBytes(encodeMessage(out), encodeMessage(reduced))) return 'its reduced shard did not reproduce';
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
