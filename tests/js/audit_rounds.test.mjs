// Audited rounds of local steps over the mesh (docs/VERIFICATION.md §13 "Rounds of local steps",
// "Pages"; frontend_js/run/audits.js): run controllers over the in-memory transport
// (run_harness.mjs), local_steps H = 4, every page drawing the reference run's nonces. Each honest
// page must end with exactly the reference run (frontend_js/attack_rounds.js RoundAuditedRun,
// itself tested equal to python -m daisy.train --local-steps 4 --attack), hash for hash.
//   1. nobody lies, every round of every slot audited (rate 1): the plain run of local steps, and
//      the pages ran exactly the reference's audits (each auditor got the audited slot's state at
//      the round's start, ROUND_STATE, and its round reproduced)
//   2. a forger scaling its deltas by -1000: caught by an audit of a later round, judged by every
//      member (each asks it for its round's start state), removed with a rollback over several
//      rounds in which every survivor restores its own state; the history names the slot that left
//   3. a forger of its Adam moments (negated m, committed to): caught the same way
//   4. the run's end is a barrier: a forger of the last rounds (its delta, or its moments) never
//      audited is found by every survivor recomputing its rounds forward from its last pass
//   5. a departure is a barrier: a forger that withholds its commitments and leaves at the next
//      round start, never audited, is found by every survivor recomputing its rounds forward from
//      the run's start (a state every page holds), or from the state after its last pass, which
//      that pass's auditor recomputed and hands over; an honest leaver leaves, and the survivors'
//      audits go on from their committed states
//   6. a lying auditor: every member judges its accusation from the accused's start state
//   7. a round started from another state than the one committed to (unchained): the chain breaks
//   8. a member flooding ROUND_STATE_ASKs and unasked ROUND_STATEs: bad frames, no state sent for them
//   9. an end without the barrier (a lost quorum) keeps no forged round (kept_check.js); a FIN that
//      comes after a page passed its barrier without it still makes that page owe its state
// First, the rule that walks the exchanges: after the run's last there is none (the draw that
// asked for "the next" there drew the last again forever, synchronously: CI's Node suite hung so)
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Group, SETTINGS, BACKEND, TIMING, TYPES, firstOffReference, sleep } from './run_harness.mjs';
import { parseHeader } from '../../frontend_js/mesh/frames.js';
import { attackedRun } from './attack_runs.mjs';
import { scheduleString } from '../../frontend_js/mesh/roster.js';
import { nextExchange } from '../../frontend_js/run/audit_book.js';

const STEPS = 100;          // the shortest run a config allows
const H = 4;

// -> {nodes, g}: a group of `peers`, slot `liar` with `faults`, all with the reference's nonces
async function audited(peers, liar, faults, settings, timing = TIMING) {
  const g = new Group({ seed: 21, timing });
  const nodes = [];
  for (let i = 0; i < peers; i++) nodes.push(...g.add(1, { faults: { referenceNonces: true, ...(i === liar ? faults : {}) } }));
  await g.linked();
  await nodes[0].ctl.start({ ...SETTINGS, steps: STEPS, local_steps: H, ...settings });
  return { g, nodes };
}

test('the exchange drawn after step `done` (H = 1, H = 4, a last round cut short): each later than `done`, none after the run\'s last', () => {
  const walk = (cfg) => { const out = []; for (let t = nextExchange(cfg, -1); t !== null && out.length <= cfg.steps; t = nextExchange(cfg, t)) out.push(t); return out; };   // (bounded: a wrong rule fails, never spins)
  assert.deepEqual(walk({ steps: 5, local_steps: 1 }), [0, 1, 2, 3, 4]);
  assert.deepEqual(walk({ steps: 12, local_steps: 4 }), [3, 7, 11]);
  assert.deepEqual(walk({ steps: 10, local_steps: 4 }), [3, 7, 9]);
  for (const cfg of [{ steps: 100, local_steps: 1 }, { steps: 100, local_steps: 4 }, { steps: 10, local_steps: 4 }]) {
    assert.equal(nextExchange(cfg, cfg.steps - 1), null, `after the last step of ${JSON.stringify(cfg)}`);
    for (let done = -1; done < cfg.steps - 1; done++) assert.ok(nextExchange(cfg, done) > done, `${JSON.stringify(cfg)}: after ${done}`);
  }
});

