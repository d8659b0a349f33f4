// An in-memory transport for Mesh instances (frontend_js/mesh/mesh.js) in Node tests: every link's
// send(bytes) copies the bytes into a queue; a pump delivers the queued frames to the other
// Mesh's receive() in a shuffled order, with some frames duplicated and some held back for a few
// rounds (delayed). Every choice comes from a seeded counter PRNG (frontend_js/prng.js), never
// Math.random. Not a test file itself (node --test only runs *.test.mjs).
//
//   const net = new MemoryNet({ seed: 7, maxFrame: 1200, dup: 0.05, delay: 0.15 });
//   net.add(meshA); net.add(meshB); net.connect('a', 'b');     // or net.connectAll()
//   await net.ready();                  // every link saw the other side's HELLO
//   net.inject('b', 'a', bytes);        // raw bytes "from b", straight into a's receive()
//   await net.settle();                 // nothing queued, every receive chain done
//   net.watch((from, to, bytes) => {});  // sees every frame sent, as it is queued (tests count them)
//   net.lose((from, to, bytes) => bool);  // frames it says true to are lost (a closing page's last frames)
// latencyMs / bytesPerMs (benches: bench/bench_group_links.mjs): every directed link also carries
// its frames one after another at bytesPerMs and delivers each latencyMs after it left (a frame is
// held until then, on real timers); 0 / Infinity (the default) = the rounds above alone.
import { draw, key } from '../../frontend_js/prng.js';

const pairKey = (from, to) => `${from}\u0000${to}`;

export class MemoryNet {
  constructor({ seed = 1, maxFrame = 64 * 1024, dup = 0.05, delay = 0.15, maxHold = 4, latencyMs = 0, bytesPerMs = Infinity } = {}) {
    this.k = key(0x4d454d4c, seed >>> 0);      // 'MEML'
    this.n = 0;
    this.maxFrame = maxFrame; this.dup = dup; this.delay = delay; this.maxHold = maxHold;
    this.meshes = new Map();       // id -> Mesh
    this.open = new Set();         // pairKey(from, to) of open directed links
    this.pending = [];             // {from, to, bytes, hold}
    this.pumping = false;
    this.stats = new Map();        // pairKey -> {frames, bytes, dups}
    this.delivered = 0;
    this.seq = 0;                  // enqueue order of the frames
    this.lastSeq = new Map();      // pairKey -> the highest seq delivered on it
    this.reordered = 0;            // frames delivered after a later frame of the same link
    this.latencyMs = latencyMs; this.bytesPerMs = bytesPerMs;
    this.linkFree = new Map();     // pairKey -> when the link has sent its queued bytes (latency model)
    this.timer = null;             // the wake-up for the next frame due (latency model)
    this.watchers = [];            // (from, to, bytes) for every frame sent (watch)
    this.losers = [];              // (from, to, bytes) -> true: the frame is lost (lose)
  }

  // when a frame of n bytes enqueued now on from -> to arrives (-Infinity: no latency model)
  due(k, n) {
    if (this.latencyMs === 0 && this.bytesPerMs === Infinity) return -Infinity;
    const now = performance.now();
    const free = Math.max(now, this.linkFree.get(k) ?? now) + n / this.bytesPerMs;
    this.linkFree.set(k, free);
    return free + this.latencyMs;
  }

  // uint32 / [0,1) draws of this net's stream
  u32() { return draw(this.k, this.n++); }
  rand() { return (this.u32() >>> 8) * 2 ** -24; }

  add(mesh) { this.meshes.set(mesh.selfId, mesh); return mesh; }

  watch(fn) { this.watchers.push(fn); }

  lose(fn) { this.losers.push(fn); }

  statsOf(from, to) {
    const k = pairKey(from, to);
    if (!this.stats.has(k)) this.stats.set(k, { frames: 0, bytes: 0, dups: 0 });
    return this.stats.get(k);
  }

  // one side's link object to `to`
  link(from, to, maxFrame) {
    const net = this;
    return {
      maxFrame,
      closed: null,
      async send(bytes) {
        if (!net.open.has(pairKey(from, to))) throw new Error(`link ${from} -> ${to} is closed`);
        net.enqueue(from, to, bytes);
      },
      close(reason) {
        this.closed = reason;
        net.closeLink(from, to, reason);
      },
    };
  }

