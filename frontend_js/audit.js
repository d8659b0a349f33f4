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
import { Sha256, f64LeBytes } from './hashing.js';
import { topologyFor } from './collective.js';
import { CodecError } from './exchange_codec.js';

const ascii = (s) => Uint8Array.from(s, (c) => c.charCodeAt(0));
export const COMMIT_TAG = ascii('daisy-commit-v1');
export const BEACON_TAG = ascii('daisy-beacon-v1');
export const NONCE_TAG = ascii('daisy-audit-nonce-v1');
export const STATE_TAG = ascii('daisy-adam-state-v1');
export const DEFAULT_AUDIT_RATE = 0.1;        // the chance that a slot's contribution to a step is audited (a run setting)
export const DEFAULT_ROUND_AUDIT_RATE = 0.1;  // local steps: the chance that a slot's round is audited (docs/VERIFICATION.md §13)
// the run's audit rate when none is given: per step, or per round of local steps
export const defaultAuditRate = (localSteps) => (localSteps > 1 ? DEFAULT_ROUND_AUDIT_RATE : DEFAULT_AUDIT_RATE);
export const MAX_AUDIT_RATE = 1;              // every slot audited at every step
export const AUDIT_WINDOW = 16;               // W: steps an audit may take (its verdict comes by step + W), and the
                                              // window over which auditors' loads are balanced (docs/VERIFICATION.md §13)

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

// ---- rounds of local steps (docs/VERIFICATION.md §13 "Rounds of local steps") ----------------------

// the 0-based step that ends the round holding step s: the next multiple of H, less one, or the
// run's last step (train.js isExchangeStep)
export const roundEnd = (s, H, steps) => Math.min((Math.floor(s / H) + 1) * H, steps) - 1;

// what a slot commits to of its own Adam state at a round's end (the state it starts the next round
// from): SHA-256(tag, t u32le, every m tensor's float64le bytes in param order, then every v tensor's)
export function adamStateHash(adam) {
  const t = new DataView(new ArrayBuffer(4));
  t.setUint32(0, adam.t, true);
  return sha256(STATE_TAG, new Uint8Array(t.buffer), ...Object.values(adam.m).map(f64LeBytes), ...Object.values(adam.v).map(f64LeBytes));
}

// the bytes of a slot's Adam state as an auditor receives it: t (u32) and m, v (N float64 each)
export const stateTranscriptBytes = (N) => 4 + 2 * 8 * N;

// a slot's commitment for a round ending at `step`: slotDigest over its messages' hashes and,
// last, the hash of its Adam state at the round's end
export const roundDigest = (step, slot, loss, hashes, stateHash) => slotDigest(step, slot, loss, [...hashes, stateHash]);

// the audited slot's Adam state at the round's start (its transcript) against what it committed
// at its round before: null if it hashes to it, else the reason (evidence by itself)
export function checkStartState(adam, committed) {
  return sameBytes(adamStateHash(adam), committed) ? null : "its Adam state at the round's start is not the one it committed to";
}

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

// SHA-256(tag, every slot's digest in slot order, every slot's nonce in slot order)
export const beacon = (digests, nonces) => sha256(BEACON_TAG, ...digests, ...nonces);

// a slot is audited when its draw is below this: floor(rate x 2^32) (rate x 2^32 is exact)
export const auditThreshold = (rate) => Math.floor(rate * 2 ** 32);

// [P counts]: the audits each slot was given in the W steps before `step`. assigned: Map step ->
// [auditor slot of each of its audits], since the roster's last change
export function auditLoad(assigned, step, P) {
  const load = new Array(P).fill(0);
  for (let t = Math.max(0, step - AUDIT_WINDOW); t < step; t++) for (const a of assigned.get(t) || []) load[a] += 1;
  return load;
}

// [[auditor, audited]] of the step, audited in slot order: slot i is audited when draw(k, i) <
// auditThreshold(rate) (a chance of `rate`, each slot on its own); its auditor is the other slot
// with the least load (auditLoad, counting the audits given earlier in this step), ties broken by
// draw(k, P + i) mod their number (in slot order). None when P = 1.
// k = key(PURPOSE_AUDIT, seed, step, the beacon's 8 little-endian u32 words)
export function auditPairs(seed, step, P, rate, beaconBytes, load = null) {
  if (P < 2 || !(rate > 0)) return [];
  const dv = new DataView(beaconBytes.buffer, beaconBytes.byteOffset, 32);
  const words = Array.from({ length: 8 }, (_, i) => dv.getUint32(4 * i, true));
  const k = key(PURPOSE_AUDIT, seed, step, ...words);
  const loads = load ? load.slice() : new Array(P).fill(0), below = auditThreshold(rate);
  const pairs = [];
  for (let i = 0; i < P; i++) {
    if (draw(k, i) >= below) continue;
    const others = [];
    for (let j = 0; j < P; j++) if (j !== i) others.push(j);
    const least = Math.min(...others.map((j) => loads[j]));
    const tied = others.filter((j) => loads[j] === least);
    const auditor = tied[draw(k, P + i) % tied.length];
    loads[auditor] += 1;
    pairs.push([auditor, i]);
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

// The chance that a step's audits catch a lie, when `cheaters` of the P slots forge their
// gradients and pass each other's audits (liar false), or one slot is a lying auditor (liar true).
// Each slot is audited with chance `rate`; its auditor is taken as uniform over the other P - 1
// slots (auditPairs balances their loads instead: who audits changes, not how often on average)
export function detectionProbability(P, rate, cheaters = 1, liar = false) {
  if (P < 2 || !(rate > 0)) return 0;
  const q = Math.min(rate, 1);
  if (liar) return 1 - (1 - q / (P - 1)) ** (P - 1);          // each other slot audited, and given to the liar
  const c = cheaters;                                         // a cheater audited by an honest auditor
  return 1 - (1 - (q * (P - c)) / (P - 1)) ** c;
}

// local steps of audit work per page per step: rate x P audits per step in the group, shared by
// the P pages (auditPairs balances them)
export const auditWork = (rate) => rate;

// mean steps from the first forged step to its detection (geometric: 1/p)
export const expectedSteps = (p) => 1 / p;

// median of the same: the least n with 1 - (1 - p)^n >= 1/2
export const medianSteps = (p) => (p >= 1 ? 1 : Math.max(1, Math.ceil(Math.log(0.5) / Math.log(1 - p))));
