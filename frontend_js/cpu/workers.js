// What the two worker backends share (threads.js: one shared memory; unit_workers.js: copied
// buffers): the thread count, the size below which a unit stays on the caller, the partition of a
// count into parts, and starting a module worker in Node or a page.
import { IS_NODE } from '../host.js';

export const MAX_THREADS = 16;
// below this many multiply-accumulates a unit stays on the caller: a job's dispatch and wake-ups
// cost tens of microseconds, and at the default settings (largest unit 2.1M MACs) two threads
// measured slower than one (TEST_RESULTS.md, "Threads"); every unit of the largest settings is above
export const MIN_UNIT_MACS = 1 << 22;

// the default thread count: every core the device reports, at most MAX_THREADS
export async function defaultThreads() {
  let n = 1;
  if (IS_NODE) n = (await import('node:os')).availableParallelism();
  else if (typeof navigator !== 'undefined' && navigator.hardwareConcurrency) n = navigator.hardwareConcurrency;
  return Math.max(1, Math.min(MAX_THREADS, n));
}

// -> null, or why no worker can start here
export function workersUnavailable() {
  if (!IS_NODE && typeof Worker === 'undefined') return 'Web Workers are not available';
  return null;
}

// count items -> parts+1 boundaries, each part a multiple of `align` but the last
export function split(count, parts, align = 1) {
  const units = Math.ceil(count / align), out = [0];
  for (let t = 1; t < parts; t++) out.push(Math.min(count, Math.floor((units * t) / parts) * align));
  out.push(count);
  return out;
}

// a module worker of `url` (a Node worker_thread or a browser Worker), sent `init`; resolves once
// its first message says {ready: true} (rejects with its {error} or start failure) ->
// {post(message, transfer), onMessage(f), onFail(f), hold(on), terminate()}; a Node worker keeps
// the process alive only while held (hold(true): answers are awaited). threads.js's pool and
// unit_workers.js both start theirs here.
export async function startWorker(url, init) {
  const listeners = new Set(), fails = new Set();
  const deliver = (m) => { for (const f of [...listeners]) f(m); };
  const fail = (e) => { for (const f of [...fails]) f(e); };
  let w, post;
  if (IS_NODE) {
    const { Worker } = await import('node:worker_threads');
    w = new Worker(url);
    w.on('message', deliver);
    w.on('error', fail);
    w.on('messageerror', () => fail(new Error('a message from the worker could not be decoded')));
    post = (m, transfer) => w.postMessage(m, transfer);
  } else {
    w = new Worker(url, { type: 'module' });
    w.onmessage = (e) => deliver(e.data);
    w.onerror = (e) => { e.preventDefault?.(); fail(new Error(e.message || 'the worker failed')); };
    w.onmessageerror = () => fail(new Error('a message from the worker could not be decoded'));
    post = (m, transfer) => w.postMessage(m, transfer || []);
  }
  try {
    await new Promise((resolve, reject) => {
      const first = (m) => {
        listeners.delete(first); fails.delete(reject);
        if (m && m.ready) resolve(); else reject(new Error((m && m.error) || 'the worker did not start'));
      };
      listeners.add(first); fails.add(reject);
      post(init);
    });
  } catch (err) {
    w.terminate();
    throw new Error(`a worker of ${url.pathname.split('/').pop()} failed to start: ${err.message || err}`);
  }
  const hold = (on) => { if (IS_NODE) { if (on) w.ref(); else w.unref(); } };
  hold(false);
  return { post, onMessage: (f) => listeners.add(f), onFail: (f) => fails.add(f), hold, terminate: () => w.terminate() };
}
