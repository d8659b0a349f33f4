// MeshCollective: the collective seam of collective.js over a Mesh (mesh.js): one replica per
// page, its gradient sent to the other pages in the run's topology (collective.js explains both),
// as messages of the run's exchange codec (exchange_codec.js; docs/PROTOCOL.md "GRAD and REDUCED
// payloads"). G is codecReduce's (collective.js): the same bits as the Group's.
// A GRAD may also be streamed: sent in parts (GRAD_PART) as the backward pass finalizes the
// gradient, the receiver putting the same payload bytes back together (docs/PROTOCOL.md
// "Streamed GRAD"): beginStep below.
import { reduceLosses } from '../reduce.js';
import { flattenGrads, unflatten, topologyFor } from '../collective.js';
import { codecFor, CodecError } from '../exchange_codec.js';
import { TYPES } from './frames.js';
import { yieldToPage } from '../page_clock.js';
import { jsSha, toHex, fromHex } from '../hashing.js';

// ---- MeshCollective -------------------------------------------------------------------------

export class ExchangeError extends Error {
  constructor(message, { peer = null, step = null } = {}) { super(message); this.name = 'ExchangeError'; this.peer = peer; this.step = step; }
}

const allFinite = (values) => { for (let i = 0; i < values.length; i++) if (!Number.isFinite(values[i])) return false; return true; };

const HASH_BYTES = 32;
const HEADER_BYTES = HASH_BYTES + 8;     // a GRAD: the sender's previous hash, its loss (f64 LE), then the codec message
// a GRAD's previous hash: null (none yet, the run's first step) travels as 32 zero bytes
const hexToBytes = (hex) => (hex ? fromHex(hex) : new Uint8Array(HASH_BYTES));
const bytesToHex = (b) => (b.every((x) => x === 0) ? null : toHex(b));

// ---- the streamed GRAD's parts (pure; docs/PROTOCOL.md "Streamed GRAD") ---------------------

export const PART_INDEX_BYTES = 4;       // a GRAD_PART: the part's index (u32 LE), then its bytes
export const MIN_PART_BYTES = 64 * 1024;  // message bytes between two cuts (but the last): each part
                                          // is a message (digest, frames, a turn of the event loop)

// sizes: the tensors' value counts in canonical order; codec: the run's. The backward pass
// finalizes the tensors in reverse canonical order, so once tensor t is final the values [o_t, N)
// are; a part may end only on a block boundary (codec.block). -> the cut points, descending: N,
// then c_t = ⌈o_t / block⌉·block for t = T-1 … 1 where the message of [c_t, the last cut) holds at
// least minPartBytes, then 0. (Every peer of a run uses the default; tests pass a smaller one to all.)
export function streamCuts(sizes, codec, minPartBytes = MIN_PART_BYTES) {
  const N = sizes.reduce((a, b) => a + b, 0);
  const cuts = [N];
  let o = N;
  for (let t = sizes.length - 1; t >= 1; t--) {
    o -= sizes[t];
    const c = Math.min(N, Math.ceil(o / codec.block) * codec.block);
    if (codec.messageBytes(cuts[cuts.length - 1] - c) >= minPartBytes) cuts.push(c);
  }
  if (cuts[cuts.length - 1] > 0) cuts.push(0);
  return cuts;
}

// The parts of a GRAD whose values are [lo, hi) (lo on a block boundary), in send order (the tail
// first): one per non-empty [max(lo, cuts[i+1]), min(hi, cuts[i])). -> [{vlo, vhi, from, to}]:
// values [vlo, vhi), payload bytes [from, to) (the codec message starts at byte 40, after the
// header). The last part also carries the header (from = 0); an empty slice is one part, the header.
export function gradParts(cuts, lo, hi, codec) {
  const at = (v) => HEADER_BYTES + codec.messageBytes(v - lo);
  const parts = [];
  for (let i = 0; i + 1 < cuts.length; i++) {
    const vlo = Math.max(lo, cuts[i + 1]), vhi = Math.min(hi, cuts[i]);
    if (vlo < vhi) parts.push({ vlo, vhi, from: at(vlo), to: at(vhi) });
  }
  if (!parts.length) parts.push({ vlo: lo, vhi: lo, from: 0, to: HEADER_BYTES });
  parts[parts.length - 1].from = 0;
  return parts;
}

