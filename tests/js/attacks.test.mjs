// Audited gradients (frontend_js/audit.js, attack.js; docs/VERIFICATION.md §13) over seeded runs in
// process: the pure rules, then every attack of the suite. For each attack and run seed (printed):
// the attacker is removed and no honest peer is; the steps it took are within the bound the
// documented probability gives (and their mean within twice the documented expectation); every
// step's replicas agree; and the kept timeline equals, step for step (loss and hashes exactly),
// the plain Group run of its roster schedule (what daisy.train --roster prints; Python = node for
// these runs is tests/test_attacks.py).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  DEFAULT_AUDIT_RATE, Evidence, auditLoad, auditPairs, auditThreshold, beacon, cheapCheck, checkReducedShard, contributionDigest, detectionProbability,
  expectedSteps, judge, messageHashes, referenceNonce, rollbackStep, slotMessages, trustedStep,
} from '../../frontend_js/audit.js';
import { toHex } from '../../frontend_js/hashing.js';
import { codecFor } from '../../frontend_js/exchange_codec.js';
import { draw, key } from '../../frontend_js/prng.js';
import { bestBackend } from '../../frontend_js/engines.js';
import { attackedRun, rosterRun, stepsToDetection } from './attack_runs.mjs';

const TINY = { width: 16, seq_len: 16, batch: 2, layers: 1, heads: 4 };
const FROM = 3;
const backend = await bestBackend();
// the least B with P(the sum of n geometric(p) step counts > B) = P(Binomial(B, p) < n) < eps
function sumBound(n, p, eps = 1e-6) {
  for (let B = n; ; B++) {
    let tail = 0, term = (1 - p) ** B;                                     // P(Bin = 0)
    for (let k = 0; k < n; k++) { tail += term; term *= ((B - k) / (k + 1)) * (p / (1 - p)); }
    if (tail < eps) return B;
  }
}
const randomFlat = (n, seed) => Float64Array.from({ length: n }, (_, i) => (draw(key(99, seed), i) / 2 ** 32 - 0.5) * 2 ** ((i % 40) - 20));

test('the audit choice: each slot with its chance, in slot order, never by itself; rate 1 audits every slot; none for one peer', () => {
  const b = beacon([referenceNonce(1, 2, 3)], []);
  assert.deepEqual(auditPairs(1, 0, 1, 1, b), []);
  assert.deepEqual(auditPairs(1, 0, 4, 0, b), []);
  for (let P = 2; P <= 9; P++) {
    assert.deepEqual(auditPairs(7, P, P, 1, b).map(([, d]) => d), Array.from({ length: P }, (_, i) => i));
    for (const rate of [0.1, 0.5]) {
      const pairs = auditPairs(7, P * 11, P, rate, b);
      for (let i = 1; i < pairs.length; i++) assert.ok(pairs[i][1] > pairs[i - 1][1], `P=${P} rate=${rate}: not in slot order`);
      for (const [a, d] of pairs) assert.ok(a !== d && a >= 0 && a < P && d >= 0 && d < P, `P=${P}: pair ${a}->${d}`);
    }
  }
  assert.equal(auditThreshold(0.1), 429496729);
  assert.equal(auditThreshold(1), 2 ** 32);
});

