// The CPU backends' gates: the WebAssembly SIMD parts load here and pass; broken ones (each
// modelling a real failure) are rejected, so the gate can fail.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  createBackends, gateRowKernels, gateAdam, makeBackend, withEngine, referenceBackend, JS_ROWS,
} from '../../frontend_js/engines.js';
import { gateEngine, gateUnit } from '../../frontend_js/wasm_gemm.js';
import { cpuEngine } from '../../frontend_js/units.js';
import { createFloatKernels } from '../../frontend_js/wasm_float.js';
import { WasmUnitHost, gateWasmHost } from '../../frontend_js/gpu/wasm_host.js';
import { createWasmSha, createSubtleSha, gateSha, jsSha, weightHash } from '../../frontend_js/hashing.js';
import { forward, initParams, rmsnorm } from '../../frontend_js/model.js';
import { makeConfig } from '../../frontend_js/config.js';
import { Group } from '../../frontend_js/train.js';

const backends = await createBackends();
const best = backends[0];

test('the wasm-simd engine is built and passes its gates', () => {
  const names = backends.map((e) => e.name);
  assert.deepEqual(names, ['wasm-simd', 'cpu'], `wasm engine missing: ${best.notes.join('; ')}`);
  assert.equal(gateEngine(best.engine), null);
  assert.equal(gateUnit(best.engine), null);
});