// One run's gradient exchange over a Mesh (mesh.js). roster: peer ids in slot order; the frames
// of a step carry the sender's hash after the previous step (the sync guard reads them).
//   const c = new MeshCollective(mesh, { runId, roster, selfId, shapes, deadlineMs, exchange: cfg.exchange, seed: cfg.seed });
//   const { loss, grads, hashes } = await c.exchange(step, roster, slot, loss, grads, prevHash, encoded?);
// (encoded: the trainer's codec message of its whole gradient, the resident step's; else made here)
// or, streamed (the GRAD's parts go out while the backward pass runs; the same bits):
//   const local = await trainer.localStep(step, slot, arena, c.beginStep(step));
//   const out = await c.exchange(step, roster, slot, local.loss, local.grads, prevHash);
// Frames of the run are checked here: run id, sender in the roster at its own slot, step in
// flight (this one or the next), exact length, a message the codec decodes; anything else is
// dropped with a logged reason.
export class MeshCollective {
  // subscribe: false when the caller routes the mesh's GRAD/GRAD_PART/REDUCED frames to onFrame itself
  // (run/controller.js keeps one collective per roster epoch and routes by the frames' run id).
  // exchange, seed: the run's cfg.exchange and cfg.seed (int8's rounding is keyed by the seed)
  // minPartBytes: the streamed GRAD's smallest part (streamCuts; the same on every peer of a run)
  // sha: the SHA-256 of the messages' hashes (the audits' commitments; a backend's gated wasm one)
  constructor(mesh, { runId, roster, selfId, shapes, startStep = 0, deadlineMs = 10_000, topology = null, subscribe = true,
    exchange = 'f64', seed = null, minPartBytes = MIN_PART_BYTES, sha = jsSha, forgeReduced = null, exchangeAt = null }) {
    this.mesh = mesh; this.runId = runId; this.roster = roster.slice(); this.selfId = selfId; this.sha = sha;
    this.shapes = shapes; this.names = shapes.map(([n]) => n);
    this.sizes = shapes.map(([, s]) => s.reduce((x, y) => x * y, 1));
    this.N = this.sizes.reduce((a, b) => a + b, 0);   // = model.paramCount(cfg); only the shapes come here
    this.P = roster.length;
    this.slot = roster.indexOf(selfId);
    if (this.slot < 0) throw new Error('this peer is not in the roster');
    this.codec = codecFor(exchange);
    if (exchange !== 'f64' && !Number.isInteger(seed)) throw new Error(`the ${exchange} exchange needs the run seed`);
    this.seed = seed ?? 0;
    this.topology = topology || topologyFor(this.P);
    this.bounds = this.topology === 'allgather' ? [0, this.N] : this.codec.shardBounds(this.N, this.P);
    this.cuts = streamCuts(this.sizes, this.codec, minPartBytes);
    // the parts of every streamed GRAD to us (all-gather: all N values; rsag: our shard)
    this.inParts = this.gradSliceParts(this.topology === 'allgather' ? 0 : this.slot);
    this.deadlineMs = deadlineMs;
    this.holdUntil = 0;            // performance.now() before which a passed deadline waits on: the server
                                   // is down and peers may be waiting for batches (docs/ARCHITECTURE.md "Server outage")
    this.steps = new Map();        // step -> {grads: Map slot -> decoded Float64Array, losses, hashes, reduced: Map,
                                   //          parts: Map slot -> {payload, got: Set of part indexes} (streamed GRADs),
                                   //          messages: Map slot -> the codec message received, lies: Map slot -> {why, nonFinite},
                                   //          reducedMessages: Map slot -> the REDUCED message received}
    this.stream = null;            // this page's streamed GRAD of the step being computed (beginStep)
    this.current = startStep;      // the step being exchanged (frames of it and the next are accepted)
    this.done = startStep - 1;     // the last step exchanged (its late frames are dropped, not stored)
    this.wake = null;              // resolves the waiting exchange when something arrived
    this.failure = null;           // an ExchangeError that ends every exchange
    this.closed = false;           // close() was called: a streamed GRAD posts no more parts
    this.forgeReduced = forgeReduced; // (step, message) -> message: the fault plan's lying shard owner (tests)
    // step -> whether the run exchanges at it (local steps: every H-th, train.js isExchangeStep); null: every step
    this.exchangeAt = exchangeAt;
    this.onLie = null;             // (slot, step, {why, nonFinite}): told of a cheap check failed on arrival,
                                   // also after the exchange failed (the run convicts: run/audits.js)
    this.bytesSent = 0;            // payload bytes sent (the benchmark reads it)
    this.waitMs = 0;               // time spent waiting for peers' frames
    this.unsub = subscribe ? [TYPES.GRAD, TYPES.GRAD_PART, TYPES.REDUCED].map((t) => mesh.on(t, (from, m) => this.onFrame(from, m))) : [];
  }

