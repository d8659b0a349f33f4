// The INT8 unit on workers that share nothing: where a page is not cross-origin isolated (the
// Space inside huggingface.co's frame) there is no SharedArrayBuffer, so threads.js's pool cannot
// run. Here each worker (unit_worker.js) has its own gated wasm-simd engine and memory; a unit
// (units.qmatmulT) is split by a partition that changes no element's operations (docs/
// VERIFICATION.md, "Thread partitions"):
//   nb >= threads   whole batches: thread t gets batches [b0, b1) of A and of B
//   else            logical rows of A: thread t gets rows [r0, r1) of every batch and all of B
//                   (wasm_gemm.js qmatmulT's row range; for A^T, whose rows are columns, all of A)
// A's rows are quantized by rows and B's columns by columns, the GEMM is exact integers and the
// epilogue is per element, so a slice's results are the whole unit's results at those places.
// The caller computes slice 0 itself while the workers compute theirs; a worker's operands go out
// copied into a pooled buffer, transferred, and its result comes back in another (BufferPool:
// posting a view would clone its whole buffer, and fresh buffers cost their page faults). Row
// kernels, Adam and the hash stay on the caller (their API is synchronous). Slower than the shared
// pool (the copies, and one thread for the row kernels), faster than one thread at large sizes
// (TEST_RESULTS.md, "Threads").
import { makeBackend, createBackends } from '../engines.js';
import { gateUnitAsync } from '../wasm_gemm.js';
import { MAX_K } from '../units.js';
import { MAX_THREADS, MIN_UNIT_MACS, defaultThreads, split, startWorker, workersUnavailable } from './workers.js';

// A's logical rows [r0, r1) of every batch from A (nb, M, K) into out (nb, rows, K)
function rowsOf(out, a, nb, m, kk, r0, r1) {
  for (let b = 0; b < nb; b++) out.set(a.subarray((b * m + r0) * kk, (b * m + r1) * kk), b * (r1 - r0) * kk);
  return out;
}

// a slice's result (nb, rows, N) into rows [r0, r0 + rows) of dst (nb, M, N)
function placeRows(dst, part, nb, m, n, r0, rows) {
  if (nb === 1) { dst.set(part.subarray(0, rows * n), r0 * n); return; }
  for (let b = 0; b < nb; b++) dst.set(part.subarray(b * rows * n, (b + 1) * rows * n), (b * m + r0) * n);
}

// ArrayBuffers reused call after call: a fresh buffer of megabytes costs its page faults every
// time (most of a unit's time, measured); a buffer goes to a worker with a job (transferred) and
// comes back with the answer. take(bytes) -> a buffer at least that big; give(buffer) returns it.
class BufferPool {
  constructor(keep) { this.keep = keep; this.free = []; }
  take(bytes) {
    let best = -1;
    for (let i = 0; i < this.free.length; i++) {
      const len = this.free[i].byteLength;
      if (len >= bytes && (best < 0 || len < this.free[best].byteLength)) best = i;
    }
    if (best >= 0) return this.free.splice(best, 1)[0];
    return new ArrayBuffer(Math.max(bytes, 1 << 16));
  }
  give(buffer) {
    if (!buffer || buffer.byteLength === 0) return;         // detached: it went elsewhere
    this.free.push(buffer);
    if (this.free.length > this.keep) {                     // drop the smallest
      let small = 0;
      for (let i = 1; i < this.free.length; i++) if (this.free[i].byteLength < this.free[small].byteLength) small = i;
      this.free.splice(small, 1);
    }
  }
}

