// The mesh's binary frame format (docs/PROTOCOL.md "Mesh frames"): one message is cut into
// chunks that each fit the data channel's real maxMessageSize; every chunk carries the whole
// header, so a receiver can check it before it allocates anything.
//
//   offset size  field
//   0      4     magic 'DSYM'
//   4      1     version (PROTOCOL_VERSION)
//   5      1     type (TYPES)
//   6      2     slot        u16: the sender's slot in the run (NO_SLOT outside a run)
//   8      4     runId       u32 (0 outside a run)
//   12     4     step        u32 (the 0-based step a training message belongs to)
//   16     4     msgId       u32: the sender's message counter (chunks of one message share it)
//   20     2     chunkIndex  u16
//   22     2     chunkCount  u16 (>= 1)
//   24     4     length      u32: bytes of the whole message payload
//   28     4     offset      u32: where this chunk's bytes go in the payload
//   32     32    digest      SHA-256 of bytes 4..16 of the header followed by the whole payload
//   64     ...   this chunk's payload bytes
// All integers little-endian. A message is accepted only when every chunk arrived, the chunks
// tile the payload exactly, and the digest matches.
import { jsSha, createSubtleSha, gateSha, fromHex } from '../hashing.js';

export const MAGIC = 0x4d595344;            // 'DSYM' read as a little-endian u32
export const PROTOCOL_VERSION = 7;         // 2: membership (ROSTER .. LEAVE); 3: GRAD_PART (a GRAD streamed in parts); 4: AUDIT, EVIDENCE; 5: TRANSCRIPT_ASK, TRANSCRIPT; 6: auditRate a per-slot chance, verdicts up to W steps late; 7: audited rounds of local steps (AUDIT's stateHash, ROUND_STATE_ASK, ROUND_STATE)
export const HEADER_BYTES = 64;
export const NO_SLOT = 0xffff;
export const MAX_FRAME_BYTES = 256 * 1024;  // what we accept per frame (Chromium's maxMessageSize)
export const MIN_CHUNK_BYTES = 1024;       // the least payload a chunk but a message's last carries (encodeMessage)