  close() { for (const u of this.unsub) u(); this.unsub = []; this.closed = true; }

  // a peer left, a stop arrived, a deadline passed: every pending and later exchange rejects
  fail(err) {
    if (!this.failure) this.failure = err;
    this.wake?.();
  }

  // the values of shard k (all-gather: the one shard, k = 0)
  shardValues(k) { return this.bounds[k + 1] - this.bounds[k]; }

  // the values a GRAD to us carries: all N (all-gather) or our shard (rsag)
  gradValues() { return this.shardValues(this.topology === 'allgather' ? 0 : this.slot); }

  // the parts of a streamed GRAD that carries shard k (all-gather: k = 0, all N values)
  gradSliceParts(k) { return gradParts(this.cuts, this.bounds[k], this.bounds[k + 1], this.codec); }

  onFrame(from, m) {
    const why = this.check(from, m);
    if (why) { this.mesh.drop(from, m, why); return; }
    if (m.type === TYPES.GRAD_PART) { this.onPart(from, m); return; }
    const isGrad = m.type === TYPES.GRAD;
    if (isGrad) { this.onGrad(from, m, m.payload, 'GRAD'); return; }
    let values;
    try {
      values = this.codec.decode(m.payload, this.shardValues(m.slot));
    } catch (err) {
      if (!(err instanceof CodecError)) throw err;
      this.mesh.drop(from, m, `REDUCED refused: ${err.message}`);
      return;
    }
    const st = this.stepState(m.step);
    st.reduced.set(m.slot, values);
    st.reducedMessages.set(m.slot, m.payload);
    this.wake?.();
  }

  // a whole GRAD payload (a GRAD, or the parts of a streamed one put together): header, then message
  onGrad(from, m, payload, what) {
    let values;
    const st = this.stepState(m.step);
    try {
      values = this.codec.decode(payload.subarray(HEADER_BYTES), this.gradValues());
    } catch (err) {
      if (!(err instanceof CodecError)) throw err;
      this.noteLie(m.step, m.slot, `is malformed (${err.message})`);
      this.mesh.drop(from, m, `${what} refused: ${err.message}`);
      return;
    }
    const dv = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
    st.hashes[m.slot] = bytesToHex(payload.subarray(0, HASH_BYTES));
    st.losses[m.slot] = dv.getFloat64(HASH_BYTES, true);
    // the cheap checks (docs/VERIFICATION.md §13): the values are kept; onLie judges
    if (!Number.isFinite(st.losses[m.slot])) this.noteLie(m.step, m.slot, 'has a loss that is not finite', true);
    else if (!allFinite(values)) this.noteLie(m.step, m.slot, 'is not finite', true);
    st.messages.set(m.slot, payload.subarray(HEADER_BYTES));
    st.grads.set(m.slot, values);
    st.parts.delete(m.slot);
    this.wake?.();
  }

