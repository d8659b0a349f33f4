// The JS CPU mirror against the reference's golden fixtures, bit for bit:
//   DAISY_FIXTURES=DIR node --test tests/js/     (DIR from `python -m daisy.fixtures DIR`)
// tests/test_js_mirror.py runs both steps. A mismatch names the first differing index with both
// values and their float64 bits.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { f64Bits } from '../../frontend_js/fixtures.js';
import { loadFixture, assertSame, REGEN } from './helpers.mjs';
import { quantizeRows, quantizeCols, cpuEngine, epilogue, qmatmul, unitDot, SCALE_FLOOR } from '../../frontend_js/units.js';
import { key, draw } from '../../frontend_js/prng.js';
import { makeConfig } from '../../frontend_js/config.js';
import { forward, lossAndGrads, paramShapes, initParams } from '../../frontend_js/model.js';
import { Group } from '../../frontend_js/train.js';
import { createBackends, makeBackend, withEngine, referenceBackend } from '../../frontend_js/engines.js';

const backends = await createBackends();
const best = backends[0];       // forward, backward and training on the backend the trainer uses

const cfgOf = (header) => makeConfig(header.config);
const paramsOf = (fx, cfg) => Object.fromEntries(paramShapes(cfg).map(([n]) => [n, fx.tensors[`param.${n}`].data]));

for (const { engine } of backends) {
  test(`units: quantizer, int8 GEMM and epilogue cases (${engine.name})`, async () => {
    const fx = loadFixture('units.dsyf');
    for (let i = 0; i < fx.header.meta.cases; i++) {
      const T = (n) => fx.tensors[`case${i}.${n}`];
      const [M, K] = T('a').shape, N = T('b').shape[1];
      const A = quantizeRows(T('a').data, 1, M, K), B = quantizeCols(T('b').data, 1, K, N);
      assertSame(`case${i}.qa`, A.q, T('qa').data);
      assertSame(`case${i}.sa`, A.s, T('sa').data);
      assertSame(`case${i}.qb`, B.q, T('qb').data);
      assertSame(`case${i}.sb`, B.s, T('sb').data);
      const acc = await engine.gemm(A.q, B.q, 1, M, K, N);
      assertSame(`case${i}.acc`, acc, T('acc').data);
      assertSame(`case${i}.out`, epilogue(acc, A.s, B.s, 1, M, N), T('out').data);
      assertSame(`case${i}.qmatmul`, await qmatmul(engine, T('a').data, T('b').data, 1, M, K, N), T('out').data);
    }
  });
}

// unitDot (the self-audits' one element, fused) against the reference's whole results, element by element
test('units: unitDot of every row and column = the reference qmatmul, element by element', () => {
  const fx = loadFixture('units.dsyf');
  for (let i = 0; i < fx.header.meta.cases; i++) {
    const T = (n) => fx.tensors[`case${i}.${n}`];
    const [M, K] = T('a').shape, N = T('b').shape[1], a = T('a').data, b = T('b').data;
    const got = new Float64Array(M * N), col = new Float64Array(K);
    for (let j = 0; j < N; j++) {
      for (let k = 0; k < K; k++) col[k] = b[k * N + j];
      for (let r = 0; r < M; r++) got[r * N + j] = unitDot(a.subarray(r * K, (r + 1) * K), col, K);
    }
    assertSame(`case${i}.out via unitDot`, got, T('out').data);
  }
});

// ... and against quantizeRows's path on the values a row can hold: ties, zeros of both signs,
// rows under the scale's floor, huge, infinite and NaN values (the Int8Array store's NaN -> 0)
test('units: unitDot = quantizeRows + the integer dot + the epilogue on edge values (seeded)', () => {
  const seed = Number(process.env.DAISY_FUZZ_SEED || Date.now() % 1e9);
  console.log(`unitDot sweep seed ${seed} (DAISY_FUZZ_SEED reproduces it)`);
  const k0 = key(0x756e6974, seed >>> 0);
  let n = 0;
  const r = (m) => draw(k0, n++) % m;
  const special = [0, -0, 0.5, -0.5, 1.5, 2.5, -2.5, 127, -127, 1e300, -1e300, SCALE_FLOOR, SCALE_FLOOR / 3, 5e-324, Infinity, -Infinity, NaN];
  const value = (scale) => (r(5) === 0 ? special[r(special.length)] : ((r(2 ** 20) / 2 ** 19) - 1) * scale);
  const bits = new Float64Array(2), words = new Uint32Array(bits.buffer);
  for (let t = 0; t < 3000; t++) {
    const K = 1 + r(70), scale = [1, 1e-20, 1e-300, 1e200, 127][r(5)];
    const row = Float64Array.from({ length: K }, () => value(scale)), col = Float64Array.from({ length: K }, () => value(scale));
    const qa = quantizeRows(row, 1, 1, K), qb = quantizeRows(col, 1, 1, K);
    let acc = 0;
    for (let k = 0; k < K; k++) acc += qa.q[k] * qb.q[k];
    bits[0] = unitDot(row, col, K); bits[1] = (acc * qa.s[0]) * qb.s[0];
    if (words[0] !== words[2] || words[1] !== words[3]) {
      const hex = (i) => `${words[2 * i + 1].toString(16).padStart(8, '0')}${words[2 * i].toString(16).padStart(8, '0')}`;
      assert.fail(`seed ${seed}, case ${t}: unitDot ${bits[0]} (bits ${hex(0)}), quantizeRows path ${bits[1]} (bits ${hex(1)}) (row ${Array.from(row)}, col ${Array.from(col)})`);
    }
  }
});