// a started worker with its jobs in flight: ask(shape, fill) -> Promise of its result
// (Float64Array over a pooled buffer; give it back to the pool once copied). A worker that fails
// (crashes, an undecodable answer, a job that errs) is dead: its jobs reject and it gets no more.
async function unitWorker(init, pool) {
  const w = await startWorker(new URL('./unit_worker.js', import.meta.url), init);
  const pending = new Map();
  let next = 1, dead = null;
  const fail = (why) => {
    if (dead) return;
    dead = why;
    for (const { reject } of pending.values()) reject(new Error(`a unit worker failed: ${why}`));
    pending.clear();
    w.hold(false);
    w.terminate();
  };
  w.onMessage((m) => {
    const p = pending.get(m.id);
    if (!p) return;
    pending.delete(m.id);
    if (!pending.size) w.hold(false);
    pool.give(m.input);
    if (m.error !== undefined || !(m.output instanceof ArrayBuffer) || m.output.byteLength < 8 * p.length) {
      pool.give(m.output instanceof ArrayBuffer ? m.output : null);
      p.reject(new Error(`a unit worker failed: ${m.error ?? 'it answered with the wrong size'}`));
      return;
    }
    p.resolve(new Float64Array(m.output, 0, p.length));
  });
  w.onFail((e) => fail(e && e.message ? e.message : String(e)));
  return {
    get dead() { return dead; },
    fail,
    // shape: {transA, transB, nb, m, kk, n, r0, r1, aLen, bLen}; fill(A, B) writes the operands
    ask(shape, fill) {
      if (dead) return Promise.reject(new Error(`a unit worker failed: ${dead}`));
      const id = next++, length = shape.nb * (shape.r1 - shape.r0) * shape.n;
      const input = pool.take(8 * (shape.aLen + shape.bLen)), output = pool.take(8 * length);
      fill(new Float64Array(input, 0, shape.aLen), new Float64Array(input, 8 * shape.aLen, shape.bLen));
      return new Promise((resolve, reject) => {
        if (!pending.size) w.hold(true);               // Node: an awaited answer keeps the process alive
        pending.set(id, { resolve, reject, length });
        try {
          w.post({ ...shape, id, input, output }, [input, output]);
        } catch (err) {
          pending.delete(id);
          if (!pending.size) w.hold(false);
          reject(err);
        }
      });
    },
    terminate() { fail('closed'); },
  };
}

