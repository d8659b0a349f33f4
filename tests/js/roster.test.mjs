// The roster rules of frontend_js/mesh/roster.js (docs/ARCHITECTURE.md "Membership"): who leads, when
// survivors may go on without a split, the P schedule, and which ROSTER messages a peer takes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { epochKey, actingLeader, mayGoOn, scheduleWith, scheduleLocal, leftSlots, scheduleString, checkRoster, rosterDigest, MAX_RUN_ID } from '../../frontend_js/mesh/roster.js';
import { validHistory } from '../../frontend_js/run/record.js';
import { parseRoster } from '../../frontend_js/train.js';

test('epoch keys: distinct per epoch, never 0, no wrap below the largest run id', () => {
  assert.equal(epochKey(7, 0), 7);
  assert.notEqual(epochKey(7, 1), epochKey(7, 0));
  assert.equal(epochKey(MAX_RUN_ID - 100_000, 99_999), MAX_RUN_ID - 1);
});

test('the acting leader is the most senior peer not gone', () => {
  assert.equal(actingLeader(['a', 'b', 'c'], new Set()), 'a');
  assert.equal(actingLeader(['a', 'b', 'c'], new Set(['a'])), 'b');
  assert.equal(actingLeader(['a', 'b', 'c'], new Set(['a', 'b'])), 'c');
  assert.equal(actingLeader(['a'], new Set(['a'])), null);
});

test('no split, even with one liar on both sides: a quorum above (P + 1) / 2 goes on; fewer only with every removed peer confirmed gone', () => {
  const R = ['a', 'b', 'c', 'd'];
  assert.equal(mayGoOn(R, new Set(['d']), new Set()), true, '3 of 4');
  assert.equal(mayGoOn(['a', 'b', 'c'], new Set(['c']), new Set()), false, '2 of 3: the third may be a liar on both sides');
  assert.equal(mayGoOn(['a', 'b', 'c'], new Set(['c']), new Set(['c'])), true, '2 of 3, the server saw the third leave');
  assert.equal(mayGoOn(R, new Set(['c', 'd']), new Set()), false, '2 of 4, unconfirmed');
  assert.equal(mayGoOn(R, new Set(['a', 'b']), new Set()), false, 'the other half, unconfirmed');
  assert.equal(mayGoOn(R, new Set(['c', 'd']), new Set(['c'])), false, 'one of two confirmed');
  assert.equal(mayGoOn(R, new Set(['c', 'd']), new Set(['c', 'd'])), true, 'both confirmed');
  assert.equal(mayGoOn(['a', 'b'], new Set(['b']), new Set()), false, 'a frozen partner of two');
  assert.equal(mayGoOn(['a', 'b'], new Set(['a']), new Set(['a'])), true, 'a closed leader of two');
  // the two sides of any split: never both
  for (let P = 1; P <= 7; P++) {
    const ids = Array.from({ length: P }, (_, i) => `p${i}`);
    for (let mask = 0; mask < (1 << P); mask++) {
      const sideA = new Set(ids.filter((_, i) => mask & (1 << i)));
      const sideB = new Set(ids.filter((id) => !sideA.has(id)));
      assert.ok(!(mayGoOn(ids, sideB, new Set()) && mayGoOn(ids, sideA, new Set())), `P=${P} mask=${mask}: both sides go on`);
      // one liar in both sides (each side holding an honest member): never both quorums
      for (const liar of ids) {
        if (![...sideA].some((id) => id !== liar) || ![...sideB].some((id) => id !== liar)) continue;
        const a = new Set([...sideA, liar]), b = new Set([...sideB, liar]);
        const goneA = new Set(ids.filter((id) => !a.has(id))), goneB = new Set(ids.filter((id) => !b.has(id)));
        assert.ok(!(mayGoOn(ids, goneA, new Set()) && mayGoOn(ids, goneB, new Set())), `P=${P} mask=${mask} liar ${liar}: both sides go on`);
      }
    }
  }
});

