// The INT8 unit on workers that share nothing (frontend_js/cpu/unit_workers.js: the CPU path of a page
// that is not cross-origin isolated): the JS mirror's (referenceBackend) hashes on 1, 2 and 4
// threads at every step, at the tiny settings and at odd shapes with every unit split (whole
// batches for attention, rows of A for the linear layers, A^T's columns in backward), and at a mid
// size with the default routing; a worker whose results are one bit off is refused by the gate, and
// a worker that dies mid-run leaves its slices to the caller with the hashes unchanged.
// A mismatch names the step, both hashes and the first differing weight.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { createUnitWorkersBackend } from '../../frontend_js/cpu/unit_workers.js';
import { referenceBackend } from '../../frontend_js/engines.js';
import { run, firstMismatch, closedAfter, TINY, ODD } from './group_runs.mjs';

const workers = closedAfter((threads, opts = {}) => createUnitWorkersBackend({ threads, ...opts }));

for (const [what, settings, steps] of [['tiny', TINY, 3], ['odd shapes', ODD, 2]]) {
  test(`${what}: every unit split, 1, 2 and 4 threads give the JS mirror's hashes`, async () => {
    const want = await run(settings, referenceBackend, steps);
    for (const n of [1, 2, 4]) {
      const be = await workers(n, { minUnitMacs: 0 });
      assert.equal(be.threads, n);
      const bad = firstMismatch(await run(settings, be, steps), want, `${n} threads`);
      assert.equal(bad, null, bad);
    }
  });
}

test('mid size, default routing: 2 threads give the JS mirror hashes', async () => {
  const mid = { width: 64, seq_len: 64, batch: 8, layers: 1, heads: 4 };
  const want = await run(mid, referenceBackend, 2);
  const bad = firstMismatch(await run(mid, await workers(2), 2), want, '2 threads');
  assert.equal(bad, null, bad);
});

test('a worker one bit off is refused by the gate, naming the first mismatch', async () => {
  await assert.rejects(createUnitWorkersBackend({ threads: 2, faultForTests: 'flip' }),
    /the unit workers failed their gate: unit \(1, 1, 1, 1\) transA=false transB=false index 0: .* vs JS /);
});

test('a worker that dies mid-run leaves its slices to the caller: the same hashes, the run goes on', async () => {
  const want = await run(TINY, referenceBackend, 3);
  const warned = [];
  const warn = console.warn;
  console.warn = (...args) => warned.push(args.join(' '));
  try {
    // the gate takes 24 jobs; the worker dies in the middle of the training run
    const bad = firstMismatch(await run(TINY, await workers(2, { minUnitMacs: 0, faultForTests: 'die-after:40' }), 3), want, 'a dying worker');
    assert.equal(bad, null, bad);
  } finally { console.warn = warn; }
  // one warning per unit that was in flight on it (model.js's both() keeps two), none after
  assert.ok(warned.length >= 1 && warned.length <= 2, warned.join('\n'));
  for (const w of warned) assert.match(w, /a unit worker failed, its slice runs on the caller and it gets no more: .*a test fault: the worker dies/);
});

test('a bad thread count is refused by name', async () => {
  for (const bad of [0, -1, 1.5, 17, '2']) {
    await assert.rejects(createUnitWorkersBackend({ threads: bad }), /threads must be an integer in 1\.\.16/);
  }
});
