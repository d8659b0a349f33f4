// The threaded CPU backend: the wasm-simd backend's kernels run on a pool of threads (the caller
// plus threads-1 workers, thread_worker.js) over ONE shared WebAssembly.Memory, split by a
// partition that changes no element's operations or their order (docs/VERIFICATION.md, "Thread
// partitions"), so its bits are the single-threaded backend's for any thread count:
//   the INT8 unit   quantize: logical rows of A and of B (whole batches when batch >= threads);
//                   then GEMM + epilogue: row pairs of C (whole batches when batch >= threads)
//   row kernels     whole rows (causal softmax: whole groups of T rows); ReLU: even-sized slices
// Everything else (RMSNorm's backward, whose gain gradient is a tree over all rows; Adam; the
// hash; the model's copies) runs on the caller as in the wasm-simd backend.
// The trainer's step arrays live in the shared memory (backend.newArena()), so the kernels read
// and write them in place; an array from elsewhere (weights, a fresh array) is staged through a
// scratch block. Small calls stay on the caller (route by size); the route changes no bit either.
// SharedArrayBuffer is required: always in Node; in a page only when it is cross-origin isolated.
import { makeBackend, createBackends } from '../engines.js';
import { gemmWasmShared, gateUnit } from '../wasm_gemm.js';
import { floatWasmShared, rowPieces } from '../wasm_float.js';
import { MAX_K } from '../units.js';
import { NORM_EPS, crossEntropyTail } from '../model.js';
import { StepArena, freshF64 } from '../arena.js';
import { KERNEL_ID as K, CTL, STOP, controlBytes, writeSlot } from './thread_jobs.js';
import { MAX_THREADS, MIN_UNIT_MACS, defaultThreads, split, startWorker, workersUnavailable } from './workers.js';

const PAGE = 65536, MAX_PAGES = 32768;            // 2 GiB of address space at most, grown on demand
const GUARD = 64;                                 // bytes after every block: the kernels' pair/quad loops read past an end
// below this size a row piece stays on the caller (MIN_UNIT_MACS: the same for a unit, workers.js)
export const MIN_ROW_ELEMENTS = 1 << 17;

// -> null, or why threads cannot run here
export function threadsUnavailable() {
  if (typeof SharedArrayBuffer === 'undefined') return 'SharedArrayBuffer is not available (the page is not cross-origin isolated)';
  if (typeof Atomics === 'undefined') return 'Atomics is not available';
  return workersUnavailable();
}

// first-fit allocator over the shared memory (offsets in bytes, 64-byte aligned, each block
// followed by GUARD bytes); grows the memory when nothing fits
class SharedHeap {
  constructor(memory) { this.memory = memory; this.top = 64; this.free = []; this.buffers = new WeakSet(); }

  get buffer() { const b = this.memory.buffer; this.buffers.add(b); return b; }

  alloc(bytes) {
    const need = ((bytes + GUARD + 63) & ~63);
    for (let i = 0; i < this.free.length; i++) {
      const [off, size] = this.free[i];
      if (size >= need) {
        if (size === need) this.free.splice(i, 1); else this.free[i] = [off + need, size - need];
        return off;
      }
    }
    const off = this.top, end = off + need, have = this.memory.buffer.byteLength;
    if (end > have) {
      if (end > MAX_PAGES * PAGE) throw new RangeError(`the thread pool's memory would pass ${MAX_PAGES * PAGE / 2 ** 20} MiB`);
      this.memory.grow(Math.ceil((end - have) / PAGE));
    }
    this.top = end;
    return off;
  }

  release(off, bytes) {
    const size = ((bytes + GUARD + 63) & ~63);
    this.free.push([off, size]);
    this.free.sort((a, b) => a[0] - b[0]);
    const merged = [];
    for (const blk of this.free) {
      const last = merged[merged.length - 1];
      if (last && last[0] + last[1] === blk[0]) last[1] += blk[1]; else merged.push([...blk]);
    }
    // a free block that ends at the top lowers the top: the next large block (an arena's merged
    // chunk, a grown scratch) is made there instead of above it
    const last = merged[merged.length - 1];
    if (last && last[0] + last[1] === this.top) { this.top = last[0]; merged.pop(); }
    this.free = merged;
  }

