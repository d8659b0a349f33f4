// The group's connections and frames. One Mesh per page: a link per remote peer (an
// RtcPeer of rtc_peer.js in the page; an in-memory link in Node tests), messages cut into frames
// (frames.js) on the way out and reassembled, digest-checked and dispatched by type on the way in.
//
//   const mesh = new Mesh({ selfId });
//   mesh.addLink(peerId, link);        link: {send(bytes) -> Promise, maxFrame, close(reason)}
//   mesh.receive(peerId, bytes);       the link's incoming frames
//   const off = mesh.on(TYPES.GRAD, (from, message) => ...);
//   await mesh.send(peerId, {type, slot, runId, step, payload});
//
// A peer's frames are handled one after another in arrival order (a message is dispatched only
// after every earlier one of that peer). Nothing from a peer is trusted: a frame that fails a
// check is dropped with a reason (drop log, `drop` listeners); so is a valid frame that serves
// nothing (a repeated HELLO, a message abandoned unfinished: frames.js Reassembler); a peer that
// keeps sending such frames (MAX_BAD_FRAMES within BAD_WINDOW_MS) is disconnected. An unfinished
// message holds only the bytes received, and only until it stalls: a timer per link abandons one
// with no new chunk for PARTIAL_TIMEOUT_MS (docs/PROTOCOL.md "Mesh limits").
// Frames of something that just ended on this device (a run stopped while a peer's gradient was
// on its way: its lanes still deliver it) are expected: a limit may say so (a Stale), and they are
// dropped without counting as bad, up to that thing's own sizes per link (Stale.budget bytes on the
// wire: each frame costs its header too, so a flood of empty frames ends as soon as a real one).
import { FrameError, HEADER_BYTES, JSON_TYPES, MAX_JSON_BYTES, PROTOCOL_VERSION, Reassembler, TYPES,
  createFrameSha, encodeMessage, jsonPayload, typeName, upgradingSha } from './frames.js';

export const MAX_BAD_FRAMES = 200;
export const BAD_WINDOW_MS = 10_000;
const DROP_LOG = 50;              // recent drop lines kept for the panel and tests

// The mesh's clock: now() in ms, and after(ms, fn) -> cancel, a deadline timer (late in a hidden
// page, which only lengthens what a stalled message holds). Node: unref'd, so a pending deadline
// never keeps a process alive. Tests pass a clock they advance themselves.
export const SYSTEM_CLOCK = Object.freeze({
  now: () => Date.now(),
  after(ms, fn) {
    const timer = setTimeout(fn, ms);
    timer?.unref?.();
    return () => clearTimeout(timer);
  },
});

// What a limit function returns for a frame of something that just ended: why, which thing
// (key: the budget starts over for another), and the bytes a link may still send of it (frames,
// headers included)
export class Stale {
  constructor(reason, key, budget) { this.reason = reason; this.key = key; this.budget = budget; }
}

export class Mesh {
  // sha: the frames' SHA-256 (hashing.js's sha); by default made once for this mesh (frames.js
  // createFrameSha: WebCrypto when it passes its gate, else the JS one; the JS one until then)
  constructor({ selfId, version = PROTOCOL_VERSION, sha = null, clock = SYSTEM_CLOCK } = {}) {
    this.selfId = selfId;
    this.version = version;
    this.clock = clock;
    this.sha = sha || upgradingSha(createFrameSha);
    this.links = new Map();        // peerId -> {link, reasm, chain, hello, bad: [], expiry: cancel or null}
    this.handlers = new Map();     // type -> Set of (from, message) => void
    this.limits = new Map();       // type -> (header) => max payload bytes, or a string (why refused)
    this.listeners = new Map();    // 'drop' | 'link' -> Set
    this.msgId = 1;
    this.drops = { count: 0, recent: [], stale: 0 };   // stale: frames of what just ended, dropped uncounted
    this.faultNext = null;         // tests: {type, kind: 'cut' | 'tamper'} applied to the next message of that type
  }

  // ---- events -------------------------------------------------------------------------------
  on(type, fn) {
    const map = typeof type === 'number' ? this.handlers : this.listeners;
    if (!map.has(type)) map.set(type, new Set());
    map.get(type).add(fn);
    return () => map.get(type)?.delete(fn);
  }