export const TYPES = Object.freeze({
  HELLO: 1,      // JSON {protocol, peerId}: the first message on a new link
  RUN: 2,        // JSON run descriptor, leader -> every member
  ACCEPT: 3,     // JSON {runId, initHash}: a member joins the proposed run
  REFUSE: 4,     // JSON {runId, reason}: a member declines it
  GO: 5,         // JSON {runId}: everyone accepted; step `startStep` begins
  STOP: 6,       // JSON {runId, stopAfter, reason}: the run ends after step stopAfter (1-based count)
  FIN: 7,        // JSON {runId, step, hash}: the final hash after the last step
  STATE: 8,      // binary: a replica's state (state_codec.js): the start state of a resumed run, and a joiner's sync after SYNC
  GRAD: 10,      // binary: prevHash (32) + loss (f64) + gradient values (f64 LE)
  REDUCED: 11,   // binary: the owner's reduced shard (f64 LE)
  // membership (docs/ARCHITECTURE.md "Membership")
  ROSTER: 12,    // JSON {runId, epoch, from, roster, left, joined, reason}: the roster from step `from` on
  STATUS: 13,    // JSON {runId, epoch, completed, hash, gone}: a member's position, to the acting leader
  HALT: 14,      // JSON {runId, epoch, gone}: the acting leader halts the step in flight; members answer STATUS
  JOIN: 15,      // JSON {protocol, dataId}: a device asks the running group to sync it in
  SYNC: 16,      // JSON {runId, desc, roster, epoch, history, step, hash}: the leader's answer; STATE follows
  FWD: 17,       // binary: the group's reduced gradient of the step (f64 LE), to a joiner catching up
  SYNCED: 18,    // JSON {runId, step, hash}: a joiner's hash after catching up to `step`
  LEAVE: 19,     // JSON {runId, reason}: goodbye: this page is closing
  GROUP_STATE: 20, // binary: a loaded checkpoint's state body (state_codec.js) to the idle group (group_state.js)
  GRAD_PART: 21, // binary: part index (u32) + bytes of a GRAD's payload, sent while the backward pass runs (mesh_collective.js)
  // audited gradients (docs/PROTOCOL.md "Audited gradients", run/audits.js)
  AUDIT: 22,     // JSON {runId, epoch, step, hashes, loss, nonceHash, reveal, beacon}: a step's commitment, the last step's nonce
  EVIDENCE: 23,  // JSON {runId, epoch, step, slot, accuser, committed, recomputed, kind?}: a failed audit, for every member to check
  TRANSCRIPT_ASK: 24, // JSON {runId, epoch, step}: to a reduce-scatter shard's owner: its transcript of that step, please
  TRANSCRIPT: 25,     // binary: the owner's transcript: the P messages of its shard it reduced, slot order
  ROUND_STATE_ASK: 26, // JSON {runId, epoch, step}: local steps: the audited slot's Adam state at the start of the round ending at `step`, please
  ROUND_STATE: 27,     // binary: that state (audit.js stateTranscriptBytes: t u32le, m, v float64le in param order)
});
const TYPE_NAMES = new Map(Object.entries(TYPES).map(([k, v]) => [v, k]));
export const typeName = (t) => TYPE_NAMES.get(t) || `type ${t}`;
export const JSON_TYPES = new Set([TYPES.HELLO, TYPES.RUN, TYPES.ACCEPT, TYPES.REFUSE, TYPES.GO, TYPES.STOP, TYPES.FIN,
  TYPES.ROSTER, TYPES.STATUS, TYPES.HALT, TYPES.JOIN, TYPES.SYNC, TYPES.SYNCED, TYPES.LEAVE, TYPES.AUDIT, TYPES.EVIDENCE,
  TYPES.TRANSCRIPT_ASK, TYPES.ROUND_STATE_ASK]);
export const MAX_JSON_BYTES = 64 * 1024;

// ---- digest ---------------------------------------------------------------------------------
// The digest's SHA-256 is a value (hashing.js's sha: {name, hexOf(parts)}), chosen by whoever owns
// the frames: the Mesh makes one per mesh (upgradingSha(createFrameSha)); encodeMessage and
// Reassembler take it as an argument, the JS SHA-256 by default. Every sha gives the same bytes
// (each is gated against the JS one); only the speed differs.

// -> WebCrypto's SHA-256 (native: ~1 GB/s) when present and it passes gateSha, else the JS one.
// makeFast: the fast sha's maker (hashing.js createSubtleSha; a test passes a broken one)
export async function createFrameSha(makeFast = createSubtleSha) {
  try {
    const fast = makeFast();
    if (!(await gateSha(fast))) return fast;
  } catch { /* missing (not a secure context): the JS one */ }
  return jsSha;
}

// A sha that is the JS one until make() (async -> a gated sha, started now, once) resolves, then
// that one: all give the same bytes, so no message waits for the gate. ready: resolves after.
export function upgradingSha(make) {
  let current = jsSha;
  const ready = make().then((sha) => { current = sha; }, () => { /* keep the JS one */ });
  return { get name() { return current.name; }, hexOf: (parts) => current.hexOf(parts), ready };
}

// SHA-256 of identity (12 bytes: version, type, slot, runId, step) || payload -> Uint8Array(32)
export async function messageDigest(identity, payload, sha = jsSha) {
  return fromHex(await sha.hexOf([identity, payload]));
}