  // a Float64Array(n) in the shared memory
  f64(n) { const off = this.alloc(8 * n); return new Float64Array(this.buffer, off, n); }
  dropF64(a) { this.release(a.byteOffset, 8 * a.length); }

  // byte offset of a typed array in the shared memory, or -1 when it lives elsewhere
  ptr(a) { return this.buffers.has(a.buffer) ? a.byteOffset : -1; }
}

// The pool: threads-1 workers and the caller, one job at a time.
class Pool {
  static async create(threads) {
    const why = threadsUnavailable();
    if (why) throw new Error(why);
    const memory = new WebAssembly.Memory({ initial: 16, maximum: MAX_PAGES, shared: true });
    const gemmModule = new WebAssembly.Module(gemmWasmShared(MAX_PAGES));
    const floatModule = new WebAssembly.Module(floatWasmShared(MAX_PAGES));
    const env = { env: { mem: memory } };
    const pool = new Pool();
    pool.threads = threads; pool.memory = memory; pool.heap = new SharedHeap(memory);
    pool.g = new WebAssembly.Instance(gemmModule, env).exports;
    pool.f = new WebAssembly.Instance(floatModule, env).exports;
    pool.control = new SharedArrayBuffer(controlBytes(threads));
    pool.i32 = new Int32Array(pool.control); pool.f64 = new Float64Array(pool.control);
    pool.fns = [];
    for (const [name, id] of Object.entries(K)) {
      pool.fns[id] = name === 'copy'
        ? (dst, src, n) => { new Float64Array(memory.buffer).copyWithin(dst / 8, src / 8, src / 8 + n); }
        : pool.g[name] || pool.f[name];
    }
    pool.canBlock = (() => { try { Atomics.wait(pool.i32, CTL.ERR, 1, 0); return true; } catch { return false; } })();
    pool.workers = await Promise.all(Array.from({ length: threads - 1 }, (_, w) => spawn(
      { memory, gemmModule, floatModule, control: pool.control, slot: w + 1 })));
    pool.errors = [];
    for (const w of pool.workers) w.onError((m) => pool.errors.push(m));
    return pool;
  }

  // parts[t]: the calls ([name, ...args]) of thread t; thread 0 is the caller. Returns when all ran.
  run(parts) {
    const n = this.workers.length;
    if (this.clock) return this.timedRun(parts);
    if (n === 0 || parts.slice(1).every((p) => !p || p.length === 0)) {
      for (const [name, ...args] of parts[0] || []) this.fns[K[name]](...args);
      return;
    }
    for (let w = 1; w <= n; w++) writeSlot(this.f64, w, (parts[w] || []).map(([name, ...args]) => [K[name], ...args]));
    Atomics.store(this.i32, CTL.DONE, 0);
    Atomics.add(this.i32, CTL.GEN, 1);
    Atomics.notify(this.i32, CTL.GEN);
    let mine = null;
    try {
      for (const [name, ...args] of parts[0] || []) this.fns[K[name]](...args);
    } catch (e) { mine = e; }
    for (;;) {                                    // the workers always finish (a trap is caught there)
      const d = Atomics.load(this.i32, CTL.DONE);
      if (d >= n) break;
      if (this.canBlock) Atomics.wait(this.i32, CTL.DONE, d, 1000);
    }
    if (mine) throw mine;
    const bad = Atomics.exchange(this.i32, CTL.ERR, 0);
    if (bad) throw new Error(`thread ${bad - 1} failed: ${this.errors.shift() || 'a kernel trapped'}`);
  }

  // run() under a profile (bench/profile_cpu_step.mjs): clock.add(what, ms) per kernel call on one
  // thread, per job (named by its first kernel) on several
  timedRun(parts) {
    const clock = this.clock, now = () => performance.now();
    this.clock = null;
    try {
      if (parts.length === 1) {
        for (const call of parts[0]) { const t = now(); this.run([[call]]); clock.add(call[0], now() - t); }
      } else {
        const t = now(); this.run(parts); clock.add(`${parts[0][0][0]} (all threads)`, now() - t);
      }
    } finally { this.clock = clock; }
  }

  close() {
    if (!this.workers.length) return;
    for (let w = 1; w <= this.workers.length; w++) writeSlot(this.f64, w, [[STOP]]);
    Atomics.add(this.i32, CTL.GEN, 1);
    Atomics.notify(this.i32, CTL.GEN);
    for (const w of this.workers) w.terminate();
    this.workers = [];
  }
}