  emit(event, payload) {
    for (const fn of [...(this.listeners.get(event) || [])]) {
      try { fn(payload); } catch (err) { console.warn(`daisy mesh: a '${event}' listener failed:`, err); }
    }
  }

  // what a message of `type` may weigh: a number of bytes, or a function (header) -> number|string
  setLimit(type, limit) {
    if (limit === null) this.limits.delete(type);
    else this.limits.set(type, typeof limit === 'function' ? limit : () => limit);
  }

  // entry: the link's; a Stale within its budget throws a FrameError marked stale (dropped
  // uncounted), past it the frame is refused as any other
  limitFor(h, entry) {
    if (JSON_TYPES.has(h.type)) return MAX_JSON_BYTES;
    const f = this.limits.get(h.type);
    const limit = f ? f(h) : `${typeName(h.type)} while no run expects it`;
    if (!(limit instanceof Stale)) return limit;
    if (entry.stale.key !== limit.key) entry.stale = { key: limit.key, bytes: 0 };
    entry.stale.bytes += HEADER_BYTES + h.data.length;
    if (entry.stale.bytes > limit.budget) return `${limit.reason} (over ${limit.budget} bytes of it)`;
    const err = new FrameError(limit.reason);
    err.stale = true;
    throw err;
  }

  // ---- links --------------------------------------------------------------------------------
  addLink(peerId, link) {
    this.removeLink(peerId, 'replaced');
    const onProgress = (h, bytes) => this.emit('progress', { peer: peerId, type: h.type, bytes, length: h.length });
    const onAbandon = (h, reason) => this.drop(peerId, h, reason);
    const entry = { link, reasm: null, chain: Promise.resolve(), hello: null, bad: [], expiry: null, stale: { key: null, bytes: 0 } };
    entry.reasm = new Reassembler({ limitFor: (h) => this.limitFor(h, entry), onProgress, onAbandon, sha: this.sha,
      now: () => this.clock.now() });
    this.links.set(peerId, entry);
    this.send(peerId, { type: TYPES.HELLO, payload: jsonPayload({ protocol: this.version, peerId: this.selfId }) })
      .catch(() => {});
  }

  removeLink(peerId, reason) {
    const entry = this.links.get(peerId);
    if (!entry) return;
    this.links.delete(peerId);
    entry.expiry?.();
    try { entry.link.close(reason); } catch { /* already closed */ }
    this.emit('link', { peer: peerId, state: 'closed', reason });
  }

  // peers whose link is up and whose HELLO matched our protocol
  readyPeers() {
    return [...this.links.entries()].filter(([, e]) => e.hello).map(([id]) => id);
  }

  isReady(peerId) { return Boolean(this.links.get(peerId)?.hello); }

  // ---- out ----------------------------------------------------------------------------------
  async send(peerId, { type, slot, runId, step, payload }) {
    const entry = this.links.get(peerId);
    if (!entry) throw new Error(`no link to ${peerId}`);
    let chunks = await encodeMessage({ type, slot, runId, step, payload, version: this.version }, this.msgId++, entry.link.maxFrame, this.sha);
    const fault = this.faultNext;
    if (fault && fault.type === type) {           // test hook: a transfer cut short or tampered in transit
      this.faultNext = null;
      if (fault.kind === 'cut') chunks = chunks.slice(0, Math.max(1, chunks.length >> 1)).slice(0, chunks.length - 1);
      else { const last = chunks[chunks.length - 1]; last[last.length - 1] ^= 0x01; }
    }
    for (const c of chunks) await entry.link.send(c);
  }

  sendJson(peerId, type, obj, fields = {}) {
    return this.send(peerId, { ...fields, type, payload: jsonPayload(obj) });
  }

  // ---- in -----------------------------------------------------------------------------------
  receive(peerId, bytes) {
    const entry = this.links.get(peerId);
    if (!entry) return;
    entry.chain = entry.chain.then(() => this.handleFrame(peerId, entry, bytes)).then(() => this.watchPartials(peerId, entry));
  }