  // a GRAD_PART (checked): its bytes go where its index says; the last one completes the GRAD
  onPart(from, m) {
    const st = this.stepState(m.step);
    const index = new DataView(m.payload.buffer, m.payload.byteOffset, m.payload.byteLength).getUint32(0, true);
    const part = this.inParts[index];
    let pending = st.parts.get(m.slot);
    if (!pending) {
      pending = { payload: new Uint8Array(HEADER_BYTES + this.codec.messageBytes(this.gradValues())), got: new Set() };
      st.parts.set(m.slot, pending);
    }
    pending.payload.set(m.payload.subarray(PART_INDEX_BYTES), part.from);
    pending.got.add(index);
    if (pending.got.size === this.inParts.length) this.onGrad(from, m, pending.payload, `GRAD (${this.inParts.length} parts)`);
  }

  // a peer's gradient of the step failed a cheap check: onLie is told (once per slot and step).
  // nonFinite: a lie only when our own gradient is finite (an honest run that diverged tells none)
  noteLie(step, slot, why, nonFinite = false) {
    const st = this.stepState(step);
    if (st.lies.has(slot)) return;
    st.lies.set(slot, { why, nonFinite });
    this.onLie?.(slot, step, { why, nonFinite });
    this.wake?.();
  }

  // the exchange after the one of step s (frames of the step being exchanged and of this one are
  // accepted): s + 1, or with local steps the next step the run exchanges at (at most 64 on)
  nextExchange(s) {
    if (!this.exchangeAt) return s + 1;
    let e = s + 1;
    while (!this.exchangeAt(e) && e < s + 64) e++;
    return e;
  }

  check(from, m) {
    if (m.runId !== this.runId) return `wrong run id ${m.runId} (this run is ${this.runId})`;
    const slot = this.roster.indexOf(from);
    if (slot < 0) return 'sender is not in the run\'s roster';
    if (m.slot !== slot) return `slot ${m.slot} claimed by the peer of slot ${slot}`;
    const cur = this.current, next = this.nextExchange(cur);
    if (m.step <= this.done || m.step < cur || m.step > next || (m.step !== cur && m.step !== next)) return `step ${m.step} is not in flight (expecting ${cur} or ${next})`;
    const st = this.steps.get(m.step);
    if (m.type === TYPES.GRAD) {
      const want = HEADER_BYTES + this.codec.messageBytes(this.gradValues());
      if (m.payload.length !== want) { this.noteLie(m.step, slot, `is ${m.payload.length - HEADER_BYTES} bytes where ${want - HEADER_BYTES} are due`); return `GRAD of ${m.payload.length} bytes, expected ${want}`; }
      if (st && st.grads.has(slot)) return `second GRAD from slot ${slot} for step ${m.step}`;
    } else if (m.type === TYPES.GRAD_PART) {
      if (m.payload.length < PART_INDEX_BYTES) return `GRAD_PART of ${m.payload.length} bytes, shorter than its index`;
      const index = new DataView(m.payload.buffer, m.payload.byteOffset, m.payload.byteLength).getUint32(0, true);
      const part = this.inParts[index];
      if (!part) return `GRAD_PART index ${index}, a GRAD here has ${this.inParts.length} parts`;
      const want = PART_INDEX_BYTES + part.to - part.from;
      if (m.payload.length !== want) { this.noteLie(m.step, slot, `has a part of ${m.payload.length - PART_INDEX_BYTES} bytes where ${want - PART_INDEX_BYTES} are due`); return `GRAD_PART ${index} of ${m.payload.length} bytes, expected ${want}`; }
      if (st && st.grads.has(slot)) return `GRAD_PART ${index} from slot ${slot} for step ${m.step}, whose GRAD is complete`;
      if (st && st.parts.get(slot)?.got.has(index)) return `second GRAD_PART ${index} from slot ${slot} for step ${m.step}`;
    } else {
      if (this.topology !== 'rsag') return 'REDUCED in an all-gather run';
      const want = this.codec.messageBytes(this.shardValues(slot));
      if (m.payload.length !== want) return `REDUCED of ${m.payload.length} bytes, expected ${want}`;
      if (st && st.reduced.has(slot)) return `second REDUCED from slot ${slot} for step ${m.step}`;
    }
    return null;
  }

