// Issue 27 §1 and the relay rule of EVIDENCE (frontend_js/run/audits.js), over the in-memory
// transport (run_harness.mjs), every page drawing the reference run's nonces, each honest page
// compared with the reference run of the same attack (frontend_js/attack.js AuditedRun, itself
// tested equal to python -m daisy.train --attack):
//   1. an honest member's relay of EVIDENCE is no bad frame; a forged relay (an accusation in
//      another member's name that does not hold) is one, and convicts nobody
//   2. a run's end is a barrier: a member forges at step K and a user stops the run right after
//      (at K + 1); every honest page convicts it before the Stop takes effect and ends at the
//      reference's state of that removal (python -m daisy.train --attack ... --stop-after S)
//   3. a Stop while a conviction's recovery is under way (the Stop cuts the recovery short): the
//      conviction still takes effect at the end's barrier, every honest page = the reference
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Group, SETTINGS, BACKEND, TIMING, TYPES, sleep } from './run_harness.mjs';
import { attackedRun } from './attack_runs.mjs';

const STEPS = 100;          // the shortest run a config allows

// a group of `peers` with the reference's nonces, `faults` on the ones `faulty` names (slot -> faults)
async function audited(peers, faulty, settings = {}, timing = TIMING) {
  const g = new Group({ seed: 11, timing });
  const nodes = [];
  for (let i = 0; i < peers; i++) nodes.push(...g.add(1, { faults: { referenceNonces: true, ...(faulty[i] || {}) } }));
  await g.linked();
  await nodes[0].ctl.start({ ...SETTINGS, steps: STEPS, ...settings });
  return { g, nodes };
}

async function reference(peers, attack, settings = {}, steps = STEPS) {
  const { rec } = await attackedRun({ settings: { ...SETTINGS, steps: STEPS, ...settings }, peers, attack, steps, rate: settings.auditRate, backend: BACKEND });
  return { hashes: new Map([...rec.steps].map(([s, { hashes }]) => [s, hashes[0]])), removals: rec.events };
}

function assertKept(node, ref, steps = STEPS) {
  for (let s = 1; s <= steps; s++) {
    const got = node.steps.get(s), want = ref.hashes.get(s);
    assert.ok(got !== undefined, `${node.id} kept no step ${s}`);
    assert.equal(got, want, `${node.id}: first mismatch at step ${s}: ${got?.slice(0, 16)} vs the reference's ${want?.slice(0, 16)}`);
  }
  assert.equal(node.run.completed, steps, `${node.id} ended after ${node.run.completed} steps, the reference after ${steps}`);
}

const convictions = (n) => n.events.filter(([e]) => e === 'convicted').map(([, p]) => p);

test('an honest relay of EVIDENCE is no bad frame; a forged relay (a false accusation in another member\'s name) is one and convicts nobody (P = 4)', async () => {
  const ref = await reference(4, 'slot=1,from=12,kind=scale:-1000');
  assert.equal(ref.removals.length, 1);
  const { g, nodes } = await audited(4, { 1: { forge: { from: 12, kind: 'scale', factor: -1000 } } });
  const honest = [nodes[0], nodes[2], nodes[3]], liar = nodes[1];
  const drops = new Map(nodes.map((n) => [n.id, []]));
  for (const n of honest) n.mesh.on('drop', ({ peer, line }) => drops.get(peer).push(`${n.id}: ${line}`));
  try {
    // the liar relays an accusation of an audit it did not make, whose gradient reproduces: the
    // first audit with neither the liar as auditor nor as the audited, its commitment true
    const own = () => [...(liar.ctl.run?.book?.pairs || [])].flatMap(([t, ps]) => ps.filter(([a, d]) => a !== 1 && d !== 1).map(([a, d]) => [t, a, d]));
    await g.until(() => own().length > 0, 'an audit without the liar drawn', 30_000);
    const [t, auditor, accused] = own()[0];
    const ev = { runId: liar.run.desc.runId, epoch: 0, step: t, slot: accused, accuser: auditor, committed: liar.run.book.digests.get(t)[accused], recomputed: 'ab'.repeat(32) };
    for (const n of honest) if (n.id !== `p${auditor}`) liar.sendJson(n.id, TYPES.EVIDENCE, ev, { runId: ev.runId, slot: 1 });
    await g.ended(honest, 60_000);
    for (const n of honest) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(convictions(n).map((c) => [c.peer, c.back]), [['p1', ref.removals[0].back]], `${n.id}: only the forger is convicted`);
      assertKept(n, ref);
    }
    // (the in-memory transport duplicates a few frames on purpose: a duplicate chunk is the link's, not the rule's)
    const fromHonest = honest.flatMap((n) => drops.get(n.id)).filter((l) => /EVIDENCE/.test(l) && !/duplicate chunk/.test(l));
    assert.deepEqual(fromHonest, [], 'no EVIDENCE of an honest member is a bad frame');
    const forged = drops.get(liar.id).filter((l) => new RegExp(`a relayed EVIDENCE of step ${t + 1} whose gradient reproduced`).test(l));
    assert.equal(forged.length, honest.filter((n) => n.id !== `p${auditor}` && n.id !== `p${accused}`).length, `each page the liar relayed to counted it (but the accused): ${drops.get(liar.id).join(' | ')}`);
  } finally { await g.close(); }
});