test('the P schedule: a change at `from` undoes later entries and replaces one at `from`', () => {
  assert.deepEqual(scheduleWith([[0, 2]], 10, 3), [[0, 2], [10, 3]]);
  assert.deepEqual(scheduleWith([[0, 2], [10, 3]], 10, 2), [[0, 2]], 'recomputed with the old P: no entry');
  assert.deepEqual(scheduleWith([[0, 2], [10, 3]], 9, 1), [[0, 2], [9, 1]]);
  assert.deepEqual(scheduleWith([[0, 3]], 5, 3), [[0, 3]], 'same P: unchanged');
  assert.equal(scheduleString([[0, 2], [10, 3], [15, 2]]), '0:2,10:3,15:2');
});

test('local steps: the schedule names the slots that leave at a round start; a redone change is folded in', () => {
  assert.deepEqual(leftSlots(['a', 'b', 'c', 'd'], ['a', 'c']), [1, 3]);
  assert.deepEqual(scheduleLocal([[0, 4]], 8, 4, [1]), [[0, 4], [8, 3, [1]]]);
  assert.deepEqual(scheduleLocal([[0, 4]], 0, 4, [1]), [[0, 3]], 'the run\'s start: every replica the same, no slots');
  // [a, b, c, d] -> b left at 8 -> [a, c, d]; d (slot 2 now) leaves before the round's exchange: at 8, slots 1 and 3 of 4
  assert.deepEqual(scheduleLocal([[0, 4], [8, 3, [1]]], 8, 3, [2]), [[0, 4], [8, 2, [1, 3]]]);
  assert.deepEqual(scheduleLocal([[0, 4], [8, 3, [1]]], 8, 3, [0]), [[0, 4], [8, 2, [0, 1]]]);
  assert.deepEqual(scheduleLocal([[0, 4], [8, 3, [1]]], 8, 3, []), [[0, 4], [8, 3, [1]]], 'a redone round, nobody more left: unchanged');
  assert.deepEqual(scheduleLocal([[0, 4], [8, 3, [1]]], 12, 3, [0]), [[0, 4], [8, 3, [1]], [12, 2, [0]]]);
  assert.deepEqual(scheduleLocal([[0, 3]], 8, 3, []), [[0, 3]]);
  // joiners: appended ([8, 4]); a member that leaves in the joiners' first round is folded into that entry
  assert.deepEqual(scheduleLocal([[0, 3]], 8, 3, [], 1), [[0, 3], [8, 4]]);
  assert.deepEqual(scheduleLocal([[0, 2], [8, 3]], 8, 3, [0]), [[0, 2], [8, 2, [0]]], 'slot 0 left, the joiner stays: 8:2:0');
  assert.deepEqual(scheduleLocal([[0, 2], [8, 3]], 8, 3, [2]), [[0, 2]], 'the joiner itself left: no change at 8');
  assert.deepEqual(scheduleLocal([[0, 3], [8, 3, [0]]], 8, 3, [1]), [[0, 3], [8, 2, [0, 2]]], '[a,b,c] -> [b,c,j]; c leaves: 8:2:0.2');
  assert.equal(scheduleString(scheduleLocal([[0, 3], [8, 3, [0]]], 8, 3, [2])), '0:3,8:2:0', 'the joiner of 8:3:0 leaves');
  const h = scheduleLocal([[0, 4], [8, 3, [1]]], 8, 3, [2]);
  assert.equal(scheduleString(h), '0:4,8:2:1.3');
  assert.deepEqual(parseRoster(scheduleString(h)), h, 'the string is the --roster of python -m daisy.train');
  assert.ok(validHistory(h, 8, 2) && validHistory([[0, 2], [10, 3]], 10, 3));
  for (const bad of [[[0, 4], [8, 3, [4]]], [[0, 4], [8, 2, [1]]], [[0, 4], [8, 2, [3, 1]]], [[0, 4], [8, 4, []]], [[0, 4], [8, 3, 'x']], [[0, 4], [8, 3, [1], 0]]]) {
    assert.equal(validHistory(bad), false, JSON.stringify(bad));
  }
});