// -> a backend (engines.js) whose INT8 unit runs on `threads` threads (the caller and threads-1
// unit workers); everything else is the wasm-simd backend's. backend.close() ends the workers.
// minUnitMacs: below it a unit stays on the caller (tests set 0 to split every call).
// faultForTests: handed to the workers (unit_worker.js); the gate must then refuse them.
// A worker that fails mid-run is dropped: its slice of that unit is computed by the caller (the
// same bits) and later units are split over the workers left.
export async function createUnitWorkersBackend({ threads, minUnitMacs = MIN_UNIT_MACS, faultForTests = null } = {}) {
  const threadCount = threads ?? await defaultThreads();
  if (!(Number.isInteger(threadCount) && threadCount >= 1 && threadCount <= MAX_THREADS)) {
    throw new RangeError(`threads must be an integer in 1..${MAX_THREADS}, got ${threadCount}`);
  }
  const why = workersUnavailable();
  if (why) throw new Error(why);
  const base = (await createBackends()).find((b) => b.name === 'wasm-simd');
  if (!base) throw new Error('the unit workers need the wasm-simd backend, which is not available here');
  const pool = new BufferPool(4 * threadCount);
  const started = await Promise.allSettled(Array.from({ length: threadCount - 1 }, () => unitWorker({ faultForTests }, pool)));
  const workers = started.filter((r) => r.status === 'fulfilled').map((r) => r.value);
  const close = () => { for (const w of workers) w.terminate(); workers.length = 0; pool.free = []; };
  const notStarted = started.find((r) => r.status === 'rejected');
  if (notStarted) { close(); throw notStarted.reason; }
  const unit = base.engine.qmatmulT.bind(base.engine);
  const qmatmulT = (macsFloor) => async (a, transA, b, transB, nb, m, kk, n, out = undefined) => {
    if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
    const dst = out || new Float64Array(nb * m * n);
    const live = workers.filter((w) => !w.dead), T = live.length + 1;
    if (T === 1 || nb * m * kk * n < macsFloor) return unit(a, transA, b, transB, nb, m, kk, n, dst);
    // slice t: [its worker's job (t >= 1), the same slice on the caller, its worker]
    const slices = [];
    if (nb >= T) {                                          // whole batches
      const bs = split(nb, T);
      for (let t = 0; t < T; t++) {
        const b0 = bs[t], cnt = bs[t + 1] - b0, aLen = cnt * m * kk, bLen = cnt * kk * n;
        if (!cnt) continue;
        const onCaller = () => unit(a.subarray(b0 * m * kk, b0 * m * kk + aLen), transA, b.subarray(b0 * kk * n, b0 * kk * n + bLen), transB,
          cnt, m, kk, n, dst.subarray(b0 * m * n, (b0 + cnt) * m * n));
        const job = t && (() => live[t - 1].ask({ transA, transB, nb: cnt, m, kk, n, r0: 0, r1: m, aLen, bLen }, (A, B) => {
          A.set(a.subarray(b0 * m * kk, b0 * m * kk + aLen)); B.set(b.subarray(b0 * kk * n, b0 * kk * n + bLen));
        }).then((part) => { dst.set(part, b0 * m * n); pool.give(part.buffer); }));
        slices.push([job, onCaller, live[t - 1]]);
      }
    } else {                                                // logical rows of A, all of B
      const rs = split(m, T);
      for (let t = 0; t < T; t++) {
        const r0 = rs[t], rows = rs[t + 1] - r0;
        if (!rows) continue;
        const onCaller = () => {
          if (nb === 1) unit(a, transA, b, transB, 1, m, kk, n, dst.subarray(r0 * n, (r0 + rows) * n), r0, r0 + rows);
          else {                                            // the slice's rows are not contiguous in dst
            const oBuf = pool.take(8 * nb * rows * n);
            placeRows(dst, unit(a, transA, b, transB, nb, m, kk, n, new Float64Array(oBuf, 0, nb * rows * n), r0, r0 + rows), nb, m, n, r0, rows);
            pool.give(oBuf);
          }
        };
        // A^T's rows are columns: the worker gets all of A and picks them (qcolsLd); A's rows go alone
        const shape = transA ? { m, r0, r1: r0 + rows, aLen: a.length } : { m: rows, r0: 0, r1: rows, aLen: nb * rows * kk };
        const job = t && (() => live[t - 1].ask({ transA, transB, nb, kk, n, ...shape, bLen: b.length }, (A, B) => {
          if (transA) A.set(a); else rowsOf(A, a, nb, m, kk, r0, r0 + rows);
          B.set(b);
        }).then((part) => { placeRows(dst, part, nb, m, n, r0, rows); pool.give(part.buffer); }));
        slices.push([job, onCaller, live[t - 1]]);
      }
    }
    // the workers' jobs first (posted now, they run while the caller computes its own slice);
    // each settles to null or to the slice the caller must compute instead
    const settled = slices.filter(([job]) => job).map(([job, onCaller, w]) => {
      let p;
      try { p = job(); } catch (err) { p = Promise.reject(err); }
      return p.then(() => null, (err) => {
        console.warn(`daisy: a unit worker failed, its slice runs on the caller and it gets no more: ${err.message || err}`);
        w.fail(err.message || String(err));
        return onCaller;
      });
    });
    let mine = null;
    try {
      for (const [job, onCaller] of slices) if (!job) onCaller();
    } catch (err) { mine = err; }
    const redo = await Promise.all(settled);                // every job settled: none writes into dst later
    if (mine) throw mine;
    for (const onCaller of redo) if (onCaller) onCaller();
    return dst;
  };
  const engine = {
    name: 'wasm-simd-workers', threads: threadCount, qmatmulT: qmatmulT(minUnitMacs),
    gemm: (...args) => base.engine.gemm(...args), gemmBT: (...args) => base.engine.gemmBT(...args),
  };
  // the gate's shapes are small: it checks the unit with every call split
  const bad = await gateUnitAsync({ qmatmulT: qmatmulT(0) }).catch((e) => e.message);
  if (bad) { close(); throw new Error(`the unit workers failed their gate: ${bad}`); }
  const backend = makeBackend({
    engine, rows: base, adam: base.adamStep, sha: base.sha, shaAsync: base.shaAsync,
    parts: { rows: base.parts.rows, adam: base.parts.adam }, notes: base.notes, threads: threadCount,
  });
  return Object.freeze({ ...backend, name: engine.name, close });
}
