// The JS CPU mirror against the reference's golden fixtures, bit for bit:
//   DAISY_FIXTURES=DIR node --test tests/js/     (DIR from `python -m daisy.fixtures DIR`)
// tests/test_js_mirror.py runs both steps. A mismatch names the first differing index with both
// values and their float64 bits.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { f64Bits } from '../../frontend_js/fixtures.js';
import { loadFixture, assertSame, REGEN } from './helpers.mjs';
import { quantizeRows, quantizeCols, cpuEngine, epilogue, qmatmul } from '../../frontend_js/units.js';
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