// ---- encode ---------------------------------------------------------------------------------
// {type, slot, runId, step, payload: Uint8Array} -> Uint8Array[] chunks, each <= maxFrame bytes;
// sha: the digest's SHA-256 (see "digest")
export async function encodeMessage({ type, slot = NO_SLOT, runId = 0, step = 0, payload, version = PROTOCOL_VERSION },
  msgId, maxFrame, sha = jsSha) {
  const per = Math.min(maxFrame, MAX_FRAME_BYTES) - HEADER_BYTES;
  if (per < MIN_CHUNK_BYTES) throw new RangeError(`the link's frame limit ${maxFrame} is too small`);
  const count = Math.max(1, Math.ceil(payload.length / per));
  if (count > 0xffff) throw new RangeError(`a ${payload.length}-byte message needs ${count} chunks, over 65535`);
  const head = new Uint8Array(HEADER_BYTES);
  const dv = new DataView(head.buffer);
  dv.setUint32(0, MAGIC, true);
  dv.setUint8(4, version); dv.setUint8(5, type); dv.setUint16(6, slot, true);
  dv.setUint32(8, runId >>> 0, true); dv.setUint32(12, step >>> 0, true);
  dv.setUint32(16, msgId >>> 0, true); dv.setUint16(22, count, true);
  dv.setUint32(24, payload.length, true);
  head.set(await messageDigest(head.subarray(4, 16), payload, sha), 32);
  const chunks = [];
  for (let i = 0; i < count; i++) {
    const from = i * per, to = Math.min(payload.length, from + per);
    const frame = new Uint8Array(HEADER_BYTES + (to - from));
    frame.set(head, 0);
    const fv = new DataView(frame.buffer);
    fv.setUint16(20, i, true); fv.setUint32(28, from, true);
    frame.set(payload.subarray(from, to), HEADER_BYTES);
    chunks.push(frame);
  }
  return chunks;
}

export const jsonPayload = (obj) => new TextEncoder().encode(JSON.stringify(obj));

// ---- decode ---------------------------------------------------------------------------------
export class FrameError extends Error {
  constructor(reason) { super(reason); this.name = 'FrameError'; }
}

// bytes -> header fields (checked for shape only; limits are the reassembler's)
export function parseHeader(bytes) {
  if (!(bytes instanceof Uint8Array)) throw new FrameError('not a binary frame');
  if (bytes.length < HEADER_BYTES) throw new FrameError(`truncated frame (${bytes.length} bytes, header is ${HEADER_BYTES})`);
  if (bytes.length > MAX_FRAME_BYTES) throw new FrameError(`oversized frame (${bytes.length} bytes, limit ${MAX_FRAME_BYTES})`);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dv.getUint32(0, true) !== MAGIC) throw new FrameError('bad magic (not a mesh frame)');
  const h = {
    version: dv.getUint8(4), type: dv.getUint8(5), slot: dv.getUint16(6, true),
    runId: dv.getUint32(8, true), step: dv.getUint32(12, true), msgId: dv.getUint32(16, true),
    chunkIndex: dv.getUint16(20, true), chunkCount: dv.getUint16(22, true),
    length: dv.getUint32(24, true), offset: dv.getUint32(28, true),
    digest: bytes.subarray(32, 64), data: bytes.subarray(HEADER_BYTES),
    identity: bytes.subarray(4, 16),
  };
  if (h.version !== PROTOCOL_VERSION) {
    const err = new FrameError(`protocol version ${h.version} (this page speaks ${PROTOCOL_VERSION})`);
    err.version = h.version;
    throw err;
  }
  if (!TYPE_NAMES.has(h.type)) throw new FrameError(`unknown frame type ${h.type}`);
  if (h.chunkCount < 1 || h.chunkIndex >= h.chunkCount) throw new FrameError(`bad chunk ${h.chunkIndex} of ${h.chunkCount}`);
  if (h.offset + h.data.length > h.length) throw new FrameError(`chunk bytes ${h.offset}..${h.offset + h.data.length} past the message length ${h.length}`);
  return h;
}