  // the largest payload a frame of this run may carry (the mesh checks it before allocating)
  maxPayload(type) {
    if (type === TYPES.GRAD) return HEADER_BYTES + this.codec.messageBytes(this.gradValues());
    if (type === TYPES.GRAD_PART) return PART_INDEX_BYTES + Math.max(...this.inParts.map((p) => p.to - p.from));
    if (type === TYPES.REDUCED) return Math.max(...this.bounds.slice(1).map((b, k) => this.codec.messageBytes(b - this.bounds[k])));
    return 0;
  }

  stepState(step) {
    let st = this.steps.get(step);
    if (!st) {
      st = { grads: new Map(), losses: new Array(this.P), hashes: new Array(this.P), reduced: new Map(), parts: new Map(),
             messages: new Map(), lies: new Map(), reducedMessages: new Map() };
      this.steps.set(step, st);
    }
    return st;
  }

  // [previous hash][loss f64 LE][message]
  gradPayload(prevHash, loss, message) {
    const payload = new Uint8Array(HEADER_BYTES + message.length);
    payload.set(hexToBytes(prevHash), 0);
    new DataView(payload.buffer).setFloat64(HASH_BYTES, loss, true);
    payload.set(message, HEADER_BYTES);
    return payload;
  }

  // a link that is gone or closes mid-message is a departure of that peer (an ExchangeError)
  async send(to, type, step, payload) {
    this.bytesSent += payload.length;
    try {
      await this.mesh.send(to, { type, slot: this.slot, runId: this.runId, step, payload });
    } catch (err) {
      throw new ExchangeError(`could not send to ${to}: ${err.message || err}`, { peer: to, step });
    }
  }

  // wait until ready() is true; rejects on failure or when no frame arrived for deadlineMs
  async waitFor(step, ready, what) {
    const t0 = performance.now();
    try {
      while (!ready()) {
        if (this.failure) throw this.failure;
        const arrived = await new Promise((resolve) => {
          const timer = setTimeout(() => resolve(false), this.deadlineMs);
          this.wake = () => { clearTimeout(timer); resolve(true); };
        });
        this.wake = null;
        if (this.failure) throw this.failure;
        if (!arrived && !ready() && performance.now() >= this.holdUntil) {
          const missing = what();
          throw new ExchangeError(`no ${missing.kind} from ${missing.peers.join(', ')} for step ${step + 1} within ${this.deadlineMs / 1000} s`,
            { peer: missing.peers[0], step });
        }
      }
    } finally {
      this.waitMs += performance.now() - t0;
    }
  }

  // Streams this page's GRAD of `step` while its backward pass runs: -> a sink for
  // Trainer.localStep(step, slot, arena, sink), told of each gradient as it becomes final
  // (model.js backward). Every part whose values are all final is encoded and sent at once
  // (GRAD_PART, in part order); the last part, which carries the header (previous hash, loss),
  // goes when exchange(step, ...) is called, and the exchange then waits as without a stream.
  // The same step begun again (the local step recomputed) keeps what was sent: the same bytes.
  beginStep(step) {
    if (this.stream?.step !== step) this.stream = new GradStream(this, step);
    return this.stream;
  }

