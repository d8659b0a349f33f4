// MeshCollective: the collective seam of collective.js over a Mesh (mesh.js): one replica per
// page, its gradient sent to the other pages in the run's topology (collective.js explains both),
// as messages of the run's exchange codec (exchange_codec.js; docs/PROTOCOL.md "GRAD and REDUCED
// payloads"). G is codecReduce's (collective.js): the same bits as the Group's.
import { reduceLosses } from '../reduce.js';
import { flattenGrads, unflatten, topologyFor } from '../collective.js';
import { codecFor, CodecError } from '../exchange_codec.js';
import { TYPES } from './frames.js';

// ---- MeshCollective -------------------------------------------------------------------------

export class ExchangeError extends Error {
  constructor(message, { peer = null, step = null } = {}) { super(message); this.name = 'ExchangeError'; this.peer = peer; this.step = step; }
}

const HASH_BYTES = 32;
const HEADER_BYTES = HASH_BYTES + 8;     // a GRAD: the sender's previous hash, its loss (f64 LE), then the codec message
const hexToBytes = (hex) => {
  const out = new Uint8Array(HASH_BYTES);
  if (hex) for (let i = 0; i < HASH_BYTES; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
};
const bytesToHex = (b) => (b.every((x) => x === 0) ? null : Array.from(b, (x) => x.toString(16).padStart(2, '0')).join(''));

// One run's gradient exchange over a Mesh (mesh.js). roster: peer ids in slot order; the frames
// of a step carry the sender's hash after the previous step (the sync guard reads them).
//   const c = new MeshCollective(mesh, { runId, roster, selfId, shapes, deadlineMs, exchange: cfg.exchange, seed: cfg.seed });
//   const { loss, grads, hashes } = await c.exchange(step, roster, slot, loss, grads, prevHash);
// Frames of the run are checked here: run id, sender in the roster at its own slot, step in
// flight (this one or the next), exact length, a message the codec decodes; anything else is
// dropped with a logged reason.
export class MeshCollective {
  // subscribe: false when the caller routes the mesh's GRAD/REDUCED frames to onFrame itself
  // (run.js keeps one collective per roster epoch and routes by the frames' run id).
  // exchange, seed: the run's cfg.exchange and cfg.seed (int8's rounding is keyed by the seed)
  constructor(mesh, { runId, roster, selfId, shapes, startStep = 0, deadlineMs = 10_000, topology = null, subscribe = true,
    exchange = 'f64', seed = null }) {
    this.mesh = mesh; this.runId = runId; this.roster = roster.slice(); this.selfId = selfId;
    this.shapes = shapes; this.names = shapes.map(([n]) => n);
    this.N = shapes.reduce((n, [, s]) => n + s.reduce((x, y) => x * y, 1), 0);
    this.P = roster.length;
    this.slot = roster.indexOf(selfId);
    if (this.slot < 0) throw new Error('this peer is not in the roster');
    this.codec = codecFor(exchange);
    if (exchange !== 'f64' && !Number.isInteger(seed)) throw new Error(`the ${exchange} exchange needs the run seed`);
    this.seed = seed ?? 0;
    this.topology = topology || topologyFor(this.P);
    this.bounds = this.topology === 'allgather' ? [0, this.N] : this.codec.shardBounds(this.N, this.P);
    this.deadlineMs = deadlineMs;
    this.holdUntil = 0;            // performance.now() before which a passed deadline waits on: the server
                                   // is down and peers may be waiting for batches (docs/ARCHITECTURE.md "Server outage")
    this.steps = new Map();        // step -> {grads: Map slot -> decoded Float64Array, losses, hashes, reduced: Map}
    this.current = startStep;      // the step being exchanged (frames of it and the next are accepted)
    this.done = startStep - 1;     // the last step exchanged (its late frames are dropped, not stored)
    this.wake = null;              // resolves the waiting exchange when something arrived
    this.failure = null;           // an ExchangeError that ends every exchange
    this.bytesSent = 0;            // payload bytes sent (the benchmark reads it)
    this.waitMs = 0;               // time spent waiting for peers' frames
    this.unsub = subscribe ? [mesh.on(TYPES.GRAD, (from, m) => this.onFrame(from, m)),
                              mesh.on(TYPES.REDUCED, (from, m) => this.onFrame(from, m))] : [];
  }

  close() { for (const u of this.unsub) u(); this.unsub = []; }

  // a peer left, a stop arrived, a deadline passed: every pending and later exchange rejects
  fail(err) {
    if (!this.failure) this.failure = err;
    this.wake?.();
  }

  // the values of shard k (all-gather: the one shard, k = 0)
  shardValues(k) { return this.bounds[k + 1] - this.bounds[k]; }

  // the values a GRAD to us carries: all N (all-gather) or our shard (rsag)
  gradValues() { return this.shardValues(this.topology === 'allgather' ? 0 : this.slot); }

  onFrame(from, m) {
    const why = this.check(from, m);
    if (why) { this.mesh.drop(from, m, why); return; }
    const isGrad = m.type === TYPES.GRAD;
    let values;
    try {
      values = isGrad ? this.codec.decode(m.payload.subarray(HEADER_BYTES), this.gradValues())
        : this.codec.decode(m.payload, this.shardValues(m.slot));
    } catch (err) {
      if (!(err instanceof CodecError)) throw err;
      this.mesh.drop(from, m, `${isGrad ? 'GRAD' : 'REDUCED'} refused: ${err.message}`);
      return;
    }
    const st = this.stepState(m.step);
    if (isGrad) {
      const dv = new DataView(m.payload.buffer, m.payload.byteOffset, m.payload.byteLength);
      st.hashes[m.slot] = bytesToHex(m.payload.subarray(0, HASH_BYTES));
      st.losses[m.slot] = dv.getFloat64(HASH_BYTES, true);
      st.grads.set(m.slot, values);
    } else {
      st.reduced.set(m.slot, values);
    }
    this.wake?.();
  }

  check(from, m) {
    if (m.runId !== this.runId) return `wrong run id ${m.runId} (this run is ${this.runId})`;
    const slot = this.roster.indexOf(from);
    if (slot < 0) return 'sender is not in the run\'s roster';
    if (m.slot !== slot) return `slot ${m.slot} claimed by the peer of slot ${slot}`;
    const cur = this.current;
    if (m.step <= this.done || m.step < cur || m.step > cur + 1) return `step ${m.step} is not in flight (expecting ${cur} or ${cur + 1})`;
    const st = this.steps.get(m.step);
    if (m.type === TYPES.GRAD) {
      const want = HEADER_BYTES + this.codec.messageBytes(this.gradValues());
      if (m.payload.length !== want) return `GRAD of ${m.payload.length} bytes, expected ${want}`;
      if (st && st.grads.has(slot)) return `second GRAD from slot ${slot} for step ${m.step}`;
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
    if (type === TYPES.REDUCED) return Math.max(...this.bounds.slice(1).map((b, k) => this.codec.messageBytes(b - this.bounds[k])));
    return 0;
  }

  stepState(step) {
    let st = this.steps.get(step);
    if (!st) {
      st = { grads: new Map(), losses: new Array(this.P), hashes: new Array(this.P), reduced: new Map() };
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

  // -> {loss, grads (named views of the reduced gradient G), flat: G (N,), hashes: each slot's
  //    hash after step-1}
  async exchange(step, roster, slot, loss, grads, prevHash = null) {
    if (this.failure) throw this.failure;
    if (slot !== this.slot || roster.length !== this.P) throw new Error('a collective serves one roster: a new roster needs a new collective');
    this.current = step;
    const st = this.stepState(step);
    st.losses[slot] = loss;
    st.hashes[slot] = prevHash;
    const flat = flattenGrads(grads, this.names);
    const others = this.roster.map((id, s) => [id, s]).filter(([, s]) => s !== slot);
    const missingFrom = (has, kind) => () => ({ kind, peers: others.filter(([, s]) => !has(s)).map(([id]) => id) });
    const { codec, seed } = this;
    const b = this.bounds;
    // this slot's message of values [lo, hi), and what every receiver decodes from it
    const encode = (lo, hi) => codec.encode(flat.subarray(lo, hi), { seed, step, slot, offset: lo });
    let G;
    if (this.topology === 'allgather') {
      const message = encode(0, this.N);
      const payload = this.gradPayload(prevHash, loss, message);
      await Promise.all(others.map(([id]) => this.send(id, TYPES.GRAD, step, payload)));
      const has = (s) => st.grads.has(s);
      await this.waitFor(step, () => others.every(([, s]) => has(s)), missingFrom(has, 'gradient'));
      const own = codec.decode(message, this.N);
      G = codec.reduce(this.roster.map((_, s) => (s === slot ? own : st.grads.get(s))), { seed, step, offset: 0 });
    } else {
      await Promise.all(others.map(([id, s]) => this.send(id, TYPES.GRAD, step, this.gradPayload(prevHash, loss, encode(b[s], b[s + 1])))));
      const hasGrad = (s) => st.grads.has(s);
      await this.waitFor(step, () => others.every(([, s]) => hasGrad(s)), missingFrom(hasGrad, 'gradient shard'));
      const n = b[slot + 1] - b[slot];
      const own = codec.decode(encode(b[slot], b[slot + 1]), n);
      const reducedMessage = codec.reduceMessage(this.roster.map((_, s) => (s === slot ? own : st.grads.get(s))), { seed, step, offset: b[slot] });
      await Promise.all(others.map(([id]) => this.send(id, TYPES.REDUCED, step, reducedMessage)));
      const hasReduced = (s) => st.reduced.has(s);
      await this.waitFor(step, () => others.every(([, s]) => hasReduced(s)), missingFrom(hasReduced, 'reduced shard'));
      G = new Float64Array(this.N);
      for (let s = 0; s < this.P; s++) G.set(s === slot ? codec.decode(reducedMessage, n) : st.reduced.get(s), b[s]);
    }
    const out = { loss: reduceLosses(st.losses), grads: unflatten(G, this.shapes), flat: G, hashes: st.hashes.slice() };
    this.steps.delete(step);
    this.done = step;
    return out;
  }
}

