// The exchange codec's JS twin (frontend_js/exchange_codec.js) against the reference
// (daisy/exchange_codec.py) through exchange.dsyf, bit for bit: every message byte, every decoded
// and reduced value, the decoder's refusals word for word, 5 int8 steps of a 4-peer group (rsag);
// SimulatedCollective as daisy/collective.py's (shards 4+ peers, the same refusals).
//   python -m daisy.fixtures DIR; DAISY_FIXTURES=DIR node --test tests/js/exchange_codec.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { loadFixture, assertSame, REGEN } from './helpers.mjs';
import { BLOCK, CodecError, codecFor } from '../../frontend_js/exchange_codec.js';
import { SimulatedCollective, codecReduce, flattenGrads } from '../../frontend_js/collective.js';
import { makeConfig } from '../../frontend_js/config.js';
import { Group } from '../../frontend_js/train.js';
import { loadStream } from '../../frontend_js/cli.mjs';
import { key, draw } from '../../frontend_js/prng.js';

const fx = loadFixture('exchange.dsyf');
const meta = fx.header.meta;
const T = (name) => fx.tensors[name].data;
const bytesOf = (i8) => new Uint8Array(i8.buffer, i8.byteOffset, i8.byteLength);

test('exchange codec: the block size is the reference\'s', () => assert.equal(BLOCK, meta.block));

test('exchange codec: encode and decode = the reference, byte for byte and bit for bit', () => {
  assert.ok(meta.cases.length >= 8);
  for (const c of meta.cases) {
    const codec = codecFor(c.codec), p = `${c.codec}.${c.i}`;
    const x = T(`${p}.values`);
    const msg = codec.encode(x, { seed: c.seed, step: c.step, slot: c.slot, offset: c.offset });
    assertSame(`${p}: message`, msg, bytesOf(T(`${p}.message`)));
    assertSame(`${p}: decoded`, codec.decode(bytesOf(T(`${p}.message`)), x.length), T(`${p}.decoded`));
  }
});

test('exchange codec: reduce and reduceMessage = the reference (slot-ordered mean, int8 re-quantized)', () => {
  for (const r of meta.reduces) {
    const codec = codecFor(r.codec), p = `${r.codec}.reduce${r.j}`;
    const all = T(`${p}.slices`), n = all.length / r.P;
    const slices = Array.from({ length: r.P }, (_, s) => all.subarray(s * n, (s + 1) * n));
    const o = { seed: r.seed, step: r.step, offset: r.offset };
    assertSame(`${p}: message`, codec.reduceMessage(slices, o), bytesOf(T(`${p}.message`)));
    assertSame(`${p}: G`, codec.reduce(slices, o), T(`${p}.G`));
  }
});

test('exchange codec: a malformed message is refused with the reference\'s reason', () => {
  assert.ok(meta.malformed.length >= 7);
  for (const m of meta.malformed) {
    const bytes = Uint8Array.from(m.hex.match(/../g) || [], (h) => parseInt(h, 16));
    assert.throws(() => codecFor(m.codec).decode(bytes, m.n), (e) => e instanceof CodecError && e.message === m.error,
      `${m.codec} n=${m.n}: expected "${m.error}"`);
  }
});

test('exchange codec: a non-finite or out-of-range gradient is refused before encoding (int8)', () => {
  const int8 = codecFor('int8');
  const o = { seed: 1, step: 0, slot: 0, offset: 0 };
  for (const [v, why] of [[NaN, 'gradient value nan at index 3 is not finite'], [-Infinity, 'gradient value -inf at index 3 is not finite'],
    [2 ** 64, "gradient block 0 is out of the int8 exchange's range (max |value| must be below 2^64)"]]) {
    const x = new Float64Array(10); x[3] = v;
    assert.throws(() => int8.encode(x, o), (e) => e instanceof CodecError && e.message === why, why);
  }
  assert.throws(() => int8.encode(new Float64Array(4), { ...o, offset: 100 }), /offset 100 is not a multiple of the block size 256/);
});