const convictions = (n) => n.events.filter(([e]) => e === 'convicted').map(([, p]) => p);

test('an honest audited run of local steps (P = 3, H = 4, every round audited) = the plain run, with the reference\'s audits', async () => {
  const { run: ref } = await attackedRun({ settings: { ...SETTINGS, steps: STEPS, local_steps: H }, peers: 3, attack: null, rate: 1, steps: STEPS, backend: BACKEND });
  const { g, nodes } = await audited(3, -1, {}, { auditRate: 1 });
  try {
    await g.ended(nodes, 90_000);
    for (const n of nodes) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.equal(n.completed, STEPS);
      assert.deepEqual(convictions(n), [], `${n.id} convicted nobody`);
      assert.equal(await firstOffReference(n), null);
      assert.deepEqual(n.run.history, [[0, 3]]);
    }
    const audits = nodes.reduce((x, n) => x + n.run.book.audits, 0);
    assert.equal(audits, ref.audits, `the pages ran ${audits} audits, the reference ${ref.audits}`);
    assert.ok(audits >= 3 * (STEPS / H) - 3, `every round of every slot audited: ${audits}`);
  } finally { await g.close(); }
});

// the reference run of `attack` (local steps H, rate): Map step -> hash of the kept timeline, its removals, its --roster
async function reference(peers, attack, rate) {
  const { rec, run } = await attackedRun({ settings: { ...SETTINGS, steps: STEPS, local_steps: H }, peers, attack, rate, steps: STEPS, backend: BACKEND });
  return { hashes: new Map([...rec.steps].map(([s, { hashes }]) => [s, hashes[0]])), removals: rec.events, roster: run.roster() };
}

// every step the honest page kept equals the reference's, and it kept all of them
function assertKept(node, ref) {
  for (let s = 1; s <= STEPS; s++) {
    const got = node.steps.get(s), want = ref.hashes.get(s);
    assert.ok(got !== undefined, `${node.id} kept no step ${s}`);
    assert.equal(got, want, `${node.id}: first mismatch at step ${s}: ${got?.slice(0, 16)} vs the reference's ${want.slice(0, 16)}`);
  }
}

async function attackCase(peers, liarSlot, faults, attack, rate) {
  const ref = await reference(peers, attack, rate);
  assert.equal(ref.removals.length, 1, `the reference removes one peer: ${JSON.stringify(ref.removals)}`);
  const { g, nodes } = await audited(peers, liarSlot, faults, { auditRate: rate });
  try {
    const removed = `p${ref.removals[0].peer}`;
    const honest = nodes.filter((n) => n.id !== removed);
    await g.ended(honest, 90_000);
    for (const n of honest) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message} ${g.describe()} convictions ${JSON.stringify(honest.map(convictions))}`);
      assert.equal(n.run.roster.includes(removed), false, `${n.id} still has ${removed}`);
      const c = convictions(n).find((x) => x.peer === removed);
      assert.ok(c, `${n.id} convicted ${removed}: ${JSON.stringify(convictions(n))}`);
      assert.equal(c.back, ref.removals[0].back, `${n.id} rolled back to ${c.back} (${c.why}), the reference to ${ref.removals[0].back}`);
      assert.equal(c.step, ref.removals[0].step, `${n.id} convicted at step ${c.step}, the reference at ${ref.removals[0].step}`);
      assert.equal(scheduleString(n.run.history), ref.roster, `${n.id}: the kept run's --roster`);
      assertKept(n, ref);
    }
    return { ref, honest };
  } finally { await g.close(); }
}

