// The INT8 unit on workers that share nothing: where a page is not cross-origin isolated (the
// Space inside huggingface.co's frame) there is no SharedArrayBuffer, so threads.js's pool cannot
// run. Here each worker (unit_worker.js) has its own gated wasm-simd engine and memory; a unit
// (units.qmatmulT) is split by a partition that changes no element's operations (docs/
// VERIFICATION.md, "Thread partitions"):
//   nb >= threads   whole batches: thread t gets batches [b0, b1) of A and of B
//   else            logical rows of A: thread t gets rows [r0, r1) of every batch and all of B
// A's rows are quantized by rows and B's columns by columns, the GEMM is exact integers and the
// epilogue is per element, so a slice's results are the whole unit's results at those places.
// The caller computes slice 0 itself while the workers compute theirs; slices go out as copies
// (A's slice transferred, B cloned per worker) and come back transferred. Row kernels, Adam and
// the hash stay on the caller (their API is synchronous). Slower than the shared pool (the copies,
// and one thread for the row kernels), faster than one thread at large sizes (TEST_RESULTS.md).
import { makeBackend, createBackends } from './engines.js';
import { gateUnitAsync } from './wasm_gemm.js';
import { MAX_K } from './units.js';
import { MAX_THREADS, MIN_UNIT_MACS, defaultThreads, split, startWorker } from './threads.js';

// -> null, or why unit workers cannot run here
export function unitWorkersUnavailable() {
  const isNode = typeof process !== 'undefined' && !!(process.versions && process.versions.node);
  if (!isNode && typeof Worker === 'undefined') return 'Web Workers are not available';
  return null;
}

// A's logical rows [r0, r1) of every batch, as an array of the same layout with r1 - r0 rows:
// (nb, rows, K) from (nb, M, K), or (nb, K, rows) from A^T's (nb, K, M)
function rowsOf(a, transA, nb, m, kk, r0, r1) {
  const rows = r1 - r0, out = new Float64Array(nb * rows * kk);
  for (let b = 0; b < nb; b++) {
    if (!transA) out.set(a.subarray((b * m + r0) * kk, (b * m + r1) * kk), b * rows * kk);
    else for (let k = 0; k < kk; k++) out.set(a.subarray((b * kk + k) * m + r0, (b * kk + k) * m + r1), (b * kk + k) * rows);
  }
  return out;
}

// a worker's slice result (nb, rows, N) into rows [r0, r0 + rows) of dst (nb, M, N)
function placeRows(dst, part, nb, m, n, r0, rows) {
  for (let b = 0; b < nb; b++) dst.set(part.subarray(b * rows * n, (b + 1) * rows * n), (b * m + r0) * n);
}

// a started worker with its jobs in flight: ask(job, transfer) -> Promise of the result array
async function unitWorker(init) {
  const w = await startWorker(new URL('./unit_worker.js', import.meta.url), init);
  const pending = new Map();
  let next = 1, dead = null;
  const failAll = (why) => {
    dead = why;
    for (const { reject } of pending.values()) reject(new Error(`a unit worker failed: ${why}`));
    pending.clear();
    w.hold(false);
  };
  w.onMessage((m) => {
    const p = pending.get(m.id);
    if (!p) return;
    pending.delete(m.id);
    if (!pending.size) w.hold(false);
    if (m.error !== undefined) p.reject(new Error(`a unit worker failed: ${m.error}`));
    else if (!(m.out instanceof Float64Array) || m.out.length !== p.length) p.reject(new Error('a unit worker answered with the wrong size'));
    else p.resolve(m.out);
  });
  w.onFail((e) => failAll(e && e.message ? e.message : String(e)));
  return {
    ask(job, transfer, length) {
      if (dead) return Promise.reject(new Error(`a unit worker failed: ${dead}`));
      const id = next++;
      return new Promise((resolve, reject) => {
        if (!pending.size) w.hold(true);               // Node: an awaited answer keeps the process alive
        pending.set(id, { resolve, reject, length });
        w.post({ ...job, id }, transfer);
      });
    },
    terminate() { failAll('closed'); w.terminate(); },
  };
}

