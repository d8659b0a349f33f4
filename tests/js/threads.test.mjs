// The threaded CPU backend (frontend_js/cpu/threads.js): the same bits on 1, 2 and 4 threads as the
// JS mirror (referenceBackend) and the wasm-simd backend, step by step, at the tiny test settings
// with every call split (routing thresholds 0), at odd shapes (odd width, T not a multiple of 4:
// the pieces that fall back), and at one mid size with the default routing. A mismatch names the
// step, both hashes and the first differing weight.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { createThreadedBackend } from '../../frontend_js/cpu/threads.js';
import { defaultThreads, MAX_THREADS } from '../../frontend_js/cpu/workers.js';
import { referenceBackend, bestBackend, JS_ROWS } from '../../frontend_js/engines.js';
import { run, firstMismatch, closedAfter, TINY, ODD } from './group_runs.mjs';
import { sameBits } from '../../frontend_js/bits.js';
import { StepArena } from '../../frontend_js/arena.js';

const threaded = closedAfter((threads, opts = {}) => createThreadedBackend({ threads, ...opts }));

for (const [what, settings, steps] of [['tiny', TINY, 3], ['odd shapes', ODD, 2]]) {
  test(`${what}: every call split, 1, 2 and 4 threads give the JS mirror's hashes`, async () => {
    const want = await run(settings, referenceBackend, steps);
    for (const n of [1, 2, 4]) {
      const got = await run(settings, await threaded(n, { minUnitMacs: 0, minRowElements: 0 }), steps);
      const bad = firstMismatch(got, want, `${n} threads`);
      assert.equal(bad, null, bad);
    }
  });
}

test('mid size, default routing: 1, 2 and 4 threads give the wasm-simd and JS mirror hashes', async () => {
  const mid = { width: 64, seq_len: 64, batch: 8, layers: 1, heads: 4 };
  const ref = await run(mid, referenceBackend, 2);
  const wasm = await run(mid, await bestBackend(), 2);
  assert.equal(firstMismatch(wasm, ref, 'wasm-simd'), null);
  for (const n of [1, 2, 4]) {
    const got = await run(mid, await threaded(n), 2);
    const bad = firstMismatch(got, ref, `${n} threads`);
    assert.equal(bad, null, bad);
  }
});

test('row pieces on arrays outside the shared memory (fresh arrays) match the JS mirror', async () => {
  const be = await threaded(2, { minUnitMacs: 0, minRowElements: 0 });
  let st = 7;
  const vals = (n) => Float64Array.from({ length: n }, () => { st = (Math.imul(st, 1664525) + 1013904223) >>> 0; return (st / 2 ** 32 - 0.5) * 4; });
  const check = (label, got, want) => {
    const i = want.findIndex((v, k) => !sameBits(v, got[k]));
    assert.equal(i, -1, `${label} index ${i}: ${got[i]} vs JS ${want[i]}`);
  };
  for (const [N, C] of [[5, 8], [7, 17], [64, 32]]) {
    const x = vals(N * C), g = vals(C), dy = vals(N * C);
    const [y, c] = be.rmsnorm(x, g, N, C), [y0, c0] = JS_ROWS.rmsnorm(x, g, N, C);
    check(`rmsnorm (${N}, ${C})`, y, y0);
    check(`rmsnorm xhat (${N}, ${C})`, c.xhat, c0.xhat);
    const [dx, dg] = be.rmsnormBackward(dy, g, c0, N, C), [dx0, dg0] = JS_ROWS.rmsnormBackward(dy, g, c0, N, C);
    check(`rmsnorm backward dx (${N}, ${C})`, dx, dx0);
    check(`rmsnorm backward dg (${N}, ${C})`, dg, dg0);
  }
  for (const [G, T] of [[3, 8], [2, 17], [5, 16]]) {
    const s = vals(G * T * T), dp = vals(G * T * T);
    const p = be.causalSoftmax(s, G, T, undefined, 0.5), p0 = JS_ROWS.causalSoftmax(s, G, T, undefined, 0.5);
    check(`causal softmax (${G}, ${T})`, p, p0);
    check(`softmax backward (${G}, ${T})`, be.softmaxBackward(dp, p0, G, T, 0.25), JS_ROWS.softmaxBackward(dp, p0, G, T, 0.25));
  }
  for (const [N, V] of [[3, 257], [8, 5], [9, 64]]) {
    const logits = vals(N * V), targets = Int32Array.from({ length: N }, (_, n) => (n * 31) % V);
    const [l, d] = be.crossEntropy(logits, targets, N, V), [l0, d0] = JS_ROWS.crossEntropy(logits, targets, N, V);
    assert.ok(sameBits(l, l0), `cross-entropy (${N}, ${V}) loss ${l} vs JS ${l0}`);
    check(`cross-entropy (${N}, ${V}) dlogits`, d, d0);
  }
  for (const n of [1, 6, 33]) {
    const h = vals(n), d = vals(n);
    check(`relu (${n})`, be.relu(h), JS_ROWS.relu(h));
    check(`relu backward (${n})`, be.reluBackward(d, h), JS_ROWS.reluBackward(d, h));
  }
});

test('an arena of the threaded backend lives in its shared memory; other arenas are plain', async () => {
  const be = await threaded(2);
  const a = be.newArena().take(10), b = referenceBackend.newArena().take(10);
  assert.ok(a.buffer instanceof SharedArrayBuffer, 'the threaded arena is not in shared memory');
  assert.ok(!(b.buffer instanceof SharedArrayBuffer));
  assert.ok(be.newArena() instanceof StepArena);
  assert.equal(be.threads, 2);
});

test('the thread count: a bad one is refused by name; the default is the machine\'s cores', async () => {
  for (const bad of [0, -1, 1.5, MAX_THREADS + 1, '2']) {
    await assert.rejects(createThreadedBackend({ threads: bad }), /threads must be an integer in 1\.\.16/);
  }
  const n = await defaultThreads();
  assert.ok(n >= 1 && n <= MAX_THREADS, `default threads ${n}`);
});

test('the threaded engine keeps the integer entry points (a GPU engine\'s CPU fallback calls gemm)', async () => {
  const be = await threaded(2);
  const qa = Int8Array.from({ length: 2 * 3 * 5 }, (_, i) => ((i * 37) % 255) - 127), qb = Int8Array.from({ length: 2 * 5 * 4 }, (_, i) => ((i * 53) % 255) - 127);
  const { cpuEngine } = await import('../../frontend_js/units.js');
  assert.deepEqual(be.engine.gemm(qa, qb, 2, 3, 5, 4), cpuEngine.gemm(qa, qb, 2, 3, 5, 4));
});
