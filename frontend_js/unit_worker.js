// One worker of unit_workers.js (a Node worker_thread or a browser module Worker): its own
// wasm-simd engine over its own memory (nothing shared), gated before it says ready. Each job is
// one INT8 unit on the copies it was sent:
//   {id, a, transA, b, transB, nb, m, kk, n}  ->  {id, out}  (out's buffer transferred back)
//   a trap or a bad job                       ->  {id, error}
// init: {faultForTests} ('flip': the worker flips the last bit of every result; tests prove the
// caller's gate refuses such a worker).
import { createWasmEngine, gateEngine, gateUnit } from './wasm_gemm.js';

const isNode = typeof process !== 'undefined' && !!(process.versions && process.versions.node);

function serve(init, post, onJob) {
  let engine, bad;
  try {
    engine = createWasmEngine();
    bad = gateEngine(engine) || gateUnit(engine);
  } catch (e) { bad = e.message || String(e); }
  if (bad) { post({ ready: false, error: `its wasm-simd engine failed its gate: ${bad}` }); return; }
  const flip = init && init.faultForTests === 'flip';
  post({ ready: true });
  onJob((job) => {
    try {
      const { id, a, transA, b, transB, nb, m, kk, n } = job;
      const out = engine.qmatmulT(a, transA, b, transB, nb, m, kk, n);
      if (flip && out.length) new Uint8Array(out.buffer, out.byteOffset, out.byteLength)[0] ^= 1;
      post({ id, out }, [out.buffer]);
    } catch (e) {
      post({ id: job && job.id, error: `${e && e.message ? e.message : e}` });
    }
  });
}

if (isNode) {
  const { parentPort } = await import('node:worker_threads');
  parentPort.once('message', (init) => serve(init, (m, t) => parentPort.postMessage(m, t), (f) => parentPort.on('message', f)));
} else {
  self.onmessage = (e) => serve(e.data, (m, t) => self.postMessage(m, t || []), (f) => { self.onmessage = (ev) => f(ev.data); });
}