test('ROSTER checks, local steps: a recovery from the round start this peer holds or the one before', () => {
  const cur = { roster: ['a', 'b', 'c'], epoch: 2, completed: 20, selfId: 'b', back: 16 };
  assert.equal(checkRoster({ roster: ['a', 'b'], epoch: 3, from: 20 }, cur, 'a'), null);
  assert.equal(checkRoster({ roster: ['a', 'b'], epoch: 3, from: 16 }, cur, 'a'), null);
  assert.match(String(checkRoster({ roster: ['a', 'b'], epoch: 3, from: 19 }, cur, 'a')), /recovery from step 20/);
  assert.match(String(checkRoster({ roster: ['a', 'b'], epoch: 3, from: 16 }, { ...cur, back: -1 }, 'a')), /recovery from step 17/);
  // joiners at one of the next three round starts (H = 4): the leader proposes the one after its
  // next (from its exchange), a member may still hold the round start before the leader's
  const at = { ...cur, round: 4 };
  for (const from of [24, 28, 32]) assert.equal(checkRoster({ roster: ['a', 'b', 'c', 'd'], epoch: 3, from }, at, 'a'), null, `from ${from}`);
  for (const from of [21, 20, 36, 26, 16]) assert.match(String(checkRoster({ roster: ['a', 'b', 'c', 'd'], epoch: 3, from }, at, 'a')), /joiners from step/, `from ${from}`);
});

test('ROSTER checks: planned joins, recoveries, and what is refused', () => {
  const cur = { roster: ['a', 'b', 'c'], epoch: 2, completed: 20, selfId: 'b' };
  const ok = (msg, sender = msg.roster[0]) => assert.equal(checkRoster(msg, cur, sender), null, JSON.stringify(msg));
  const no = (msg, re, sender = msg.roster[0]) => assert.match(String(checkRoster(msg, cur, sender)), re, JSON.stringify(msg));
  ok({ roster: ['a', 'b', 'c', 'd'], epoch: 3, from: 21 });              // a joiner from the next step
  ok({ roster: ['b', 'c'], epoch: 3, from: 20 });                        // the leader gone: b leads
  ok({ roster: ['a', 'b'], epoch: 4, from: 19 });                        // we undo one step
  no({ roster: ['a', 'b'], epoch: 2, from: 20 }, /epoch/);
  no({ roster: ['a', 'b'], epoch: 3, from: 18 }, /recovery from step/);
  no({ roster: ['b', 'a', 'c'], epoch: 3, from: 20 }, /reorders|senior/);
  no({ roster: ['c', 'b'], epoch: 3, from: 20 }, /reorders|senior/);     // c while b survives
  no({ roster: ['a', 'b', 'd'], epoch: 3, from: 21 }, /adds and removes/);
  ok({ roster: ['a', 'b', 'c', 'd'], epoch: 3, from: 22 });              // announced two steps ahead
  no({ roster: ['a', 'b', 'c', 'd'], epoch: 3, from: 24 }, /joiners from step/);
  no({ roster: ['a', 'b', 'c', 'd'], epoch: 3, from: 20 }, /joiners from step/);
  no({ roster: ['a', 'a'], epoch: 3, from: 20 }, /malformed/);
  no({ roster: ['a', 'b'], epoch: 3, from: 20 }, /leader/, 'c');        // not sent by its slot 0
  no({ roster: ['a', 'c'], epoch: 3, from: 20 }, /drops this device/);  // a roster without us: refused, never a reason to leave
});

test('the roster digest names the exact roster: any field that decides the run changes it', () => {
  const base = { runId: 9, epoch: 3, base: 2, from: 20, roster: ['a', 'b'], history: [[0, 3], [20, 2]], reason: 'x', left: ['c'] };
  const d = rosterDigest(base);
  assert.match(d, /^[0-9a-f]{64}$/);
  assert.equal(rosterDigest({ ...base, reason: 'other words', left: [] }), d, 'prose and derived lists do not count');
  for (const [k, v] of [['runId', 10], ['epoch', 4], ['base', 1], ['from', 19], ['roster', ['b', 'a']], ['history', [[0, 3], [21, 2]]]]) {
    assert.notEqual(rosterDigest({ ...base, [k]: v }), d, k);
  }
});
