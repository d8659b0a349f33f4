// The one place that picks the page's CPU backend, and says why (docs/ARCHITECTURE.md "Compute").
// The candidates, best first; every one gives the same bits (docs/VERIFICATION.md "Thread
// partitions"), so the choice is speed only:
//   threads        threads.js: every part on every core over one shared memory; needs more than
//                  one core and SharedArrayBuffer (a cross-origin isolated page, or Node)
//   unit workers   unit_workers.js: the INT8 units on every core with copied buffers, the rest on
//                  one; needs more than one core and Web Workers
//   one thread     engines.js bestBackend(): the fastest parts whose gates passed (wasm-simd, or
//                  the JS mirror)
// A candidate whose module the server does not have (`has(path)` false: the page imports only
// what it was told exists) or whose start fails is passed over, and the reason carries why.
import { bestBackend } from '../engines.js';
import { defaultThreads } from './workers.js';

// -> {backend, threads: {count, shared, reason}}: how many threads it runs on, whether they
// share memory, and why not every part on every core (null when every part does).
// has(path): whether frontend_js/<path> is served (default: everything is)
export async function pickCpuBackend({ has = () => true } = {}) {
  const n = await defaultThreads();
  let reason = n < 2 ? 'this device reports one core' : null;
  if (!reason && !has('cpu/threads.js')) reason = 'cpu/threads.js is missing';
  if (!reason) {
    try {
      const threads = await import('./threads.js');
      reason = threads.threadsUnavailable();
      if (!reason) return { backend: await threads.createThreadedBackend({ threads: n }), threads: { count: n, shared: true, reason: null } };
    } catch (err) {
      reason = `the threaded backend failed: ${err.message || err}`;
      console.warn('daisy:', reason);
    }
    if (has('cpu/unit_workers.js')) {
      try {
        const backend = await (await import('./unit_workers.js')).createUnitWorkersBackend({ threads: n });
        return { backend, threads: { count: n, shared: false, reason: `${reason}: the INT8 units run on ${n} threads with copied buffers, the row kernels on one` } };
      } catch (err) {
        reason = `${reason}; the unit workers failed: ${err.message || err}`;
        console.warn('daisy:', reason);
      }
    }
  }
  return { backend: await bestBackend(), threads: { count: 1, shared: false, reason } };
}
