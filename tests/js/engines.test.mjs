// The CPU engines' gates: the WebAssembly SIMD engine loads here and passes; broken engines
// (each modelling a real failure) are rejected, so the gate can fail.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { engines, wasmUnavailable } from '../../frontend_js/engines.js';
import { gateEngine, gateUnit } from '../../frontend_js/wasm_gemm.js';
import { cpuEngine } from '../../frontend_js/units.js';

test('the wasm-simd engine is built and passes its gates', () => {
  const names = engines().map((e) => e.name);
  assert.deepEqual(names, ['wasm-simd', 'cpu'], `wasm engine missing: ${wasmUnavailable}`);
  assert.equal(gateEngine(engines()[0]), null);
  assert.equal(gateUnit(engines()[0]), null);
});

test('the gates reject broken engines', () => {
  const wasm = engines()[0];
  const broken = {
    // sign extension lost: int8 lanes read as unsigned bytes
    unsigned: { ...cpuEngine, gemmBT: (qa, qb, ...r) => cpuEngine.gemmBT(Uint8Array.from(qa, (v) => v & 0xff), qb, ...r) },
    // saturating int16 accumulation instead of exact int32
    saturating: { ...cpuEngine, gemmBT: (...args) => cpuEngine.gemmBT(...args).map((v) => Math.max(-32768, Math.min(32767, v))) },
    // off by one in the K loop: the last k dropped
    shortK: { ...cpuEngine, gemmBT: (qa, qb, nb, m, k, n) => (k === 1 ? new Int32Array(nb * m * n)
      : cpuEngine.gemmBT(qa.filter((_, i) => i % k !== k - 1), qb.filter((_, i) => i % k !== k - 1), nb, m, k - 1, n)) },
  };
  for (const [what, e] of Object.entries(broken)) assert.notEqual(gateEngine(e), null, `${what} engine passed the gate`);
  // a fused unit whose epilogue multiplies in the other order, acc * (s_row * s_col)
  const reordered = {
    qmatmulT: (a, ta, b, tb, nb, m, k, n) => {
      const out = wasm.qmatmulT(a, ta, b, tb, nb, m, k, n);
      const ones = wasm.qmatmulT(a, ta, b, tb, nb, m, k, n);
      for (let i = 0; i < out.length; i++) out[i] = ones[i] === 0 ? out[i] : out[i] * (1 + 2 ** -52);
      return out;
    },
  };
  assert.notEqual(gateUnit(reordered), null, 'a unit off by one ULP passed the gate');
});