// a worker of thread_worker.js, started and ready -> {onError(f), terminate()}
async function spawn(init) {
  const w = await startWorker(new URL('./thread_worker.js', import.meta.url), init);
  // a kernel's trap comes as a message; a worker that dies says so through onFail
  return { onError: (f) => { w.onMessage((m) => m.error && f(m.error)); w.onFail((e) => f(`the worker died: ${e && e.message ? e.message : e}`)); },
           terminate: w.terminate };
}

// --- the threaded parts ---------------------------------------------------------------------

// A scratch block of the shared memory, grown on demand, carved per call: regions(bytes...) ->
// their offsets (each 64-byte aligned, with GUARD bytes after it)
class Scratch {
  constructor(heap) { this.heap = heap; this.off = 0; this.size = 0; }
  regions(sizes) {
    const offs = [];
    let total = 0;
    for (const s of sizes) { offs.push(total); total += (s + GUARD + 63) & ~63; }
    if (total > this.size) {
      if (this.size) this.heap.release(this.off, this.size);
      this.size = Math.max(total, 2 * this.size);
      this.off = this.heap.alloc(this.size);
    }
    return offs.map((o) => this.off + o);
  }
}

// The INT8 unit on the pool: units.qmatmulT's contract, the wasm engine's kernels.
function threadedUnit(pool, scratch, minMacs) {
  const heap = pool.heap, T = pool.threads;
  // a Float64Array -> its offset in the shared memory, staging it at `stage` when it lives elsewhere
  const place = (x, stage) => {
    const p = heap.ptr(x);
    if (p >= 0) return p;
    new Float64Array(heap.buffer, stage, x.length).set(x);
    return stage;
  };
  // the quantizer calls of one operand: logical rows R per batch, stored (R, Kk) when rowsStored
  // else (Kk, R); split over threads by whole batches, or by logical rows within each batch
  const quantCalls = (parts, x, q, s, nb, R, Kk, Rp, Kp, rowsStored, threads) => {
    if (nb >= threads) {
      const bs = split(nb, threads);
      for (let t = 0; t < threads; t++) {
        const b0 = bs[t], cnt = bs[t + 1] - b0;
        if (cnt) parts[t].push([rowsStored ? 'qrows' : 'qcols', x + b0 * R * Kk * 8, q + b0 * Rp * Kp * 2, s + b0 * R * 8, cnt, R, Kk, Rp, Kp]);
      }
      return;
    }
    const rs = split(R, threads);
    for (let b = 0; b < nb; b++) {
      for (let t = 0; t < threads; t++) {
        const r0 = rs[t], cnt = rs[t + 1] - r0;
        if (!cnt) continue;
        const qo = q + (b * Rp + r0) * Kp * 2, so = s + (b * R + r0) * 8;
        if (rowsStored) parts[t].push(['qrows', x + (b * R + r0) * Kk * 8, qo, so, 1, cnt, Kk, cnt, Kp]);
        else parts[t].push(['qcolsLd', x + (b * R * Kk + r0) * 8, qo, so, 1, cnt, Kk, cnt, Kp, R]);
      }
    }
  };
  return function qmatmulT(a, transA, b, transB, nb, m, kk, n, out = undefined) {
    if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
    const kp = (kk + 7) & ~7, mp = m + (m & 1), np = (n + 3) & ~3;
    const dst = out || new Float64Array(nb * m * n);
    const outPtr = heap.ptr(dst);
    const [oXa, oXb, oA, oB, oSa, oSb, oC, oOut] = scratch.regions([
      heap.ptr(a) >= 0 ? 0 : a.length * 8, heap.ptr(b) >= 0 ? 0 : b.length * 8, nb * mp * kp * 2, nb * np * kp * 2,
      nb * m * 8, nb * n * 8, nb * mp * np * 4, outPtr >= 0 ? 0 : nb * m * n * 8]);
    const xa = place(a, oXa), xb = place(b, oXb), po = outPtr >= 0 ? outPtr : oOut;
    if (kp !== kk || mp !== m) new Int16Array(heap.buffer, oA, nb * mp * kp).fill(0);
    if (kp !== kk || np !== n) new Int16Array(heap.buffer, oB, nb * np * kp).fill(0);
    const threads = nb * m * kk * n < minMacs ? 1 : T;
    const quant = Array.from({ length: threads }, () => []);
    quantCalls(quant, xa, oA, oSa, nb, m, kk, mp, kp, !transA, threads);   // A's logical row i
    quantCalls(quant, xb, oB, oSb, nb, n, kk, np, kp, transB, threads);    // B's logical column j
    pool.run(quant);
    const mult = Array.from({ length: threads }, () => []);
    if (nb >= threads) {
      const bs = split(nb, threads);
      for (let t = 0; t < threads; t++) {
        const b0 = bs[t], cnt = bs[t + 1] - b0;
        if (!cnt) continue;
        mult[t].push(['gemm', oA + b0 * mp * kp * 2, oB + b0 * np * kp * 2, oC + b0 * mp * np * 4, cnt, mp, np, kp],
          ['epi', oC + b0 * mp * np * 4, oSa + b0 * m * 8, oSb + b0 * n * 8, po + b0 * m * n * 8, cnt, m, n, mp, np]);
      }
    } else {
      const is = split(mp, threads, 2);                                    // row pairs: the kernel's unit
      for (let bi = 0; bi < nb; bi++) {
        for (let t = 0; t < threads; t++) {
          const i0 = is[t], rows = is[t + 1] - i0, live = Math.min(is[t + 1], m) - i0;
          if (!rows) continue;
          const c = oC + (bi * mp + i0) * np * 4;
          mult[t].push(['gemm', oA + (bi * mp + i0) * kp * 2, oB + bi * np * kp * 2, c, 1, rows, np, kp]);
          if (live > 0) mult[t].push(['epi', c, oSa + (bi * m + i0) * 8, oSb + bi * n * 8, po + (bi * m + i0) * n * 8, 1, live, n, live, np]);
        }
      }
    }
    pool.run(mult);
    if (outPtr < 0) dst.set(new Float64Array(heap.buffer, oOut, nb * m * n));
    return dst;
  };
}