const sameBytes = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// Chunks from one sender -> whole, digest-checked messages. Bounded (docs/PROTOCOL.md "Mesh
// limits"): a message's size must be allowed for its type (limitFor) before anything is kept;
// an unfinished message holds only the bytes received so far, never what its header claims (the
// payload is put together once the last chunk arrives); at most maxPending unfinished messages,
// the oldest abandoned when a new one starts beyond that; at most maxPartialBytes received for
// unfinished messages together, the oldest abandoned to make room for a chunk; an unfinished
// message with no new chunk for partialTimeoutMs abandoned when its owner calls expire(). An abandoned
// message is reported (onAbandon) so that the link's owner counts it as a bad frame. A completed or dropped msgId is remembered so duplicates are
// dropped. Chunks may arrive in any order (the in-memory test transport shuffles them).
export const MAX_PENDING = 8;
export const MAX_PARTIAL_BYTES = 64 * 1024 * 1024;   // the largest state (~38 MiB) and a gradient beside it
// an unfinished message with no new chunk this long is abandoned: an honest sender's chunks of one
// message follow each other on the ordered channel, so a stall this long is a transfer that ended
export const PARTIAL_TIMEOUT_MS = 30_000;

export class Reassembler {
  constructor({ limitFor, maxPending = MAX_PENDING, maxPartialBytes = MAX_PARTIAL_BYTES, remember = 512,
    partialTimeoutMs = PARTIAL_TIMEOUT_MS, now = () => Date.now(), onProgress = null, onAbandon = null, sha = jsSha } = {}) {
    this.limitFor = limitFor;          // (header) -> max payload bytes for it, or a string: why refused
    this.onProgress = onProgress;      // (header, bytes so far) after each chunk of a multi-chunk message
    this.onAbandon = onAbandon;        // (header, reason) when an unfinished message is dropped (room, or stalled)
    this.now = now;                    // the clock (ms) of partialTimeoutMs; tests pass their own
    this.sha = sha;                    // the digest's SHA-256 (see "digest")
    this.maxPending = maxPending;
    this.maxPartialBytes = maxPartialBytes;
    this.remember = remember;
    this.partialTimeoutMs = partialTimeoutMs;
    this.partial = new Map();          // msgId -> {h, chunks: [{offset, data}], got: Set of chunk indexes, bytes, lastAt}
    this.heldBytes = 0;                // payload bytes held by the unfinished messages together
    this.done = new Set();             // msgIds completed or dropped (bounded, insertion order)
  }

  forget(msgId) {
    this.done.add(msgId);
    if (this.done.size > this.remember) this.done.delete(this.done.values().next().value);
  }

  // drop an unfinished message: its bytes are given back and its msgId remembered
  discard(p) {
    this.partial.delete(p.h.msgId);
    this.heldBytes -= p.bytes;
    this.forget(p.h.msgId);
  }

  // Abandon every unfinished message that got no chunk for partialTimeoutMs (each reported to
  // onAbandon), giving its bytes back. The owner calls it at nextExpiry() (Mesh: a timer per link).
  expire() {
    const now = this.now();
    for (const p of [...this.partial.values()]) {
      if (now - p.lastAt < this.partialTimeoutMs) continue;
      this.discard(p);
      this.onAbandon?.(p.h, `message ${p.h.msgId} abandoned unfinished (${p.bytes} of ${p.h.length} bytes): `
        + `no chunk for ${this.partialTimeoutMs / 1000} s`);
    }
  }

  // when (on the now() clock) the stalest unfinished message expires; null: none is unfinished
  nextExpiry() {
    let at = null;
    for (const p of this.partial.values()) at = Math.min(at ?? Infinity, p.lastAt + this.partialTimeoutMs);
    return at;
  }