test('init: the seeded parameters of the fixture config', () => {
  const fx = loadFixture('forward.dsyf'), cfg = cfgOf(fx.header);
  const init = initParams(cfg);
  for (const [name] of paramShapes(cfg)) assertSame(`param.${name}`, init[name], fx.tensors[`param.${name}`].data);
});

test(`forward: logits and loss of one batch (${best.name})`, async () => {
  const fx = loadFixture('forward.dsyf'), cfg = cfgOf(fx.header);
  const params = paramsOf(fx, cfg);
  const [B, T] = fx.tensors.x.shape;
  const logits = await forward(params, cfg, fx.tensors.x.data, B, T, null, best);
  assertSame('logits', logits, fx.tensors.logits.data);
  const { loss } = await forward(params, cfg, fx.tensors.x.data, B, T, fx.tensors.y.data, best);
  assert.equal(f64Bits(loss), fx.header.meta.loss_bits, `loss ${loss} vs reference ${fx.header.meta.loss}; ${REGEN}`);
});

test(`backward: every gradient of one batch (${best.name})`, async () => {
  const fx = loadFixture('backward.dsyf'), cfg = cfgOf(fx.header);
  const params = paramsOf(fx, cfg);
  const [B, T] = fx.tensors.x.shape;
  const { loss, grads } = await lossAndGrads(params, cfg, fx.tensors.x.data, fx.tensors.y.data, B, T, best);
  assert.equal(f64Bits(loss), fx.header.meta.loss_bits, `loss ${loss} vs reference ${fx.header.meta.loss}`);
  assert.deepEqual(Object.keys(grads), paramShapes(cfg).map(([n]) => n), 'gradient order');
  for (const name of Object.keys(grads)) assertSame(`grad.${name}`, grads[name], fx.tensors[`grad.${name}`].data);
});

// The JS quantizer path as the WGSL engine uses it: an engine with only gemm(qa, qb (K, N)).
const gemmOnly = { name: 'gemm-only (as the GPU engine)', gemm: (...args) => Promise.resolve(cpuEngine.gemm(...args)) };
for (const engine of [cpuEngine, gemmOnly]) {
  test(`backward through the JS quantizers: every gradient (${engine.name})`, async () => {
    const fx = loadFixture('backward.dsyf'), cfg = cfgOf(fx.header);
    const [B, T] = fx.tensors.x.shape;
    const { loss, grads } = await lossAndGrads(paramsOf(fx, cfg), cfg, fx.tensors.x.data, fx.tensors.y.data, B, T, withEngine(referenceBackend, engine));
    assert.equal(f64Bits(loss), fx.header.meta.loss_bits, `loss ${loss} vs reference ${fx.header.meta.loss}`);
    for (const name of Object.keys(grads)) assertSame(`grad.${name}`, grads[name], fx.tensors[`grad.${name}`].data);
  });
}

// The row pieces in JS (the references the wasm row kernels are gated against) give the same bits.
test('backward with the JS row pieces (wasm row kernels off): every gradient', async () => {
  const fx = loadFixture('backward.dsyf'), cfg = cfgOf(fx.header);
  const [B, T] = fx.tensors.x.shape;
  const jsRows = makeBackend({ engine: best.engine });
  assert.equal(jsRows.parts.rows, 'js');
  const { loss, grads } = await lossAndGrads(paramsOf(fx, cfg), cfg, fx.tensors.x.data, fx.tensors.y.data, B, T, jsRows);
  assert.equal(f64Bits(loss), fx.header.meta.loss_bits, `loss ${loss} vs reference ${fx.header.meta.loss}`);
  for (const name of Object.keys(grads)) assertSame(`grad.${name}`, grads[name], fx.tensors[`grad.${name}`].data);
});

test(`train: 20 steps of P peers give the reference losses and hashes (${best.name})`, async () => {
  const fx = loadFixture('train20.dsyf'), cfg = cfgOf(fx.header);
  const { peers, steps, hashes, loss_bits: lossBits } = fx.header.meta;
  const group = new Group(cfg, peers, fx.tensors.stream.data, best);
  for (let s = 0; s < steps; s++) {
    const r = await group.step();
    assert.equal(r.step, s + 1);
    assert.equal(f64Bits(r.loss), lossBits[s], `step ${s + 1}: loss ${r.loss} (bits ${f64Bits(r.loss)}) vs reference bits ${lossBits[s]}; ${REGEN}`);
    assert.deepEqual(r.hashes, hashes[s], `step ${s + 1}: weight hashes differ from the reference; ${REGEN}`);
  }
});