test('a Stop is a barrier: a member forges at step K, a user stops the run right after; every honest page removes it and ends at the reference of that removal (P = 3)', async () => {
  const K = 9;
  const { g, nodes } = await audited(3, { 1: { forge: { from: K, kind: 'scale', factor: -1000 } } });
  try {
    const [a, , c] = nodes;
    // a's user presses Stop once a sent its gradient of step K: the run ends after K + 1 steps
    // (a step or two later on a loaded machine: the reference is run to where it ended)
    await g.until(() => a.ctl.run && a.ctl.run.lastSent >= K, `p0 sent step ${K + 1}`, 30_000);
    a.ctl.stop();
    const S = a.run.stopAfter;
    await g.ended([a, c], 60_000);
    const ref = await reference(3, `slot=1,from=${K},kind=scale:-1000`, {}, S);
    assert.deepEqual(ref.removals.map((r) => [r.peer, r.step]), [[1, K + 1]], `the reference (stop after ${S}) removes p1 at step ${K + 1}: ${JSON.stringify(ref.removals)}`);
    for (const n of [a, c]) {
      assert.equal(n.ended.state, 'stopped', `${n.id}: ${n.ended.message}`);
      assert.equal(n.ended.error || '', '', `${n.id} stopped without an alarm: ${n.ended.message}`);
      assert.deepEqual(n.run.roster, ['p0', 'p2']);
      const got = convictions(n).map((x) => [x.peer, x.step, x.back]);
      assert.deepEqual(got, [['p1', K + 1, ref.removals[0].back]], `${n.id}: convicted ${JSON.stringify(got)}, the reference ${JSON.stringify(ref.removals)}`);
      assertKept(n, ref, S);
    }
    console.log(`stopped after ${S} (forged at ${K + 1}): ${convictions(a)[0].why}`);
  } finally { await g.close(); }
});

test('a Stop that cuts a conviction\'s recovery short: the removal still takes effect before the end, every honest page = the reference of that removal (P = 3)', async () => {
  const K = 5;
  // (a longer exchange deadline: on a loaded 2-core box, beside CI's 16 CLI processes, an honest
  // member silent for 3 s was once counted gone in the halted recovery, and the quorum lost)
  const { g, nodes } = await audited(3, { 1: { forge: { from: K, kind: 'scale', factor: -1000 } } }, {}, { ...TIMING, deadlineMs: 8000 });
  try {
    const [a, , c] = nodes;
    // a's user presses Stop the moment a convicts the forger (its recovery is under way)
    const seen = a.onEvent.bind(a);
    let stopped = false;
    a.onEvent = (event, payload) => { seen(event, payload); if (event === 'convicted' && !stopped) { stopped = true; a.ctl.stop(); } };
    await g.ended([a, c], 60_000);
    assert.ok(stopped, 'a convicted the forger');
    const S = a.run.stopAfter;
    const ref = await reference(3, `slot=1,from=${K},kind=scale:-1000`, {}, S);
    assert.equal(ref.removals.length, 1, JSON.stringify(ref.removals));
    for (const n of [a, c]) {
      assert.equal(n.ended.state, 'stopped', `${n.id}: ${n.ended.message}`);
      assert.equal(n.ended.error || '', '', `${n.id} stopped without an alarm: ${n.ended.message}`);
      assert.deepEqual(n.run.roster, ['p0', 'p2']);
      assertKept(n, ref, S);
    }
  } finally { await g.close(); }
});

// 4. an end before the barrier (issue 27 §1, the fuzz's seed 707992039): a member forges at step
// K + 1 and crashes right after, and the link between the two honest pages is cut, the server
// away: neither can go on (no quorum) nor reach the end's barrier. Each checks what it keeps
// (run/kept_check.js): no honest page keeps the forged step; every step it keeps is the honest run's.
test('an end without the barrier keeps no forged step: a member forges, then crashes while the honest two lose their link (P = 3, the server away)', async () => {
  const K = 7;
  const { g, nodes } = await audited(3, { 1: { forge: { from: K, kind: 'scale', factor: -1000 } } });
  try {
    const [a, liar, c] = nodes;
    g.serverDown = true;
    await g.until(() => a.completed >= K + 1 || c.completed >= K + 1, `an honest page applied step ${K + 1}`, 30_000);
    g.crash(liar);
    g.cut(a, c);
    await g.ended([a, c], 60_000);
    const ref = await reference(3, `slot=1,from=${K},kind=scale:-1000`, {}, K);
    for (const n of [a, c]) {
      assert.equal(n.ended.state, 'stopped', `${n.id}: ${n.ended.message}`);
      const kept = Math.max(...n.steps.keys());
      assert.ok(kept <= K, `${n.id} kept step ${kept}, past the forged step ${K + 1}: ${n.ended.message}`);
      for (const [s, x] of n.steps) assert.equal(x, ref.hashes.get(s), `${n.id}: first mismatch at step ${s}`);
      assert.equal(n.ended.hash, ref.hashes.get(n.ended.step), `${n.id}: the state kept is the honest run's`);
    }
    console.log(`kept after the forger's crash: ${a.ended.message}`);
  } finally { await g.close(); }
});