  // -> {message} when a message completes, null while partial; throws FrameError when dropped
  async accept(bytes) {
    const h = parseHeader(bytes);
    if (this.done.has(h.msgId)) throw new FrameError(`duplicate chunk of message ${h.msgId} (${typeName(h.type)})`);
    let p = this.partial.get(h.msgId);
    if (!p) {
      const limit = this.limitFor(h);
      if (typeof limit === 'string') throw new FrameError(limit);
      if (h.length > limit) throw new FrameError(`${typeName(h.type)} of ${h.length} bytes is over its limit of ${limit}`);
      if (h.chunkCount === 1 && h.data.length !== h.length) throw new FrameError(`single-chunk message of ${h.length} bytes carries ${h.data.length}`);
      if (h.chunkCount > 1 && this.partial.size >= this.maxPending) {
        const oldest = this.partial.values().next().value;
        this.discard(oldest);
        this.onAbandon?.(oldest.h, `message ${oldest.h.msgId} abandoned unfinished (${oldest.bytes} of ${oldest.h.length} bytes): `
          + `over ${this.maxPending} unfinished messages`);
      }
      p = { h, chunks: [], got: new Set(), bytes: 0, lastAt: 0 };
      this.partial.set(h.msgId, p);
    } else {
      const a = p.h;
      if (a.type !== h.type || a.runId !== h.runId || a.step !== h.step || a.slot !== h.slot
          || a.length !== h.length || a.chunkCount !== h.chunkCount || !sameBytes(a.digest, h.digest)) {
        this.discard(p);
        throw new FrameError(`chunk ${h.chunkIndex} of message ${h.msgId} disagrees with its first chunk`);
      }
      if (p.got.has(h.chunkIndex)) throw new FrameError(`duplicate chunk ${h.chunkIndex} of message ${h.msgId}`);
    }
    // over the byte budget: the oldest other unfinished messages make room (a transfer cut
    // short must not keep its retry out), then this one alone if it still does not fit
    for (const old of this.partial.values()) {
      if (this.heldBytes + h.data.length <= this.maxPartialBytes) break;
      if (old === p) continue;
      this.discard(old);
      this.onAbandon?.(old.h, `message ${old.h.msgId} abandoned unfinished (${old.bytes} of ${old.h.length} bytes): `
        + `unfinished messages would hold over ${this.maxPartialBytes} bytes`);
    }
    if (this.heldBytes + h.data.length > this.maxPartialBytes) {
      this.discard(p);
      throw new FrameError(`message ${h.msgId} (${typeName(h.type)}): unfinished messages would hold over `
        + `${this.maxPartialBytes} bytes`);
    }
    p.chunks.push({ offset: h.offset, data: h.data });  // a view: each received frame is its own buffer
    p.got.add(h.chunkIndex);
    p.bytes += h.data.length;
    p.lastAt = this.now();
    this.heldBytes += h.data.length;
    if (p.got.size < h.chunkCount) {
      if (p.bytes >= h.length && h.length > 0) {
        this.discard(p);
        throw new FrameError(`message ${h.msgId}: chunks overlap (${p.bytes} bytes before the last chunk)`);
      }
      this.onProgress?.(p.h, p.bytes);
      return null;
    }
    this.discard(p);
    if (p.bytes !== h.length) throw new FrameError(`message ${h.msgId}: chunks carry ${p.bytes} bytes, the header says ${h.length}`);
    const payload = new Uint8Array(h.length);
    for (const c of p.chunks) payload.set(c.data, c.offset);
    const digest = await messageDigest(p.h.identity, payload, this.sha);
    if (!sameBytes(digest, p.h.digest)) {
      const err = new FrameError(`message ${h.msgId} (${typeName(h.type)}): digest mismatch`);
      err.type = h.type;               // the receiver may ask for the message again
      throw err;
    }
    const m = { type: h.type, slot: h.slot, runId: h.runId, step: h.step, msgId: h.msgId, payload };
    if (JSON_TYPES.has(h.type)) {
      try { m.json = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(payload)); } catch (e) {
        throw new FrameError(`${typeName(h.type)} payload is not JSON`);
      }
      if (!m.json || typeof m.json !== 'object' || Array.isArray(m.json)) throw new FrameError(`${typeName(h.type)} payload is not a JSON object`);
    }
    return { message: m };
  }
}
