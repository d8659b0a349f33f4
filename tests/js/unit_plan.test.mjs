// The f64 unit's dispatch plan (frontend_js/gpu/f64.js unitPlan, quantThreads, gemmSplits): pure
// rules, checked without a GPU. The kernels' bits do not depend on them (tests/test_webgpu_f64.py
// checks those); a bad plan would leave rows unquantized, slices empty or the GPU idle.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { unitPlan, quantThreads, gemmSplits, DEFAULT_GEMM_TUNING as T } from '../../frontend_js/gpu/f64.js';

test('threads per quantized row: about one code word each, 4 to 64, a power of two', () => {
  assert.deepEqual([1, 16, 17, 32, 128, 129, 256, 257, 4096].map(quantThreads), [4, 4, 8, 8, 32, 64, 64, 64, 64]);
  for (let k = 1; k <= 5000; k += 7) {
    const t = quantThreads(k);
    assert.ok(t >= 4 && t <= 64 && 64 % t === 0, `K=${k}: ${t}`);
    assert.ok(t === 4 || t === 64 || Math.ceil(k / 4) > t / 2, `K=${k}: ${t} threads, half of them without a word`);
  }
});

test('split-K: the weight gradients of the largest settings fill the GPU, everything else stays whole', () => {
  const splits = ([m, k, n], nb = 1) => unitPlan(nb, m, k, n, true, false, T).splits;
  assert.deepEqual([[128, 4096, 128], [384, 4096, 128], [512, 4096, 128], [128, 4096, 512], [257, 4096, 128]].map((s) => splits(s)), [16, 8, 4, 4, 8]);
  assert.equal(splits([4096, 128, 384]), 1);                 // the forward products: many tiles, short K
  assert.equal(splits([128, 128, 16], 256), 1);              // attention: 256 batches
  assert.equal(splits([3, 4096, 5]), 16);                    // the gate's K = 4096 case
  assert.equal(splits([40, 1030, 33], 2), 4);                // the gate's ragged split-K case
  for (let tiles = 1; tiles < 600; tiles += 13) {
    for (let k4 = 1; k4 < 3000; k4 += 37) {
      const s = gemmSplits(tiles, k4);
      assert.ok(s >= 1 && s <= 16 && (s & (s - 1)) === 0, `${tiles} tiles, K4 ${k4}: ${s}`);
      // every slice of gemm_int8.wgsl's split-K non-empty and at least 64 words (its chunk rule)
      const chunk = Math.ceil(Math.ceil(k4 / s) / T.TK) * T.TK;
      if (s > 1) assert.ok(chunk * (s - 1) < k4 && chunk >= 64, `${tiles} tiles, K4 ${k4}: ${s} slices of ${chunk}`);
    }
  }
});

test('the plan covers every row and column and the parameters match the kernels', () => {
  for (const [nb, m, k, n, ta, tb] of [[1, 4096, 128, 384, false, true], [256, 128, 16, 128, false, true], [1, 257, 4096, 128, true, false], [2, 33, 70, 40, false, false]]) {
    const p = unitPlan(nb, m, k, n, ta, tb, T), k4 = Math.ceil(k / 4), tpr = quantThreads(k);
    assert.ok(p.quantA.groups[0] * (64 / tpr) >= m && (p.quantA.groups[0] - 1) * (64 / tpr) < m && p.quantA.groups[1] === nb);
    assert.ok(p.quantB.groups[0] * (64 / tpr) >= n && p.quantB.groups[1] === nb);
    assert.deepEqual(p.quantA.params.slice(0, 3), [m, k, k4]); assert.equal(p.quantA.params[6], tpr);
    assert.deepEqual(p.quantB.params.slice(0, 3), [n, k, k4]);
    assert.deepEqual(p.mm.params.slice(0, 5), [m, n, k4, nb, p.splits]); assert.equal(p.mm.groups[2], nb * p.splits);
    assert.deepEqual(p.epi.params, [m, n, p.splits, nb * m * n]);
    // strides: A's row i of K in place (transposed: a column of the stored (K, M))
    assert.deepEqual(p.quantA.params.slice(3, 6), ta ? [1, m, k * m] : [k, 1, m * k]);
    assert.deepEqual(p.quantB.params.slice(3, 6), tb ? [k, 1, n * k] : [1, n, k * n]);
  }
});

test("the layout before issue 26's second pass, for the profile: one workgroup per row, one slice", () => {
  const p = unitPlan(1, 257, 4096, 128, true, false, T, { maxSplits: 1, threads: 64 });
  assert.equal(p.splits, 1);
  assert.deepEqual([p.quantA.groups, p.quantB.groups, p.quantA.params[6]], [[257, 1], [128, 1], 64]);
  assert.equal(unitPlan(256, 128, 16, 128, false, true, T, { threads: 64 }).quantA.groups[0], 128);
});