  // our GRAD(s), whole -> our codec messages in message order (all-gather: one; rsag: shard k's for
  // slot k); encoded: our whole gradient's message when the trainer made it (cut, not encoded)
  async sendWhole(step, grads, loss, prevHash, encoded = null) {
    const { codec, seed, slot } = this;
    const b = this.bounds;
    const flat = encoded ? null : flattenGrads(grads, this.names);
    const encode = (k) => (encoded ? codec.sliceMessage(encoded, this.N, b[k], b[k + 1]) : codec.encode(flat.subarray(b[k], b[k + 1]), { seed, step, slot, offset: b[k] }));
    const others = this.roster.map((id, s) => [id, s]).filter(([, s]) => s !== slot);
    if (this.topology === 'allgather') {
      const message = encode(0);
      const payload = this.gradPayload(prevHash, loss, message);
      await Promise.all(others.map(([id]) => this.send(id, TYPES.GRAD, step, payload)));
      return [message];
    }
    const messages = this.roster.map((_, k) => encode(k));
    await Promise.all(others.map(([id, s]) => this.send(id, TYPES.GRAD, step, this.gradPayload(prevHash, loss, messages[s]))));
    return messages;
  }

  // -> {loss, grads (named views of the reduced gradient G), flat: G (N,), hashes: each slot's
  //    hash after step-1, losses: each slot's loss, ownHashes: SHA-256 (hex) of each message we sent
  //    (message order; the commitment), inHashes: each slot's message to us, hashed (ours: ours),
  //    rsag only (else null): transcript: the P messages of our shard (slot order), reduced: each
  //    owner's REDUCED message (slot order, ours included)}.
  //    After beginStep(step) our GRAD's last part is sent here (the rest went during the backward
  //    pass), else the whole GRAD. A peer's gradient that fails a cheap check is told to onLie
  //    (the run convicts its sender, which ends this exchange); the collective itself only drops it.
  async exchange(step, roster, slot, loss, grads, prevHash = null, encoded = null) {
    if (this.failure) throw this.failure;
    if (slot !== this.slot || roster.length !== this.P) throw new Error('a collective serves one roster: a new roster needs a new collective');
    this.current = step;
    const st = this.stepState(step);
    st.losses[slot] = loss;
    st.hashes[slot] = prevHash;
    const stream = this.stream?.step === step ? this.stream : null;
    this.stream = null;
    const others = this.roster.map((id, s) => [id, s]).filter(([, s]) => s !== slot);
    const missingFrom = (has, kind) => () => ({ kind, peers: others.filter(([, s]) => !has(s)).map(([id]) => id) });
    const { codec, seed } = this;
    const b = this.bounds;
    const ownMessages = stream ? await stream.finish(grads, loss, prevHash, encoded) : await this.sendWhole(step, grads, loss, prevHash, encoded);
    const ownMessage = ownMessages.length === 1 ? ownMessages[0] : ownMessages[slot];
    let G, rsag = null;
    if (this.topology === 'allgather') {
      const has = (s) => st.grads.has(s);
      await this.waitFor(step, () => others.every(([, s]) => has(s)), missingFrom(has, 'gradient'));
      const own = codec.decode(ownMessage, this.N);
      G = codec.reduce(this.roster.map((_, s) => (s === slot ? own : st.grads.get(s))), { seed, step, offset: 0 });
    } else {
      const hasGrad = (s) => st.grads.has(s);
      await this.waitFor(step, () => others.every(([, s]) => hasGrad(s)), missingFrom(hasGrad, 'gradient shard'));
      const n = b[slot + 1] - b[slot];
      const own = codec.decode(ownMessage, n);
      let reducedMessage = codec.reduceMessage(this.roster.map((_, s) => (s === slot ? own : st.grads.get(s))), { seed, step, offset: b[slot] });
      if (this.forgeReduced) reducedMessage = this.forgeReduced(step, reducedMessage);
      await Promise.all(others.map(([id]) => this.send(id, TYPES.REDUCED, step, reducedMessage)));
      const hasReduced = (s) => st.reduced.has(s);
      await this.waitFor(step, () => others.every(([, s]) => hasReduced(s)), missingFrom(hasReduced, 'reduced shard'));
      G = new Float64Array(this.N);
      for (let s = 0; s < this.P; s++) G.set(s === slot ? codec.decode(reducedMessage, n) : st.reduced.get(s), b[s]);
      // what an audit of a shard owner needs (run/audits.js): ours as owner, and every owner's REDUCED
      rsag = { transcript: this.roster.map((_, s) => (s === slot ? ownMessage : st.messages.get(s))),
               reduced: this.roster.map((_, s) => (s === slot ? reducedMessage : st.reducedMessages.get(s))) };
    }
    // the messages' hashes only when read (an audited run's commitments: run/commitments.js); a run
    // without audits pays no SHA-256 of every message (~4 ms per step at the largest settings)
    const hashOf = (bytes) => this.sha.hexOf([bytes]);
    const messages = st.messages;
    let ownHashes = null, inHashes = null;
    const own = () => (ownHashes ??= ownMessages.map(hashOf));
    const received = () => (inHashes ??= this.roster.map((_, s) => (s === slot ? own()[ownMessages.length === 1 ? 0 : slot] : hashOf(messages.get(s)))));
    const out = { loss: reduceLosses(st.losses), grads: unflatten(G, this.shapes), flat: G, hashes: st.hashes.slice(),
                  losses: st.losses.slice(), get ownHashes() { return own(); }, get inHashes() { return received(); },
                  transcript: rsag?.transcript ?? null, reduced: rsag?.reduced ?? null };
    this.steps.delete(step);
    this.done = step;
    return out;
  }

}