// The row pieces on the pool (model.js's signatures). A piece whose shape would let a kernel's
// vector loop write past a row into the next thread's rows falls back to the single-threaded
// wasm piece (`base`), which computes in its own memory; see docs/VERIFICATION.md.
function threadedRows(pool, scratch, base, minElements) {
  const heap = pool.heap;
  const threadsFor = (elements) => (elements < minElements ? 1 : pool.threads);
  const parts = (threads) => Array.from({ length: threads }, () => []);
  // inputs placed (staged when elsewhere) and the outputs' offsets (staged when elsewhere);
  // finish() copies staged outputs back
  const frame = (ins, outs, extra) => {
    const ptrs = [...ins, ...outs].map((x) => heap.ptr(x));
    const offs = scratch.regions([...ins, ...outs].map((x, i) => (ptrs[i] >= 0 ? 0 : x.length * 8)).concat(extra));
    const at = [...ins, ...outs].map((x, i) => {
      if (ptrs[i] >= 0) return ptrs[i];
      if (i < ins.length) new Float64Array(heap.buffer, offs[i], x.length).set(x);
      return offs[i];
    });
    return {
      at, extra: offs.slice(ins.length + outs.length),
      finish() { outs.forEach((x, j) => { const i = ins.length + j; if (ptrs[i] < 0) x.set(new Float64Array(heap.buffer, at[i], x.length)); }); },
    };
  };
  return {
    rmsnorm(x, g, N, C, mem = freshF64) {
      if (C % 2) return base.rmsnorm(x, g, N, C, mem);
      const y = mem.take(N * C), xhat = mem.take(N * C), r = mem.take(N);
      const threads = threadsFor(N * C), fr = frame([x, g], [y, xhat, r], Array(threads * 2).fill(8 * C));
      const [px, pg, py, ph, pr] = fr.at, ns = split(N, threads), job = parts(threads);
      for (let t = 0; t < threads; t++) {
        const n0 = ns[t], cnt = ns[t + 1] - n0;
        if (cnt) job[t].push(['rmsnormRows', px + n0 * C * 8, pg, py + n0 * C * 8, ph + n0 * C * 8, pr + n0 * 8, cnt, C, fr.extra[2 * t], fr.extra[2 * t + 1], NORM_EPS]);
      }
      pool.run(job);
      fr.finish();
      return [y, { xhat, r }];
    },
    // the gain's gradient is a tree over all N rows: one thread (in place), as wasm-simd
    rmsnormBackward(dy, g, cache, N, C, mem = freshF64) {
      if (C % 2 || (N * C) % 2) return base.rmsnormBackward(dy, g, cache, N, C, mem);
      const dx = mem.take(N * C), dg = mem.take(C);
      const fr = frame([dy, g, cache.xhat, cache.r], [dx, dg], [8 * N * C, 8 * Math.max(N, C), 8 * C, 8 * C]);
      const [pdy, pg, ph, pr, pdx, pdg] = fr.at, [pprod, ps, pd, pt] = fr.extra;
      pool.run([[['rmsnormBackRows', pdy, pg, ph, pr, pdx, pdg, pprod, N, C, ps, pd, pt]]]);
      fr.finish();
      return [dx, dg];
    },
    causalSoftmax(s, G, T, mem = freshF64, scale = 1.0) {
      if (T % 4) return base.causalSoftmax(s, G, T, mem, scale);
      const p = mem.take(G * T * T), threads = threadsFor(G * T * T);
      const fr = frame([s], [p], Array(threads * 2).fill(0).map((_, i) => (i % 2 ? 8 * T : 16 * G * T)));
      const [ps, pp] = fr.at, gs = split(G, threads), job = parts(threads);
      for (let t = 0; t < threads; t++) {
        const g0 = gs[t], cnt = gs[t + 1] - g0;
        if (cnt) job[t].push(['softmaxRows', ps + g0 * T * T * 8, pp + g0 * T * T * 8, fr.extra[2 * t], fr.extra[2 * t + 1], cnt * T, T, T, 0, scale]);
      }
      pool.run(job);
      fr.finish();
      return p;
    },
    softmaxBackward(dp, p, G, T, scale, mem = freshF64) {
      if (T % 2) return base.softmaxBackward(dp, p, G, T, scale, mem);
      const ds = mem.take(G * T * T), R = G * T, threads = threadsFor(R * T);
      const fr = frame([dp, p], [ds], Array(threads * 2).fill(8 * T));
      const [pdp, pp, pds] = fr.at, rs = split(R, threads), job = parts(threads);
      for (let t = 0; t < threads; t++) {
        const r0 = rs[t], cnt = rs[t + 1] - r0;
        if (cnt) job[t].push(['softmaxBackRows', pdp + r0 * T * 8, pp + r0 * T * 8, pds + r0 * T * 8, cnt, T, scale, fr.extra[2 * t], fr.extra[2 * t + 1]]);
      }
      pool.run(job);
      fr.finish();
      return ds;
    },
    relu(h, mem = freshF64) {
      const hr = mem.take(h.length);
      return elementwise('relu', [h], hr);
    },
    reluBackward(dhr, h, mem = freshF64) {
      const dh = mem.take(h.length);
      return elementwise('reluBack', [h, dhr], dh);
    },
    // cross-entropy's softmax rows split by rows; a thread's last row is computed into scratch and
    // copied into place, since the vector loop of a row of odd width writes past its end
    crossEntropy(logits, targets, N, V, mem = freshF64) {
      const lossN = mem.take(N), dlogits = mem.take(N * V), threads = threadsFor(N * V);
      const fr = frame([logits], [dlogits], [16 * N, ...Array(threads * 2).fill(8 * V)]);
      const [pl, pd] = fr.at, [pstats, ...rest] = fr.extra, rs = split(N, threads), job = parts(threads);
      for (let t = 0; t < threads; t++) {
        const r0 = rs[t], cnt = rs[t + 1] - r0, last = r0 + cnt - 1, tmp = rest[2 * t + 1];
        if (!cnt) continue;
        if (cnt > 1) job[t].push(['softmaxRows', pl + r0 * V * 8, pd + r0 * V * 8, pstats + r0 * 16, rest[2 * t], cnt - 1, V, 0, N, 1.0]);
        job[t].push(['softmaxRows', pl + last * V * 8, tmp, pstats + last * 16, rest[2 * t], 1, V, 0, N, 1.0],
          ['copy', pd + last * V * 8, tmp, V]);
      }
      pool.run(job);
      fr.finish();
      const stats = new Float64Array(heap.buffer, pstats, 2 * N);
      return crossEntropyTail(logits, targets, N, V, stats, dlogits, lossN);   // the target's entry and the loss
    },
  };
  // out[i] = kernel(ins[.][i]): even-sized slices (the pair loop writes one past an odd end, so an
  // odd length runs on one thread, whose spill lands in the guard after a staged block)
  function elementwise(kernel, ins, out) {
    const n = out.length;
    if (n % 2 && heap.ptr(out) >= 0) return kernel === 'relu' ? base.relu(ins[0], { take: () => out }) : base.reluBackward(ins[1], ins[0], { take: () => out });
    const threads = n % 2 ? 1 : threadsFor(n), fr = frame(ins, [out], []), is = split(n, threads, 2), job = parts(threads);
    for (let t = 0; t < threads; t++) {
      const i0 = is[t], cnt = is[t + 1] - i0;
      if (cnt) job[t].push([kernel, ...fr.at.map((p) => p + i0 * 8), cnt]);
    }
    pool.run(job);
    fr.finish();
    return out;
  }
}