test('a member scaling its rounds\' deltas by -1000 (P = 3, rate 0.3): caught four rounds later, removed, every survivor back to its own state at the round start after its last pass; every honest page = the reference', async () => {
  const { ref, honest } = await attackCase(3, 1, { forge: { from: 5, kind: 'scale', factor: -1000 } }, 'slot=1,from=5,kind=scale:-1000', 0.3);
  assert.ok(ref.removals[0].step - ref.removals[0].back > H, 'a rollback over several rounds');
  for (const n of honest) assert.match(convictions(n)[0].why, /round of p1 did not reproduce at step \d+: removed/);
});

test('a member forging its Adam moments (P = 3, rate 0.3): its end state does not reproduce; removed back to the run\'s start, every honest page = the reference', async () => {
  const { honest } = await attackCase(3, 2, { forge: { from: 9, kind: 'moments' } }, 'slot=2,from=9,kind=moments', 0.3);
  for (const n of honest) assert.match(convictions(n)[0].why, /round of p2 did not reproduce at step 24: removed/);
});

test('the run\'s end is a barrier (P = 3, rate 0.1): a -1000 forger of the last rounds, never audited, is found by recomputing its rounds forward from its last pass; removed, the rounds from its rollback computed again, every honest page = the reference', async () => {
  const { ref, honest } = await attackCase(3, 1, { forge: { from: 88, kind: 'scale', factor: -1000 } }, 'slot=1,from=88,kind=scale:-1000', 0.1);
  assert.match(ref.removals[0].why, /checked at the run's end/);
  for (const n of honest) assert.match(convictions(n)[0].why, /round of p1 did not reproduce at step 92: removed \(checked at the run's end; received/);
});

test('the run\'s end is a barrier for moments (P = 3, rate 0.1): the forged end state is found against its commitment; every honest page = the reference', async () => {
  const { ref, honest } = await attackCase(3, 2, { forge: { from: 92, kind: 'moments' } }, 'slot=2,from=92,kind=moments', 0.1);
  assert.match(ref.removals[0].why, /checked at the run's end/);
  for (const n of honest) assert.match(convictions(n)[0].why, /round of p2 did not reproduce at step 96: removed \(checked at the run's end; its Adam state at the round's end/);
});

// an end before the barrier (run/kept_check.js, rounds): a member forges its round ending at step
// 8 and crashes right after; the honest two lose their link, the server away: neither can go on nor
// reach the end's barrier. Each rechecks the rounds it keeps forward from each member's last pass
// (nobody is asked: from a state it holds) and keeps the state before the forged round, the honest run's.
test('an end without the barrier keeps no forged round: a member forges the round ending at step 8, then crashes while the honest two lose their link (P = 3, rate 0.1, the server away)', async () => {
  const { g, nodes } = await audited(3, 1, { forge: { from: 5, kind: 'scale', factor: -1000 } }, { auditRate: 0.1 });
  try {
    const [a, liar, c] = nodes;
    g.serverDown = true;
    await g.until(() => a.completed >= 2 * H || c.completed >= 2 * H, `an honest page applied the round ending at step ${2 * H}`, 30_000);
    const applied = [a, c].filter((n) => n.completed >= 2 * H);
    g.crash(liar);
    g.cut(a, c);
    await g.ended([a, c], 60_000);
    const ref = await reference(3, null, 0.1);
    for (const n of [a, c]) {
      assert.equal(n.ended.state, 'stopped', `${n.id}: ${n.ended.message}`);
      assert.ok(n.ended.step <= H, `${n.id} kept step ${n.ended.step}, past the forged round (steps ${H + 1}..${2 * H}): ${n.ended.message}`);
      assert.equal(n.ended.hash, n.ended.step === 0 ? n.run.desc.initHash : ref.hashes.get(n.ended.step), `${n.id}: the state kept is the honest run's`);
    }
    // a page that applied it went back to its start: the forged round did not reproduce (the
    // round before rechecked from the run's start), or a member's round there could not be
    // checked (its last pass, at step 4, audited by another page: no state of it held here)
    for (const n of applied) {
      assert.equal(n.ended.step, H, `${n.id}: ${n.ended.message}`);
      assert.match(n.ended.message, /the round of (p1 ending at step 8 did not reproduce|p\d ending at step 8 could not be checked here \(no Adam state of it to start from\))/, n.ended.message);
    }
  } finally { await g.close(); }
});

// a member's FIN that comes after this page passed the end's barrier without it (its wait for
// FINs is bounded), and after the member's ask of its state: the member is still owed this page's
// state there (the late FIN used to be dropped uncounted, and an ask that came before its FIN was
// judged at once, so the ask was refused and the member convicted this honest page for "no Adam
// state in time"; a loaded joiner test showed both)
test('a FIN that comes after a member passed the end\'s barrier without it: the late member still gets the state it asks for there (P = 3, rate 0.1)', async () => {
  const { g, nodes } = await audited(3, -1, {}, { auditRate: 0.1 });
  try {
    const b = nodes[1];
    const held = new Map();            // each other member's frames to b from its FIN on, until b ended
    g.net.lose((from, to, bytes) => {
      if (to !== b.id || b.ended || (!held.has(from) && parseHeader(bytes).type !== TYPES.FIN)) return false;
      if (!held.has(from)) held.set(from, []);
      held.get(from).push(bytes);
      return true;
    });
    await g.until(() => b.ended, 'b ended', 90_000);
    const types = [...held].map(([from, xs]) => `${from}: ${xs.map((x) => parseHeader(x).type).join(',')}`).join('; ');
    // (in reverse: each ask comes before the FIN it follows, as the in-memory links may deliver them)
    for (const [from, xs] of held) for (const x of xs.reverse()) g.net.inject(from, b.id, x);
    await g.ended(nodes, 90_000);
    assert.ok([...held.values()].flat().some((x) => parseHeader(x).type === TYPES.ROUND_STATE_ASK), `a member asked b for a state at its barrier (held: ${types})`);
    for (const n of nodes) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message} | ${g.describe()}`);
      assert.deepEqual(convictions(n), [], `${n.id} convicted nobody`);
      assert.equal(await firstOffReference(n), null);
    }
  } finally { await g.close(); }
});

test('a departure is a barrier (P = 3, rate 0.1): a member forges its round from step 9, withholds its AUDIT frames and leaves at the next round start; every survivor recomputes its rounds forward from the run\'s start, convicts it and keeps the reference run', async () => {
  const K = 9, L = 12;
  const ref = await reference(3, `slot=1,from=${K},kind=scale:-1000,leave=${L}`, 0.1);
  assert.deepEqual(ref.removals.map((r) => [r.peer, r.step, r.back]), [[1, L, 0]], `the reference's barrier convicts at step ${L}: ${JSON.stringify(ref.removals)}`);
  // (a long exchange deadline, as audit_mesh.test.mjs's departure: nobody here is lost by one)
  const { g, nodes } = await audited(3, 1, { forge: { from: K, kind: 'scale', factor: -1000 }, withholdAudits: { from: K } }, { auditRate: 0.1 }, { ...TIMING, deadlineMs: 15_000 });
  try {
    const [a, forger, c] = nodes;
    g.freeze(forger, L);              // it computes nothing after its forged round: the reference's leave=L
    await g.until(() => nodes.every((n) => n.completed >= L), `every member completed step ${L}`, 30_000);
    g.leave(forger);
    await g.ended([a, c], 60_000);
    for (const n of [a, c]) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(n.run.roster, ['p0', 'p2']);
      const got = convictions(n).map((x) => [x.peer, x.step, x.back]);
      assert.deepEqual(got, [['p1', L, 0]], `${n.id}: convicted ${JSON.stringify(got)}, the reference ${JSON.stringify(ref.removals)}`);
      assert.match(convictions(n)[0].why, /round of p1 did not reproduce at step 12: removed \(checked when it left; received/);
      assert.equal(scheduleString(n.run.history), ref.roster);
      assertKept(n, ref);
    }
  } finally { await g.close(); }
});

test('an honest departure at a round start (P = 3, rate 0.1): its rounds reproduce, it leaves; the survivors\' audits go on from their committed states (no round unchecked), every page = the reference', async () => {
  const L = 12;
  const ref = await reference(3, `slot=1,from=9,kind=liar-auditor,leave=${L}`, 0.1);   // (it audits nothing before it leaves: an honest leaver)
  assert.deepEqual(ref.removals, [{ step: L, peer: 1, left: true }]);
  const { g, nodes } = await audited(3, 1, { withholdAudits: { from: 9 } }, { auditRate: 0.1 }, { ...TIMING, deadlineMs: 15_000 });
  try {
    const [a, leaver, c] = nodes;
    g.freeze(leaver, L);
    await g.until(() => nodes.every((n) => n.completed >= L), `every member completed step ${L}`, 30_000);
    g.leave(leaver);
    await g.ended([a, c], 60_000);
    for (const n of [a, c]) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(n.run.roster, ['p0', 'p2']);
      assert.deepEqual(convictions(n), []);
      assert.equal(scheduleString(n.run.history), ref.roster);
      assert.deepEqual(n.notes.filter((x) => /Cannot check/.test(x)), [], `${n.id} checked every round it had to`);
      assertKept(n, ref);
    }
  } finally { await g.close(); }
});

test('a departure after a passed audit (P = 3, rate 0.3): the leaver\'s rounds are recomputed forward from the state its auditor recomputed at its last pass (asked of that auditor); the forger is removed exactly as the reference removes it', async () => {
  const K = 9, L = 12;
  const ref = await reference(3, `slot=1,from=${K},kind=scale:-1000,leave=${L}`, 0.3);
  assert.deepEqual(ref.removals.map((r) => [r.peer, r.step, r.back]), [[1, L, 4]], `the reference's barrier starts after its pass at 4: ${JSON.stringify(ref.removals)}`);
  const { g, nodes } = await audited(3, 1, { forge: { from: K, kind: 'scale', factor: -1000 }, withholdAudits: { from: K } }, { auditRate: 0.3 }, { ...TIMING, deadlineMs: 15_000 });
  try {
    const [a, forger, c] = nodes;
    g.freeze(forger, L);
    await g.until(() => nodes.every((n) => n.completed >= L), `every member completed step ${L}`, 30_000);
    g.leave(forger);
    await g.ended([a, c], 60_000);
    for (const n of [a, c]) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(n.run.roster, ['p0', 'p2']);
      const got = convictions(n).map((x) => [x.peer, x.step, x.back]);
      assert.deepEqual(got, [['p1', L, 4]], `${n.id}: convicted ${JSON.stringify(got)}, the reference ${JSON.stringify(ref.removals)}`);
      assert.match(convictions(n)[0].why, /checked when it left/);
      assert.equal(scheduleString(n.run.history), ref.roster);
      assert.deepEqual(n.notes.filter((x) => /Cannot check/.test(x)), [], `${n.id} checked every round it had to`);
      assertKept(n, ref);
    }
  } finally { await g.close(); }
});

test('a lying auditor of rounds (P = 3, rate 0.3): its false accusation is judged by every member from the accused\'s own start state, reproduces, and removes the accuser; every honest page = the reference', async () => {
  const { honest } = await attackCase(3, 1, { liarAuditor: { from: 9 } }, 'slot=1,from=9,kind=liar-auditor', 0.3);
  for (const n of honest) assert.match(convictions(n)[0].why, /p1 accused p0 at step 20, whose round reproduced: p1 removed/);
});

test('a round started from another state than the one committed to (unchained, P = 3, rate 0.5): the state it hands its auditor breaks the chain, evidence by itself; every honest page = the reference', async () => {
  const { honest } = await attackCase(3, 1, { forge: { from: 9, kind: 'unchained' } }, 'slot=1,from=9,kind=unchained', 0.5);
  for (const n of honest) assert.match(convictions(n)[0].why, /round of p1 did not reproduce at step 16: removed \(its Adam state at the round's start is not the one it committed to; audited by p0\)/);
});

// A member that asks for round-start states it is not owed (a repeat of its own audit's ask, a round
// long done: before the last W + 1 rounds, whose states the end's barrier may ask for) and sends
// ROUND_STATEs nobody asked for: each of its frames is a bad frame at the honest pages, they send it
// no state beyond the ones its own audits and barrier asked for, and the run is the plain one
// (docs/PROTOCOL.md "Mesh limits": work a member can cause is bounded)
test('a member flooding ROUND_STATE_ASKs and unasked ROUND_STATEs (P = 3, rate 1): every frame of it a bad frame, no state sent for it, the run unaffected', async () => {
  const { g, nodes } = await audited(3, -1, {}, { auditRate: 1 });
  const liar = nodes[2], honest = nodes.slice(0, 2);
  const drops = [];
  for (const n of honest) n.mesh.on('drop', ({ peer, line }) => { if (peer === liar.id) drops.push(line); });
  let flooded = 0, floodedStates = 0;
  const asks = new Set(), answers = new Set();     // messages (the in-memory net duplicates some chunks)
  g.net.watch((from, to, bytes) => {
    const h = parseHeader(bytes);
    if (from === liar.id && h.type === TYPES.ROUND_STATE_ASK) asks.add(`${to}:${h.msgId}`);
    if (to === liar.id && h.type === TYPES.ROUND_STATE) answers.add(`${from}:${h.msgId}`);
  });
  const tick = () => {
    const run = liar.ctl.run, b = run.book, runId = run.desc.runId, fields = { runId, slot: run.slot };
    for (const n of honest) {
      const k = run.roster.indexOf(n.id);
      for (const t of [b.done, b.done - H, b.done - 2 * H, 3, 7, 15]) {
        // (a repeat of its own audit's ask, or a round long done)
        if (t < 20 || b.stateAsked.has(`${run.epoch}:${t}:${k}:${k}`)) {
          flooded++;
          liar.sendJson(n.id, TYPES.ROUND_STATE_ASK, { runId, epoch: run.epoch, step: t }, fields);
        }
      }
      flooded++; floodedStates++;
      liar.mesh.send(n.id, { type: TYPES.ROUND_STATE, slot: run.slot, runId, step: b.done, payload: new Uint8Array(64) }).catch(() => {});
    }
  };
  const onEvent = liar.onEvent.bind(liar);
  liar.onEvent = (event, payload) => { onEvent(event, payload); if (event === 'step' && payload.step % 16 === 0 && payload.step > 40 && payload.step < STEPS) tick(); };
  try {
    await g.ended(nodes, 90_000);
    await sleep(TIMING.deadlineMs + 500);         // asks held for their deadline are answered or dropped by then
    for (const n of nodes) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(convictions(n), [], `${n.id} convicted nobody`);
      assert.equal(await firstOffReference(n), null);
    }
    const bad = drops.filter((l) => /ROUND_STATE_ASK of step \d+: (not this round's auditor|no state of that round kept)|a second ROUND_STATE_ASK|ROUND_STATE of step \d+ from slot \d+, not asked for|ROUND_STATE not asked for/.test(l)).length;
    // (a flooded ask still waiting when the member's FIN comes is owed as its one state at the
    // end's barrier, at each honest page: at most one each, the bytes the rule allows anyway)
    assert.ok(flooded >= 2 * 3 * 4, `flooded ${flooded} frames`);
    assert.ok(bad >= flooded - honest.length, `${bad} of ${flooded} flooded frames counted as bad: ${drops.slice(0, 4).join(' | ')}`);
    assert.ok(answers.size <= asks.size - (flooded - floodedStates) + honest.length, `the honest pages sent ${answers.size} states for ${asks.size - flooded + floodedStates} asks of the member's own audits and barrier`);
  } finally { await g.close(); }
});