test('the audit choice: each slot audited with its chance, auditors balanced by load, every nonce bit counts', () => {
  const P = 4, rate = 0.25, counts = new Array(P).fill(0), assigned = new Map();
  let changed = 0, busiest = 0;
  for (let step = 0; step < 4000; step++) {
    const nonces = [0, 1, 2, 3].map((s) => referenceNonce(5, step, s));
    const load = auditLoad(assigned, step, P);
    const pairs = auditPairs(5, step, P, rate, beacon([], nonces), load);
    for (const [a, d] of pairs) {
      assert.equal(load[a], Math.min(...load.filter((_, j) => j !== d)), `step ${step}: ${a} audits ${d} with loads ${load}`);
      load[a]++; counts[d]++;
    }
    assigned.set(step, pairs.map(([a]) => a));
    busiest += Math.max(...auditLoad(assigned, step + 1, P));
    nonces[3] = Uint8Array.from(nonces[3]); nonces[3][31] ^= 1;          // the last peer's nonce, one bit
    const again = auditPairs(5, step, P, rate, beacon([], nonces), auditLoad(assigned, step, P));
    if (JSON.stringify(again) !== JSON.stringify(pairs)) changed++;
  }
  for (let s = 0; s < P; s++) assert.ok(Math.abs(counts[s] - 1000) < 120, `slot ${s} audited ${counts[s]} times of 4000`);
  // the busiest auditor's load over the window stays near the mean (rate x W = 4 per slot)
  assert.ok(busiest / 4000 < 5.5, `the busiest auditor had ${busiest / 4000} audits in its window on average`);
  // the same pairs twice: the same audited set (0.625^4 = 0.15) and the same auditors
  assert.ok(changed > 4000 * 0.8, `one nonce bit changed the choice ${changed} times of 4000`);
});

const f64 = codecFor('f64'), int8 = codecFor('int8');