test('the gates reject broken engines', () => {
  const wasm = best.engine;
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

test('the wasm row kernels are built, pass their gate, and the gate rejects broken ones', () => {
  assert.equal(best.parts.rows, 'wasm-simd', `wasm row kernels not used: ${best.notes.join('; ')}`);
  const fast = createFloatKernels();
  assert.equal(gateRowKernels(fast), null);
  const wrap = (edit) => ({ ...fast, softmaxRows: (src, R, W, causalT, divN, dst) => edit(src, R, W, causalT, divN, dst) });
  const broken = {
    // one output a ULP off (e.g. a fused multiply-add or another division order)
    ulp: wrap((src, R, W, c, d, dst) => { const st = fast.softmaxRows(src, R, W, c, d, dst); dst[dst.length >> 1] *= 1 + 2 ** -52; return st; }),
    // the causal mask forgotten: every row over all W columns
    unmasked: wrap((src, R, W, c, d, dst) => fast.softmaxRows(src, R, W, 0, d, dst)),
    // exp's range check lost: x - m below -708 not flushed to +0 (denormal or garbage scaling)
    noRange: wrap((src, R, W, c, d, dst) => {
      const st = fast.softmaxRows(src, R, W, c, d, dst);
      for (let i = 0; i < dst.length; i++) if (dst[i] === 0 && src[i] > -Infinity && i % W < (c ? (Math.floor(i / W) % c) + 1 : W)) dst[i] = 5e-324;
      return st;
    }),
    // the row max taken as the last maximum's neighbour (an off-by-one in the max loop)
    maxOffByOne: wrap((src, R, W, c, d, dst) => {
      const shifted = Float64Array.from(src, (v, i) => (i % W === 0 ? v : src[i - 1]));
      return fast.softmaxRows(shifted, R, W, c, d, dst);
    }),
  };
  for (const [what, k] of Object.entries(broken)) assert.notEqual(gateRowKernels(k), null, `${what} kernels passed the gate`);
  const rowsBroken = {
    // RMSNorm's epsilon lost (a constant not passed through)
    noEps: { ...fast, rmsnormRows: (x, g, N, C, eps, ...out) => fast.rmsnormRows(x, g, N, C, 0, ...out) },
    // the gain gradient summed left to right instead of by tree_sum
    sequentialDg: { ...fast, rmsnormBackRows: (dy, g, xhat, r, N, C, dx, dg) => {
      fast.rmsnormBackRows(dy, g, xhat, r, N, C, dx, dg);
      for (let c = 0; c < C; c++) { let a = 0; for (let n = 0; n < N; n++) a += dy[n * C + c] * xhat[n * C + c]; dg[c] = a; }
    } },
    // softmax backward with the scale applied inside, p * scale * (dp - d)
    scaleInside: { ...fast, softmaxBackRows: (dp, p, R, T, scale, ds) => {
      fast.softmaxBackRows(dp, p, R, T, 1.0, ds);
      for (let i = 0; i < ds.length; i++) ds[i] = ds[i] === 0 ? ds[i] : (p[i] * scale) * (ds[i] / p[i]);
    } },
    // ReLU as max(h, 0) with NaN dropped to 0 (np.maximum keeps NaN)
    reluDropsNaN: { ...fast, relu: (h, out) => { fast.relu(h, out); for (let i = 0; i < h.length; i++) if (h[i] !== h[i]) out[i] = 0; } },
    // the attention scale not applied inside the softmax rows
    scaleLost: { ...fast, softmaxRows: (src, R, W, c, d, dst) => fast.softmaxRows(src, R, W, c, d, dst, 1.0) },
  };
  for (const [what, k] of Object.entries(rowsBroken)) assert.notEqual(gateRowKernels(k), null, `${what} kernels passed the gate`);
});

test('the wasm Adam update is built, passes its gate, and the gate rejects broken ones', () => {
  assert.equal(best.parts.adam, 'wasm-simd', `wasm Adam not used: ${best.notes.join('; ')}`);
  const fast = createFloatKernels();
  assert.equal(gateAdam(fast), null);
  const broken = {
    // the learning rate lost on the way in (a parameter passed in the wrong slot)
    lostLr: { adamStep: (w, g, m, v, lr, bc1, bc2) => fast.adamStep(w, g, m, v, 1.0, bc1, bc2) },
    // the last element of an odd-length tensor left out (a pair loop without its tail)
    dropsTail: { adamStep: (w, g, m, v, lr, bc1, bc2) => { const n = w.length & ~1; if (n) fast.adamStep(w.subarray(0, n), g.subarray(0, n), m.subarray(0, n), v.subarray(0, n), lr, bc1, bc2); } },
    // bias corrections swapped
    swapped: { adamStep: (w, g, m, v, lr, bc1, bc2) => fast.adamStep(w, g, m, v, lr, bc2, bc1) },
  };
  for (const [what, k] of Object.entries(broken)) assert.notEqual(gateAdam(k), null, `${what} Adam passed the gate`);
});

test("the GPU engine's wasm host (audit, pack8) passes its gate, and the gate rejects broken ones", () => {
  const host = new WasmUnitHost();
  assert.equal(gateWasmHost(host), null);
  const variant = (auditAt) => Object.assign(Object.create(host), { top: 0, auditAt });
  const real = (h, args) => WasmUnitHost.prototype.auditAt.apply(h, args);
  const broken = {
    // the audit skipped: every result passes
    skipped: variant(() => 0),
    // an off-by-one in the row loop: the last row of a batch never checked
    lastRowUnchecked: variant(function (...args) { const row = real(this, args), m = args[5]; return row && row % m === 0 ? 0 : row; }),
    // only the first batch walked (the batch stride lost)
    firstBatchOnly: variant(function (...args) { const row = real(this, args); return row > args[5] ? 0 : row; }),
    // the failing row reported one off (the reason would name the wrong row)
    wrongRow: variant(function (...args) { const row = real(this, args); return row ? row + 1 : 0; }),
  };
  // pack8 with its byte order reversed within each int8x4 word
  broken.byteOrder = Object.assign(Object.create(host), { top: 0, pack8(src, dst, n) {
    host.pack8(src, dst, n);
    const b = new Uint8Array(host.mem.buffer, dst, n);
    for (let i = 0; i < n; i += 4) b.subarray(i, i + 4).reverse();
  } });
  for (const [what, h] of Object.entries(broken)) assert.notEqual(gateWasmHost(h), null, `${what} audit passed the gate`);
});

test('the SHA-256s are gated, the gate rejects broken ones, and every backend hashes as the reference', async () => {
  assert.equal(best.parts.sha, 'wasm', `wasm SHA-256 not used: ${best.notes.join('; ')}`);
  assert.equal(best.parts.shaAsync, 'webcrypto', `WebCrypto SHA-256 not used: ${best.notes.join('; ')}`);
  for (const sha of [createWasmSha(), createSubtleSha(), jsSha]) assert.equal(await gateSha(sha), null, sha.name);
  const wasm = createWasmSha();
  const broken = {
    // only the first part of a message hashed (a loop over parts that stops early)
    firstPartOnly: { name: 'firstPartOnly', hexOf: (parts) => wasm.hexOf(parts.slice(0, 1)) },
    // a message ending on a block boundary hashed with a stray zero byte (an off-by-one in the padding)
    blockEdge: { name: 'blockEdge', hexOf: (parts) => {
      const n = parts.reduce((a, p) => a + p.length, 0);
      return wasm.hexOf(n % 64 ? parts : [...parts, new Uint8Array(1)]);
    } },
  };
  for (const [what, sha] of Object.entries(broken)) assert.notEqual(await gateSha(sha), null, `${what} SHA-256 passed the gate`);
  const params = { a: Float64Array.from({ length: 1001 }, (_, i) => Math.sin(i) * 2 ** (i % 60 - 30)), b: new Float64Array([-0, 0, NaN]) };
  const want = weightHash(params);
  for (const b of [...backends, referenceBackend]) {
    assert.equal(b.weightHash(params), want, `${b.name} (${b.parts.sha}) weightHash`);
    assert.equal(await b.weightHashAsync(params), want, `${b.name} (${b.parts.shaAsync}) weightHashAsync`);
  }
});

test('a backend is one value: every part present, and a bare engine is refused by name', async () => {
  assert.deepEqual(Object.keys(referenceBackend.parts), ['rows', 'adam', 'sha', 'shaAsync']);
  assert.equal(referenceBackend.rmsnorm, rmsnorm, 'the reference backend runs model.js itself');
  assert.throws(() => makeBackend({ engine: cpuEngine, rows: { ...JS_ROWS, relu: undefined } }), /row piece relu is missing/);
  assert.throws(() => makeBackend({ engine: {} }), /engine needs gemm or qmatmulT/);
  const cfg = makeConfig({ width: 16, seq_len: 16, batch: 2, layers: 1, heads: 4 });
  const idx = new Int32Array(2 * 16);
  await assert.rejects(forward(initParams(cfg), cfg, idx, 2, 16, null, cpuEngine), /forward: needs a backend from engines\.js.*keys name, gemm, gemmBT/);
  assert.throws(() => new Group(cfg, 1, new Uint16Array(4096), best.engine), /Group: needs a backend/);
  // withEngine swaps the GEMM only: the other parts are the backend's own
  const swapped = withEngine(best, cpuEngine);
  assert.equal(swapped.name, 'cpu');
  assert.deepEqual(swapped.parts, best.parts);
  assert.equal(swapped.causalSoftmax, best.causalSoftmax);
  assert.equal(swapped.adamStep, best.adamStep);
});