// ---- GradStream: one step's GRAD, sent in parts as the backward pass finalizes it ------------


// The slices this page encodes (all-gather: all N values, to every other peer; rsag: shard k to
// the peer of slot k, ours kept), each as the whole GRAD payload it would send, filled part by part.
class GradStream {
  constructor(c, step) {
    this.c = c; this.step = step;
    this.flat = new Float64Array(c.N);             // the gradient values delivered so far, canonical order
    this.offsets = [];
    let o = 0;
    for (const n of c.sizes) { this.offsets.push(o); o += n; }
    this.index = new Map(c.names.map((name, t) => [name, t]));
    this.final = new Uint8Array(c.sizes.length);   // tensor t delivered
    this.frontier = c.sizes.length;                // tensors [frontier, T) delivered: values [offsets[frontier], N) final
    const others = c.roster.filter((_, s) => s !== c.slot);
    const shards = c.topology === 'allgather' ? [0] : c.roster.map((_, k) => k);
    this.slices = shards.map((k) => ({
      k, lo: c.bounds[k], to: c.topology === 'allgather' ? others : (k === c.slot ? [] : [c.roster[k]]),
      parts: c.gradSliceParts(k), next: 0,
      payload: new Uint8Array(HEADER_BYTES + c.codec.messageBytes(c.bounds[k + 1] - c.bounds[k])),
    }));
    this.chains = new Map(others.map((id) => [id, Promise.resolve()]));   // each receiver's parts, in order
    this.error = null;                             // the first failed send (an ExchangeError), thrown by finish
    this.encoded = null;                           // the trainer's message of the whole gradient (finish), or null
  }

