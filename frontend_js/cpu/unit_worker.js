// One worker of unit_workers.js (a Node worker_thread or a browser module Worker): its own
// wasm-simd engine over its own memory (nothing shared), gated before it says ready. Each job is
// one INT8 unit on the copies it was sent, in two transferred buffers that go back with the answer:
//   {id, input: A then B (aLen + bLen doubles), output, transA, transB, nb, m, kk, n, r0, r1, aLen, bLen}
//     ->  {id, input, output}           output's first nb*(r1-r0)*n doubles: A's logical rows [r0, r1)
//                                       of the unit's result (wasm_gemm.js qmatmulT's row range)
//     ->  {id, input, output, error}    a trap or a bad job
// init: {faultForTests}: 'flip': the worker flips the lowest bit of every result (tests prove the
// caller's gate refuses such a worker); 'die-after:N': it throws out of its N-th job's handler,
// uncaught, as a crashing worker would (tests prove the caller computes its slice instead).
import { createWasmEngine, gateEngine, gateUnit } from '../wasm_gemm.js';
import { IS_NODE } from '../host.js';

function serve(init, post, onJob) {
  let engine, bad;
  try {
    engine = createWasmEngine();
    bad = gateEngine(engine) || gateUnit(engine);
  } catch (e) { bad = e.message || String(e); }
  if (bad) { post({ ready: false, error: `its wasm-simd engine failed its gate: ${bad}` }); return; }
  const fault = String((init && init.faultForTests) || ''), flip = fault === 'flip';
  let dieAfter = fault.startsWith('die-after:') ? Number(fault.slice(10)) : Infinity;
  post({ ready: true });
  onJob((job) => {
    const { id, input, output, transA, transB, nb, m, kk, n, r0, r1, aLen, bLen } = job || {};
    if (--dieAfter <= 0) throw new Error('a test fault: the worker dies');
    try {
      const outLen = nb * (r1 - r0) * n;
      if (!(input instanceof ArrayBuffer) || !(output instanceof ArrayBuffer) || !(aLen + bLen <= input.byteLength / 8) || !(outLen <= output.byteLength / 8)) {
        throw new Error('a job whose buffers do not fit its shape');
      }
      const out = new Float64Array(output, 0, outLen);
      engine.qmatmulT(new Float64Array(input, 0, aLen), transA, new Float64Array(input, 8 * aLen, bLen), transB, nb, m, kk, n, out, r0, r1);
      if (flip && outLen) new Uint8Array(output)[0] ^= 1;
      post({ id, input, output }, [input, output]);
    } catch (e) {
      const bufs = [input, output].filter((x) => x instanceof ArrayBuffer);
      post({ id, input, output, error: `${e && e.message ? e.message : e}` }, bufs);
    }
  });
}

if (IS_NODE) {
  const { parentPort } = await import('node:worker_threads');
  parentPort.once('message', (init) => serve(init, (m, t) => parentPort.postMessage(m, t), (f) => parentPort.on('message', f)));
} else {
  self.onmessage = (e) => serve(e.data, (m, t) => self.postMessage(m, t || []), (f) => { self.onmessage = (ev) => f(ev.data); });
}