// -> a backend (engines.js) whose GEMM unit and row pieces run on `threads` threads; Adam and the
// hash are the wasm-simd backend's. Throws when the wasm-simd backend or threads are unavailable.
// backend.close() ends the workers (an idle pool does not keep a Node process alive).
// minUnitMacs, minRowElements: the routing thresholds (tests set 0 to split every call)
export async function createThreadedBackend({ threads, minUnitMacs = MIN_UNIT_MACS, minRowElements = MIN_ROW_ELEMENTS } = {}) {
  const n = threads ?? await defaultThreads();
  if (!(Number.isInteger(n) && n >= 1 && n <= MAX_THREADS)) throw new RangeError(`threads must be an integer in 1..${MAX_THREADS}, got ${n}`);
  const base = (await createBackends()).find((b) => b.name === 'wasm-simd');
  if (!base) throw new Error('the threaded backend needs the wasm-simd backend, which is not available here');
  if (base.parts.rows !== 'wasm-simd') throw new Error(`the threaded backend needs the wasm row kernels: ${base.notes.join('; ')}`);
  const pool = await Pool.create(n);
  const scratch = new Scratch(pool.heap);
  const engine = {
    name: 'wasm-simd-threads', threads: n, qmatmulT: threadedUnit(pool, scratch, minUnitMacs),
    // the bare integer entry points (units.js; a GPU engine's CPU fallback calls gemm): one thread
    gemm: (...args) => base.engine.gemm(...args), gemmBT: (...args) => base.engine.gemmBT(...args),
  };
  // the gate's shapes are small: it checks the unit as routed and with every call split
  const bad = gateUnit(engine) || gateUnit({ qmatmulT: threadedUnit(pool, scratch, 0) });
  if (bad) { pool.close(); throw new Error(`the threaded unit failed its gate: ${bad}`); }
  const rows = threadedRows(pool, scratch, base, minRowElements);
  // an arena's chunks go back to the heap once the arena itself is garbage (a Group dropped without
  // ceremony, as benches and tests do): its arrays are valid only while it lives, as any arena's
  // When the shared memory is full (its 2 GiB, or the system refuses to grow it), a chunk is a
  // plain array: the kernels then stage it through the scratch block (slower, the same bits).
  const chunk = (len) => {
    try { return pool.heap.f64(len); } catch (e) { if (e instanceof RangeError) return new Float64Array(len); throw e; }
  };
  const drop = (c) => { if (pool.heap.ptr(c) >= 0) pool.heap.dropF64(c); };
  const dropped = new FinalizationRegistry((chunks) => { for (const c of chunks) drop(c); });
  const newArena = () => {
    const arena = new StepArena({ chunk, drop });
    dropped.register(arena, arena.chunks);       // reset() keeps this array, changing its contents
    return arena;
  };
  const backend = makeBackend({
    engine, rows, adam: base.adamStep, sha: base.sha, shaAsync: base.shaAsync,
    parts: { rows: `wasm-simd x${n} threads`, adam: base.parts.adam }, notes: base.notes, threads: n,
    newArena,
  });
  // profile(clock): clock.add(kernel, ms) for every kernel job from now on (null: off)
  return Object.freeze({ ...backend, name: engine.name, close: () => pool.close(), profile: (clock) => { pool.clock = clock; } });
}
