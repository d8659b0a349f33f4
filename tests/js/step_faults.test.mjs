// A step whose matmul fails (as a GPU audit failure does) leaves nothing behind: both calls of a
// backward pair settle before the step throws, the trainer drops that step's arena, and the
// step computed again gives the bits of a step that never failed.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { makeConfig } from '../../frontend_js/config.js';
import { Group } from '../../frontend_js/train.js';
import { createBackends, withEngine } from '../../frontend_js/engines.js';

const FORWARD_CALLS = 13;     // default config: 2 layers x 6 matmuls + the head

test('a failed matmul pair settles both calls, and the recomputed step is exact', async () => {
  const [best] = await createBackends(), wasm = best.engine;
  const stream = Uint16Array.from({ length: 4096 }, (_, i) => (i * 7919 + (i >> 3)) % 256);
  let calls = 0, failAt = FORWARD_CALLS + 1, slowInFlight = 0;
  const flaky = {
    name: 'flaky',
    async qmatmulT(a, ta, b, tb, nb, m, k, n, out) {
      const call = ++calls;
      if (call === failAt) throw new Error('audit failed');
      if (call === failAt + 1) {          // its pair partner, still running when the first fails
        slowInFlight++;
        await new Promise((r) => setTimeout(r, 30));
        slowInFlight--;
      }
      return wasm.qmatmulT(a, ta, b, tb, nb, m, k, n, out);
    },
  };
  const cfg = makeConfig({});
  const group = new Group(cfg, 1, stream, withEngine(best, flaky));
  const arena = group.arena;
  await assert.rejects(group.step(), /audit failed/);
  assert.equal(slowInFlight, 0, 'the step threw while its other matmul was still running');
  assert.notEqual(group.arena, arena, 'the failed step\'s arena is handed out again');
  failAt = -1;
  const again = await group.step();
  const clean = await new Group(cfg, 1, stream, best).step();
  assert.equal(again.step, 1);
  assert.ok(Object.is(again.loss, clean.loss), `loss ${again.loss} vs ${clean.loss}`);
  assert.deepEqual(again.hashes, clean.hashes);
});
