// run/speed.js: the group's tokens/s against this device alone (the panel's "vs alone" line)
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { groupSpeed, speedText } from '../../frontend_js/run/speed.js';

test('two devices, each step 100 ms of group time and 60 ms of own compute: 1.2x; the exchange adds 67 %: local steps 7 would hide it', () => {
  const s = groupSpeed({ stepTimes: [0, 100, 200, 300], ownMs: [60, 60, 60], tokensPerDevice: 256, P: 2 });
  assert.equal(s.tokensPerS, 2 * 256 * 3 * 1000 / 300);                // 5120
  assert.equal(s.aloneTokensPerS, 256 * 1000 * 3 / 180);
  assert.ok(Math.abs(s.ratio - 1.2) < 1e-12, String(s.ratio));
  assert.equal(s.suggestH, 7);                                        // X = 40 ms > C / 4 = 15 ms: ceil(10 X / C)
  assert.equal(speedText(s, 2), 'this group trains 1.2× as fast as this device alone (4,267 tokens/s alone); '
    + 'the exchange adds 67 % to each step here: local steps 7 would hide it');
});

test('a group that waits under a quarter of its compute: no local steps suggested', () => {
  const s = groupSpeed({ stepTimes: [0, 110, 220], ownMs: [100, 100], tokensPerDevice: 256, P: 2 });
  assert.equal(s.suggestH, null);                                     // X = 10 ms, C = 100 ms
  assert.equal(speedText(s, 2), 'this group trains 1.8× as fast as this device alone (2,560 tokens/s alone)');
});

test('a group that waits 13x its compute: the panel names the local steps that would hide it, at most 16', () => {
  const s = groupSpeed({ stepTimes: [0, 280, 560], ownMs: [20, 20], tokensPerDevice: 256, P: 2 });
  assert.equal(s.suggestH, 16);                                        // X = 260 ms, C = 20 ms: ceil(10 X / C) = 130, capped
  assert.equal(speedText(s, 2), 'this group trains 0.1× as fast as this device alone (12,800 tokens/s alone); '
    + 'the exchange adds 1300 % to each step here: local steps 16 would hide it');
  assert.equal(speedText(s, 2, 16), 'this group trains 0.1× as fast as this device alone (12,800 tokens/s alone)');
});

test('nothing measured yet: nulls and a dash', () => {
  const s = groupSpeed({ stepTimes: [5], ownMs: [], tokensPerDevice: 256, P: 2 });
  assert.deepEqual(s, { tokensPerS: null, aloneTokensPerS: null, ratio: null, suggestH: null, waitShare: null });
  assert.equal(speedText(s, 2), '–');
  assert.equal(speedText(null, 2), '–');
});

test('a device alone in its run reports its own rate, no ratio words', () => {
  const s = groupSpeed({ stepTimes: [0, 50], ownMs: [40], tokensPerDevice: 100, P: 1 });
  assert.equal(speedText(s, 1), 'this device alone: 2,000 tokens/s');
});