  // the sink: the gradient of `name` is final (values are copied: the caller's arrays stay its own)
  // -> a promise of one event-loop turn when parts were posted (backward waits for it), else null
  grad(name, values) {
    const t = this.index.get(name);
    if (t === undefined) throw new Error(`the streamed exchange has no parameter ${name}`);
    if (values.length !== this.c.sizes[t]) throw new Error(`the gradient of ${name} has ${values.length} values, expected ${this.c.sizes[t]}`);
    this.flat.set(values, this.offsets[t]);
    this.final[t] = 1;
    while (this.frontier > 0 && this.final[this.frontier - 1]) this.frontier--;
    const posted = this.pump(this.frontier === this.final.length ? this.c.N : this.offsets[this.frontier], false);
    // one turn of the event loop: the frames' digests (WebCrypto answers in a later task) and the
    // link's sends of the parts posted so far progress there; a CPU backward never yields otherwise
    return posted ? yieldToPage() : null;
  }

  // encode and send every part not yet sent whose values [vlo, vhi) are final (vlo >= ready); the
  // last part (the header's) only when `all`. -> how many frames were posted
  pump(ready, all) {
    const { codec, seed, slot } = this.c;
    let posted = 0;
    for (const sl of this.slices) {
      while (sl.next < sl.parts.length - (all ? 0 : 1) && sl.parts[sl.next].vlo >= ready) {
        const index = sl.next++, part = sl.parts[index];
        if (part.vhi > part.vlo) {
          const message = this.encoded ? codec.sliceMessage(this.encoded, this.c.N, part.vlo, part.vhi)
            : codec.encode(this.flat.subarray(part.vlo, part.vhi), { seed, step: this.step, slot, offset: part.vlo });
          sl.payload.set(message, HEADER_BYTES + codec.messageBytes(part.vlo - sl.lo));
        }
        if (!sl.to.length) continue;
        const frame = new Uint8Array(PART_INDEX_BYTES + part.to - part.from);
        new DataView(frame.buffer).setUint32(0, index, true);
        frame.set(sl.payload.subarray(part.from, part.to), PART_INDEX_BYTES);
        for (const id of sl.to) this.post(id, frame);
        posted += sl.to.length;
      }
    }
    return posted;
  }

  // after the receiver's earlier parts; a failed send is kept for finish (nothing rejects unheard).
  // A collective that failed or closed (a departure, the run's end) posts nothing more.
  post(id, frame) {
    if (this.c.failure || this.c.closed) return;
    const chain = this.chains.get(id).then(() => (this.error ? null : this.c.send(id, TYPES.GRAD_PART, this.step, frame)))
      .catch((err) => { this.error ||= err; });
    this.chains.set(id, chain);
  }

  // exchange's part: the step's gradients must be those streamed (bit for bit; a missing one is
  // taken from grads), then the header and the last parts go -> our codec messages (as sendWhole;
  // encoded: the whole gradient's message when the trainer made it, its parts cut from it)
  async finish(grads, loss, prevHash, encoded = null) {
    this.encoded = encoded;
    const { names, sizes } = this.c;
    for (let t = 0; t < names.length; t++) {
      const g = grads[names[t]], at = this.offsets[t];
      if (!g || g.length !== sizes[t]) throw new Error(`the step's gradient of ${names[t]} is missing or of the wrong size`);
      if (!this.final[t]) { this.flat.set(g, at); continue; }
      const a = new Uint32Array(this.flat.buffer, 8 * at, 2 * sizes[t]);
      const b = new Uint32Array(g.buffer, g.byteOffset, 2 * sizes[t]);
      for (let i = 0; i < a.length; i++) {
        if (a[i] !== b[i]) throw new Error(`the streamed gradient of ${names[t]} differs from the step's at value ${i >> 1}: its parts were sent`);
      }
    }
    const header = this.c.gradPayload(prevHash, loss, new Uint8Array(0));
    for (const sl of this.slices) sl.payload.set(header, 0);
    this.pump(0, true);
    await Promise.all(this.chains.values());
    if (this.error) throw this.error;
    return this.slices.map((sl) => sl.payload.subarray(HEADER_BYTES));
  }
}