  // One deadline per link, at its stalest unfinished message's expiry: then, in the link's frame
  // order, the Reassembler abandons what stalled (each a bad frame, drop) and the next deadline is set.
  watchPartials(peerId, entry) {
    if (entry.expiry || this.links.get(peerId) !== entry) return;
    const at = entry.reasm.nextExpiry();
    if (at === null) return;
    entry.expiry = this.clock.after(Math.max(0, at - this.clock.now()), () => {
      entry.expiry = null;
      entry.chain = entry.chain.then(() => {
        if (this.links.get(peerId) !== entry) return;
        entry.reasm.expire();
        this.watchPartials(peerId, entry);
      });
    });
  }

  async handleFrame(peerId, entry, bytes) {
    if (this.links.get(peerId) !== entry) return;      // the link was replaced or closed
    let done;
    try {
      done = await entry.reasm.accept(bytes);
    } catch (err) {
      if (!(err instanceof FrameError)) throw err;
      if (err.stale) { this.dropStale(); return; }
      if (err.version !== undefined) {
        this.refuse(peerId, `peer ${peerId} speaks mesh protocol v${err.version}, this page v${this.version}`);
        return;
      }
      this.drop(peerId, null, err.message, err.type);
      return;
    }
    if (!done) return;
    const m = done.message;
    if (m.type === TYPES.HELLO) {
      const { protocol, peerId: claimed } = m.json;
      if (protocol !== this.version) { this.refuse(peerId, `peer ${peerId} speaks mesh protocol v${protocol}, this page v${this.version}`); return; }
      if (claimed !== peerId) { this.refuse(peerId, `peer ${peerId} introduced itself as ${String(claimed).slice(0, 40)}`); return; }
      if (entry.hello) { this.drop(peerId, m, 'repeated HELLO'); return; }
      entry.hello = m.json;
      this.emit('link', { peer: peerId, state: 'ready' });
      return;
    }
    if (!entry.hello) { this.drop(peerId, m, 'message before HELLO'); return; }
    const fns = this.handlers.get(m.type);
    if (!fns || !fns.size) { this.drop(peerId, m, `${typeName(m.type)} while nothing expects it`); return; }
    for (const fn of [...fns]) {
      try { fn(peerId, m); } catch (err) { console.warn(`daisy mesh: ${typeName(m.type)} handler failed:`, err); }
    }
  }

  // a protocol mismatch: say why on both pages (the other side may not parse our frames, so the
  // link owner also tells it through the signaling server) and close the link
  refuse(peerId, reason) {
    const entry = this.links.get(peerId);
    this.emit('refused', { peer: peerId, reason });
    if (entry) entry.refused = reason;
    this.removeLink(peerId, reason);
  }

  // a frame of what just ended (Stale): expected, so neither a bad frame nor a line of the log
  dropStale() { this.drops.stale++; }

  // the bytes (frames, headers included) of `key`'s Stale budget the link from peerId has used
  // (0: none of it yet); a read only (run_end.test.mjs sets its late frames against what is left)
  staleBytes(peerId, key) {
    const s = this.links.get(peerId)?.stale;
    return s && s.key === key ? s.bytes : 0;
  }

  drop(peerId, m, reason, type = m ? m.type : undefined) {
    const what = m ? `${typeName(m.type)} step ${m.step + 1} ` : '';
    const line = `dropped ${what}from ${peerId}: ${reason}`;
    this.drops.count++;
    this.drops.recent.push(line);
    if (this.drops.recent.length > DROP_LOG) this.drops.recent.shift();
    console.info(`daisy mesh: ${line}`);
    this.emit('drop', { peer: peerId, reason, line, type });
    const entry = this.links.get(peerId);
    if (!entry) return;
    const now = this.clock.now();
    entry.bad.push(now);
    while (entry.bad.length && now - entry.bad[0] > BAD_WINDOW_MS) entry.bad.shift();
    if (entry.bad.length > MAX_BAD_FRAMES) {
      this.removeLink(peerId, `${entry.bad.length} bad frames within ${BAD_WINDOW_MS / 1000} s`);
    }
  }
}

export { HEADER_BYTES };