// reduce skips the reduced message (quantize's `values` sink): the same bits as decoding it, and
// the same refusals (seeded; the seed is printed)
test('exchange codec: int8 reduce = decode(reduceMessage) bit for bit, and refuses what it refuses', () => {
  const int8 = codecFor('int8'), seed = Number(process.env.DAISY_FUZZ_SEED || Date.now() % 1e9);
  console.log(`reduce sweep seed ${seed} (DAISY_FUZZ_SEED reproduces it)`);
  const k = key(0x72656475, seed >>> 0);
  let d = 0;
  const r = (m) => draw(k, d++) % m;
  const special = [0, -0, 1e-300, -1e-300, 5e-324, 1e18, -1e18, 1.5, -2.5];
  for (let t = 0; t < 200; t++) {
    const P = 1 + r(5), n = 1 + r(3 * BLOCK), scale = [1, 1e-12, 1e12, 1e-310][r(4)], zeroBlock = r(3) === 0;
    const slices = Array.from({ length: P }, () => Float64Array.from({ length: n }, (_, i) =>
      (zeroBlock && i < BLOCK ? 0 : r(6) === 0 ? special[r(special.length)] : ((r(2 ** 20) / 2 ** 19) - 1) * scale)));
    const o = { seed: r(1000), step: r(1000), offset: BLOCK * r(4) };
    const want = int8.decode(int8.reduceMessage(slices, o), n), got = int8.reduce(slices, o);
    const i = want.findIndex((v, j) => !Object.is(v, got[j]));
    assert.equal(i, -1, `seed ${seed}, case ${t} (P ${P}, n ${n}): value ${i}: reduce ${got[i]}, decode(reduceMessage) ${want[i]}`);
  }
  const o = { seed: 1, step: 2, offset: 0 };
  for (const v of [NaN, Infinity, 2 ** 66]) {          // (the mean of 0 and 2^66 is over the range)
    const slices = [new Float64Array(300), new Float64Array(300)]; slices[1][260] = v;
    let why = null;
    try { int8.reduceMessage(slices, o); } catch (e) { why = e.message; }
    assert.ok(why, `${v}: reduceMessage refused nothing`);
    assert.throws(() => int8.reduce(slices, o), (e) => e instanceof CodecError && e.message === why, why);
  }
});

// random shapes of flat gradients (seeded; the seed is printed on failure)
test('exchange codec: int8 G is the same in both topologies for any P and N; the shard bounds fall on blocks', () => {
  const seed = 0x21c0dec;
  const r = ((k) => { let i = 0; return () => draw(k, i++); })(key(seed));
  const int8 = codecFor('int8');
  for (let trial = 0; trial < 12; trial++) {
    const P = 1 + (r() % 7), N = 1 + (r() % 3000);
    const flats = Array.from({ length: P }, () => Float64Array.from({ length: N }, () => ((r() >>> 0) / 2 ** 32 - 0.5) * 2 ** ((r() % 40) - 30)));
    const b = int8.shardBounds(N, P);
    assert.equal(b[0], 0); assert.equal(b[P], N);
    for (let k = 1; k < P; k++) assert.ok(b[k] % BLOCK === 0 || b[k] === N, `seed ${seed}: bound ${b[k]} of N=${N} P=${P} is inside a block`);
    const whole = codecReduce(int8, flats, { seed: 9, step: trial, topology: 'allgather' });
    const sharded = codecReduce(int8, flats, { seed: 9, step: trial, topology: 'rsag' });
    assertSame(`seed ${seed} trial ${trial} (P=${P}, N=${N}): rsag vs all-gather`, sharded, whole);
  }
});

test('exchange codec: a 4-peer int8 group (rsag) = the reference\'s hashes, 5 steps', async () => {
  const t = meta.train_int8;
  const group = new Group(makeConfig(t.config), t.peers, loadStream(null));
  for (let i = 0; i < t.hashes.length; i++) {
    const out = await group.step();
    assert.equal(out.hashes[0], t.hashes[i], `step ${i + 1}: JS ${out.hashes[0]}, reference ${t.hashes[i]}; ${REGEN}`);
  }
});

test('SimulatedCollective mirrors daisy/collective.py: 4+ peers reduced shard by shard, misuse refused with its messages', async () => {
  const shapes = [['a', [3, 300]], ['b', [77]]];
  const grads = (s) => ({ a: Float64Array.from({ length: 900 }, (_, i) => Math.sin(i + 31 * s) * 1e-2), b: Float64Array.from({ length: 77 }, (_, i) => Math.cos(i * s)) });
  const sim = new SimulatedCollective(shapes, { seed: 3, exchange: 'int8' });
  const outs = [0, 1, 2, 3].map((s) => sim.exchange(0, [0, 1, 2, 3], s, 1, grads(s)));
  const got = (await outs[0]).grads;
  const want = codecReduce(codecFor('int8'), [0, 1, 2, 3].map((s) => flattenGrads(grads(s), ['a', 'b'])), { seed: 3, step: 0, topology: 'rsag' });
  assertSame('P=4 G', flattenGrads(got, ['a', 'b']), want);
  const c = new SimulatedCollective(shapes);
  c.exchange(0, [0, 1], 0, 1, grads(0));
  assert.throws(() => c.exchange(0, [0, 1], 0, 1, grads(0)), /step 0: slot 0 posted twice/);
  assert.throws(() => c.exchange(0, [0, 1], 2, 1, grads(0)), /slot 2 is outside the roster of 2 peers/);
  assert.throws(() => c.exchange(0, [0, 1, 2], 1, 1, grads(0)), /step 0: roster of 3 peers, but the step began with 2/);
  assert.throws(() => c.exchange(1, [0, 1], 0, 1, grads(0)), /step 1 posted while step 0 still waits for slots/);
});