  connect(a, b, { maxFrame = this.maxFrame } = {}) {
    this.open.add(pairKey(a, b)); this.open.add(pairKey(b, a));
    this.meshes.get(a).addLink(b, this.link(a, b, maxFrame));
    this.meshes.get(b).addLink(a, this.link(b, a, maxFrame));
  }

  connectAll(ids = [...this.meshes.keys()], opts = {}) {
    for (let i = 0; i < ids.length; i++) for (let j = i + 1; j < ids.length; j++) this.connect(ids[i], ids[j], opts);
  }

  // a closed channel closes both ends: queued frames are lost and the other page drops its link
  closeLink(a, b, reason) {
    const was = this.open.has(pairKey(a, b)) || this.open.has(pairKey(b, a));
    this.open.delete(pairKey(a, b)); this.open.delete(pairKey(b, a));
    this.pending = this.pending.filter((f) => !((f.from === a && f.to === b) || (f.from === b && f.to === a)));
    if (was) setImmediate(() => this.meshes.get(b)?.removeLink(a, `the other side closed (${reason})`));
  }

  enqueue(from, to, bytes) {
    const copy = Uint8Array.from(bytes);      // the sender may reuse its buffer
    const st = this.statsOf(from, to);
    st.frames++; st.bytes += copy.length;
    for (const w of this.watchers) w(from, to, copy);
    if (this.losers.some((fn) => fn(from, to, copy))) return;
    const hold = () => (this.rand() < this.delay ? 1 + (this.u32() % this.maxHold) : 0);
    const seq = this.seq++;
    const due = this.due(pairKey(from, to), copy.length);
    this.pending.push({ from, to, bytes: copy, hold: hold(), seq, due });
    if (this.rand() < this.dup) {
      st.dups++;
      this.pending.push({ from, to, bytes: Uint8Array.from(copy), hold: hold() + (this.u32() % 3), seq, due });
    }
    this.schedule();
  }

  schedule() {
    if (this.pumping) return;
    this.pumping = true;
    setImmediate(() => this.pump());
  }

  // one round: held frames count down; the others go out in a seeded random order
  pump() {
    this.pumping = false;
    const ready = [], held = [], now = performance.now();
    let next = Infinity;
    for (const f of this.pending) {
      if (f.due > now) { held.push(f); next = Math.min(next, f.due); } else if (f.hold > 0) { f.hold--; held.push(f); } else ready.push(f);
    }
    this.pending = held;
    for (let i = ready.length - 1; i > 0; i--) {
      const j = this.u32() % (i + 1);
      [ready[i], ready[j]] = [ready[j], ready[i]];
    }
    for (const f of ready) {
      if (!this.open.has(pairKey(f.from, f.to))) continue;
      this.delivered++;
      const k = pairKey(f.from, f.to), last = this.lastSeq.get(k) ?? -1;
      if (f.seq < last) this.reordered++;
      else this.lastSeq.set(k, f.seq);
      this.meshes.get(f.to).receive(f.from, f.bytes);
    }
    if (this.pending.some((f) => f.due <= now)) this.schedule();
    else if (this.pending.length && this.timer === null) {      // only frames in flight: wake when the first is due
      this.timer = setTimeout(() => { this.timer = null; this.schedule(); }, Math.max(0, next - now));
    }
  }

  // raw bytes from `from` into `to`'s receive(), now, bypassing the queue
  inject(from, to, bytes) {
    this.meshes.get(to).receive(from, Uint8Array.from(bytes));
  }

  // until nothing is queued and every mesh has handled every frame it received
  async settle() {
    for (let round = 0; round < 1000; round++) {
      while (this.pending.length || this.pumping) await new Promise((r) => setImmediate(r));
      const chains = [];
      for (const m of this.meshes.values()) for (const e of m.links.values()) chains.push(e.chain);
      await Promise.all(chains);
      await new Promise((r) => setImmediate(r));
      if (!this.pending.length && !this.pumping) return;
    }
    throw new Error('the memory net did not settle');
  }

  // until every open link of every mesh is ready (HELLO seen), or throws after timeoutMs (a liveness
  // bound, as run_harness's until: milliseconds on a quiet machine, far more on a loaded one)
  async ready(timeoutMs = 30_000) {
    const t0 = Date.now();
    for (;;) {
      let all = true;
      for (const k of this.open) {
        const [from, to] = k.split('\u0000');
        if (!this.meshes.get(from).isReady(to)) all = false;
      }
      if (all) return;
      if (Date.now() - t0 > timeoutMs) throw new Error('links not ready');
      await new Promise((r) => setImmediate(r));
    }
  }
}
