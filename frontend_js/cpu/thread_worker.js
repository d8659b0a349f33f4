// One worker of threads.js's pool (a Node worker_thread or a browser module Worker). It gets the
// pool's shared WebAssembly.Memory, the two kernel modules compiled over it and the control block,
// instantiates the kernels, says 'ready', then serves jobs until told to stop:
//   wait until control[GEN] moves; run the calls of its slot (kernel id, then its arguments);
//   control[DONE] += 1 and wake the caller. A trap sets control[ERR] to 1 + its slot and says why.
// The layout of the control block and the kernel ids: thread_jobs.js (one table for both sides).
import { KERNELS, CTL, slotCalls } from './thread_jobs.js';
import { IS_NODE } from '../host.js';

function serve({ memory, gemmModule, floatModule, control, slot }, post) {
  const env = { env: { mem: memory } };
  const g = new WebAssembly.Instance(gemmModule, env).exports;
  const f = new WebAssembly.Instance(floatModule, env).exports;
  const fns = KERNELS.map((name) => (name === 'copy'
    ? (dst, src, n) => { const m = new Float64Array(memory.buffer); m.copyWithin(dst / 8, src / 8, src / 8 + n); }
    : g[name] || f[name]));
  const i32 = new Int32Array(control), f64 = new Float64Array(control);
  let seen = Atomics.load(i32, CTL.GEN);          // before 'ready': the first job comes after it
  post({ ready: true });
  for (;;) {
    Atomics.wait(i32, CTL.GEN, seen);
    const gen = Atomics.load(i32, CTL.GEN);
    if (gen === seen) continue;
    seen = gen;
    let stop = false;
    try {
      for (const [id, args] of slotCalls(f64, slot)) {
        if (id < 0) { stop = true; break; }
        fns[id](...args);
      }
    } catch (e) {
      Atomics.compareExchange(i32, CTL.ERR, 0, slot + 1);
      post({ error: `${e && e.message ? e.message : e}` });
    }
    Atomics.add(i32, CTL.DONE, 1);
    Atomics.notify(i32, CTL.DONE);
    if (stop) return;
  }
}

if (IS_NODE) {
  const { parentPort } = await import('node:worker_threads');
  parentPort.once('message', (msg) => { serve(msg, (m) => parentPort.postMessage(m)); parentPort.close(); });
} else {
  self.onmessage = (e) => { self.onmessage = null; serve(e.data, (m) => self.postMessage(m)); self.close(); };
}