// -> a backend (engines.js) whose INT8 unit runs on `threads` threads (the caller and threads-1
// unit workers); everything else is the wasm-simd backend's. backend.close() ends the workers.
// minUnitMacs: below it a unit stays on the caller (tests set 0 to split every call).
// faultForTests: handed to the workers (unit_worker.js); the gate must then refuse them.
export async function createUnitWorkersBackend({ threads, minUnitMacs = MIN_UNIT_MACS, faultForTests = null } = {}) {
  const T = threads ?? await defaultThreads();
  if (!(Number.isInteger(T) && T >= 1 && T <= MAX_THREADS)) throw new RangeError(`threads must be an integer in 1..${MAX_THREADS}, got ${T}`);
  const why = unitWorkersUnavailable();
  if (why) throw new Error(why);
  const base = (await createBackends()).find((b) => b.name === 'wasm-simd');
  if (!base) throw new Error('the unit workers need the wasm-simd backend, which is not available here');
  const workers = await Promise.all(Array.from({ length: T - 1 }, () => unitWorker({ faultForTests })));
  const close = () => { for (const w of workers) w.terminate(); workers.length = 0; };
  const unit = base.engine.qmatmulT.bind(base.engine);
  const qmatmulT = (macsFloor) => async (a, transA, b, transB, nb, m, kk, n, out = undefined) => {
    if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
    const dst = out || new Float64Array(nb * m * n);
    if (workers.length === 0 || nb * m * kk * n < macsFloor) return unit(a, transA, b, transB, nb, m, kk, n, dst);
    const jobs = [];
    if (nb >= T) {                                          // whole batches
      const bs = split(nb, T);
      for (let t = 1; t < T; t++) {
        const b0 = bs[t], cnt = bs[t + 1] - b0;
        if (!cnt) continue;
        const as = a.slice(b0 * m * kk, (b0 + cnt) * m * kk), bsl = b.slice(b0 * kk * n, (b0 + cnt) * kk * n);
        jobs.push(workers[t - 1].ask({ a: as, transA, b: bsl, transB, nb: cnt, m, kk, n }, [as.buffer, bsl.buffer], cnt * m * n)
          .then((part) => dst.set(part, b0 * m * n)));
      }
      if (bs[1]) unit(a.subarray(0, bs[1] * m * kk), transA, b.subarray(0, bs[1] * kk * n), transB, bs[1], m, kk, n, dst.subarray(0, bs[1] * m * n));
    } else {                                                // logical rows of A, all of B
      const rs = split(m, T);
      for (let t = 1; t < T; t++) {
        const r0 = rs[t], rows = rs[t + 1] - r0;
        if (!rows) continue;
        const as = rowsOf(a, transA, nb, m, kk, r0, r0 + rows);
        jobs.push(workers[t - 1].ask({ a: as, transA, b, transB, nb, m: rows, kk, n }, [as.buffer], nb * rows * n)
          .then((part) => placeRows(dst, part, nb, m, n, r0, rows)));
      }
      const rows0 = rs[1];
      if (rows0) {
        const a0 = !transA && nb === 1 ? a.subarray(0, rows0 * kk) : rowsOf(a, transA, nb, m, kk, 0, rows0);
        placeRows(dst, unit(a0, transA, b, transB, nb, rows0, kk, n), nb, m, n, 0, rows0);
      }
    }
    await Promise.all(jobs);
    return dst;
  };
  const engine = {
    name: 'wasm-simd-workers', threads: T, qmatmulT: qmatmulT(minUnitMacs),
    gemm: (...args) => base.engine.gemm(...args), gemmBT: (...args) => base.engine.gemmBT(...args),
  };
  // the gate's shapes are small: it checks the unit with every call split
  const bad = await gateUnitAsync({ qmatmulT: qmatmulT(0) }).catch((e) => e.message);
  if (bad) { close(); throw new Error(`the unit workers failed their gate: ${bad}`); }
  const backend = makeBackend({
    engine, rows: base, adam: base.adamStep, sha: base.sha, shaAsync: base.shaAsync,
    parts: { rows: base.parts.rows, adam: base.parts.adam }, notes: base.notes, threads: T,
  });
  return Object.freeze({ ...backend, name: engine.name, close });
}