test('commitments bind every bit, the step, the slot and the loss; cheap checks name what is wrong', () => {
  const flat = randomFlat(1001, 1);
  const d = toHex(contributionDigest(flat, 2.5, 3, 1, 10, 1, f64));
  const up = Float64Array.from(flat);
  new BigUint64Array(up.buffer)[500] += 1n;                               // one ulp
  assert.notEqual(up[500], flat[500]);
  for (const other of [contributionDigest(up, 2.5, 3, 1, 10, 1, f64), contributionDigest(flat, 2.5, 3, 1, 11, 1, f64),
    contributionDigest(flat, 2.5, 3, 1, 10, 2, f64), contributionDigest(flat, 2.5000000000000004, 3, 1, 10, 1, f64),
    contributionDigest(flat, 2.5, 3, 1, 10, 1, int8)]) {
    assert.notEqual(toHex(other), d);
  }
  // reduce-scatter: one message per shard, each hashed
  assert.equal(slotMessages(flat, 5, 1, 10, 1, f64).length, 5);
  assert.equal(slotMessages(flat, 3, 1, 10, 1, f64).length, 1);
  const ok = slotMessages(flat, 4, 1, 10, 1, f64);
  assert.equal(cheapCheck(2.5, ok, 1001, 4, f64), null);
  assert.equal(cheapCheck(NaN, ok, 1001, 4, f64), 'has a loss that is not finite');
  assert.equal(cheapCheck(2.5, ok.slice(1), 1001, 4, f64), 'has 3 messages, the group needs 4');
  assert.equal(cheapCheck(2.5, [ok[0].subarray(8), ...ok.slice(1)], 1001, 4, f64), 'is 1992 bytes where 2000 are due');
  for (const bad of [NaN, Infinity, -Infinity]) {
    const f = Float64Array.from(flat); f[1000] = bad;
    assert.equal(cheapCheck(2.5, slotMessages(f, 4, 1, 10, 1, f64), 1001, 4, f64), 'is not finite');
  }
  // int8: the codec's sizes and its decoder's refusals
  const q = slotMessages(flat, 4, 1, 10, 1, int8);
  assert.equal(cheapCheck(2.5, q, 1001, 4, int8), null);
  const badScale = q.map((m) => Uint8Array.from(m)); badScale[1].set([0, 0, 0x80, 0x7f], 0);     // +inf scale
  assert.match(cheapCheck(2.5, badScale, 1001, 4, int8), /^is malformed \(block 0: scale \(float32 bits 0x7f800000\) is out of range/);
});

test('evidence: the committed digest decides, never the accuser; an owner\'s reduced shard is checked against its transcript', () => {
  const ev = new Evidence({ run: '1', step: 3, slot: 1, accuser: 2, committed: 'aa', recomputed: 'bb' });
  assert.equal(judge(ev, 'bb'), 'audited');
  assert.equal(judge(ev, 'cc'), 'audited');
  assert.equal(judge(ev, 'aa'), 'accuser');
  // rollback: to the convicted peer's last pass by an auditor never convicted; a colluder's
  // conviction voids its passes, taking the group back below where its partner was left out
  const passes = new Map([
    [0, new Map([[null, 0], [1, 9]])],
    [1, new Map([[null, 0], [0, 4], [3, 12]])],                  // 3 passed 1 at step 12
    [3, new Map([[null, 0], [1, 7], [0, 2]])],                   // 1 passed 3 at step 7
  ]);
  assert.equal(trustedStep(passes.get(1), new Set()), 12);
  assert.equal(rollbackStep(1, passes, new Map()), 12);
  assert.equal(rollbackStep(3, passes, new Map([[1, 12]])), 2, '3 convicted: 1 is back to its pass by 0 at 4, 3 to 2');
  assert.equal(rollbackStep(3, passes, new Map([[1, 3]])), 2, "1 left out from 3 already: 3's own pass by 0");
  assert.equal(rollbackStep(0, passes, new Map([[1, 12]])), 0, "0's only pass came from 1");
  for (const codec of [f64, int8]) {
    const slices = [1, 2, 3, 4].map((s) => codec.encode(randomFlat(300, s), { seed: 1, step: 2, slot: s - 1, offset: 512 }));
    const hashes = messageHashes(slices);
    const honest = codec.reduce(slices.map((m) => codec.decode(m, 300)), { seed: 1, step: 2, offset: 512 });
    assert.equal(checkReducedShard(slices, hashes, honest, 300, codec, 1, 2, 512), null);
    const lie = Float64Array.from(honest); lie[299] = -lie[299];
    assert.equal(checkReducedShard(slices, hashes, lie, 300, codec, 1, 2, 512), 'its reduced shard did not reproduce');
    const swapped = [slices[0], slices[2], slices[1], slices[3]];
    assert.equal(checkReducedShard(swapped, hashes, honest, 300, codec, 1, 2, 512),
      "its transcript's slice of slot 1 is not the one slot 1 committed to");
  }
});

// attack -> [peers, spec, attacker ids, p per step (documented)]
const SUITE = {
  'scale:-1000': [3, 'kind=scale:-1000', [1]],
  nan: [3, 'kind=nan', [1]],
  noise: [3, 'kind=noise', [1]],
  const: [3, 'kind=const', [1]],
  stale: [3, 'kind=stale', [1]],
  otherbatch: [3, 'kind=otherbatch', [1]],
  mismatch: [4, 'kind=mismatch', [2]],            // 4 peers: the reduce-scatter messages
  'liar-auditor': [3, 'kind=liar-auditor', [1]],
  'liar-owner': [4, 'kind=liar-owner', [2]],     // 4 peers: reduce-scatter, its reduced shard forged
  'liar-owner, int8 exchange': [5, 'kind=liar-owner', [4], 'int8'],
  'two colluders of five': [5, 'kind=scale:-1000', [1, 3]],
  'scale:-1000, int8 exchange': [4, 'kind=scale:-1000', [3], 'int8'],
  'nan, int8 exchange': [3, 'kind=nan', [0], 'int8'],
};
const SEEDS = [1, 2, 3, 4, 5, 6, 7, 8];

for (const [name, [P, spec, ids, exchange = 'f64']] of Object.entries(SUITE)) {
  test(`attack ${name}: caught in the documented steps, replicas agree, the kept run = the reference of its roster`, async () => {
    const cheap = spec === 'kind=nan';                 // a cheap check's evidence: the first step
    // each attacker caught at a step with at least pEach (a colluder: audited, by an honest
    // auditor): P(one is not caught in `cap` steps) = (1 - pEach)^cap < 1e-6
    const rate = DEFAULT_AUDIT_RATE;
    const pEach = cheap ? 1 : ids.length === 1 ? detectionProbability(P, rate, 1, name === 'liar-auditor')
      : rate * ((P - ids.length) / (P - 1));
    const cap = pEach === 1 ? 1 : Math.ceil(Math.log(1e-6) / Math.log(1 - pEach));
    const found = [];
    for (const seed of SEEDS) {
      const attack = `slot=${ids.join('+')},from=${FROM},${spec}`;
      const where = `seed ${seed}, ${attack}, ${P} peers, ${exchange}`;
      const { rec, run, cfg } = await attackedRun({ settings: { ...TINY, seed, exchange }, peers: P, attack, steps: FROM + cap + 3, backend,
        until: (r) => ids.every((id) => r.events.some((e) => e.peer === id)) && r.steps.size >= Math.max(...r.events.map((e) => e.step)) + 2 });
      assert.deepEqual(rec.events.map((e) => e.peer).sort(), [...ids].sort(), `${where}: removed ${JSON.stringify(rec.events)}`);
      const d = ids.map((id) => stepsToDetection(rec, id, FROM));
      assert.ok(d.every((x) => x >= 1 && x <= cap), `${where}: steps to detection ${d}, bound ${cap}`);
      found.push(Math.min(...d));
      assert.ok(rec.agree, `${where}: replicas disagreed`);
      const last = Math.max(...rec.steps.keys());
      const ref = await rosterRun(cfg, run.roster(), last, backend);
      for (let t = 1; t <= last; t++) {
        const got = rec.steps.get(t), want = ref.get(t);
        assert.ok(got && Object.is(got.loss, want.loss) && got.hashes.join() === want.hashes.join(),
          `${where}: step ${t} of the kept run (${got && got.hashes[0]}, loss ${got && got.loss}) is not daisy.train --roster ${run.roster()}'s (${want.hashes[0]}, loss ${want.loss})`);
      }
    }
    // the first removal: every step at least pFirst likely; the seeds' total within its 1e-6 tail
    const pFirst = cheap ? 1 : detectionProbability(P, rate, ids.length, name === 'liar-auditor');
    const total = found.reduce((a, b) => a + b, 0);
    const bound = pFirst === 1 ? found.length : sumBound(found.length, pFirst);
    assert.ok(total <= bound, `${name}: ${total} steps to detection over seeds ${SEEDS} (mean ${total / found.length}, `
      + `documented ${expectedSteps(pFirst)}), bound ${bound}`);
    console.log(`${name}: steps to detection over seeds ${SEEDS}: ${found.join(' ')} (mean ${total / found.length}, documented ${expectedSteps(pFirst).toFixed(2)})`);
  });
}

test('an honest audited run is the plain run; with audits off a forged gradient goes through', async () => {
  for (const rate of [0.5, 1]) {
    const { rec, run, cfg } = await attackedRun({ settings: { ...TINY, seed: 9 }, peers: 3, attack: null, rate, steps: 8, backend });
    assert.deepEqual(rec.events, []);
    assert.equal(run.roster(), '0:3');
    const ref = await rosterRun(cfg, '0:3', 8, backend);
    for (let t = 1; t <= 8; t++) assert.equal(rec.steps.get(t).hashes.join(), ref.get(t).hashes.join(), `rate ${rate}: step ${t}`);
  }
  const { rec, cfg } = await attackedRun({ settings: { ...TINY, seed: 9 }, peers: 3, attack: 'slot=1,from=3,kind=scale:-1000', rate: 0, steps: 8, backend });
  assert.deepEqual(rec.events, []);
  const ref = await rosterRun(cfg, '0:3', 8, backend);
  assert.equal(rec.steps.get(3).hashes[0], ref.get(3).hashes[0]);
  assert.notEqual(rec.steps.get(4).hashes[0], ref.get(4).hashes[0], 'the forged step 4 changed nothing');
});
