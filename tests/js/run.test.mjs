// The run controller without a browser (frontend_js/run/, issue 19): N controllers over the
// in-memory transport (run_harness.mjs), each training real tiny steps on the JS mirror. Every
// test checks every completed step of every honest page against the JS Group run on that page's
// roster history (frontend_js/train.js, itself tested equal to python -m daisy.train).
//   1. groups of 2..8: start, stop, join, leave, crash, the leader leaving, a server outage
//   2. one lying member: forged STATUS/HALT/ROSTER/FIN/STOP, replays, echoed gradients, a
//      foreign epoch, repeated JOINs, a sync that never finishes
//   3. partial partitions: the link A-B cut while both keep C
//   4. the start: a stopped run resumed through the leader's STATE; the state body's size bound
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { BACKEND, Group, SETTINGS, TIMING, TYPES, firstOffReference, referenceHashes, sleep } from './run_harness.mjs';
import { stream } from './group_runs.mjs';
import { Group as RefGroup } from '../../frontend_js/train.js';
import { FWD_WINDOW } from '../../frontend_js/run/record.js';
import { makeConfig } from '../../frontend_js/config.js';

// every honest page equals the reference of its own history at every step it completed; two
// honest pages still alive that both completed a step have the same hash there, unless one raised
// an alarm (a crashed page's last step may be one the survivors recomputed without it)
async function assertHonest(nodes) {
  for (const n of nodes) {
    const off = await firstOffReference(n);
    assert.equal(off, null, off);
  }
  const alarmed = (n) => n.ended && /split alarm|replica mismatch/.test(n.ended.error || '');
  for (const a of nodes) for (const b of nodes) {
    if (a === b || alarmed(a) || alarmed(b) || a.crashed || b.crashed) continue;
    for (const [s, x] of a.steps) {
      if (b.steps.has(s)) assert.equal(b.steps.get(s), x, `${a.id} and ${b.id} differ at step ${s} (a fork)`);
    }
  }
}

// the roster changes a node saw: [{epoch, from, roster, left, joined}]
const changes = (n) => n.events.filter(([e]) => e === 'roster-changed').map(([, p]) => p);

async function startGroup(count, seed, faults = {}, timing = undefined) {
  const g = new Group({ seed, timing });
  const nodes = g.add(count, { faults });
  await g.linked();
  await nodes[0].ctl.start(SETTINGS);
  await g.until(() => nodes.every((n) => n.ctl.phase === 'running'), 'every node running');
  return { g, nodes };
}

// ---- 1. honest groups ---------------------------------------------------------------------------

for (const P of [2, 5, 8]) {
  test(`${P} controllers train, stop together and equal the reference`, async () => {
    const { g, nodes } = await startGroup(P, P);
    await g.until(() => nodes[0].completed >= 6, '6 steps');
    nodes[P - 1].ctl.stop();                        // any member may stop the run
    const ends = await g.ended(nodes);
    for (const e of ends) assert.equal(e.state, 'stopped');
    assert.equal(new Set(ends.map((e) => e.step)).size, 1, g.describe());
    assert.equal(new Set(ends.map((e) => e.hash)).size, 1, g.describe());
    // the panel names who stopped it: the sender of the STOP it got, or a relay's claim of it
    for (const n of nodes.slice(0, -1)) assert.match(n.ended.message, new RegExp(`by ${nodes[P - 1].id}|says ${nodes[P - 1].id} asked`), 'the panel names who stopped it');
    await assertHonest(nodes);
    await g.close();
  });
}

// a server outage's hold (peer/outage.js calls holdDeadlines): it reaches the collective of a run
// started during it, and a later hold reaches the running one
test('holdDeadlines: a run started during a hold gets it, a later hold reaches the running collective', async () => {
  const g = new Group({ seed: 5 });
  const [a, b] = g.add(2);
  await g.linked();
  const first = performance.now() + 60_000;
  a.ctl.holdDeadlines(first);
  await a.ctl.start(SETTINGS);
  await g.until(() => a.ctl.phase === 'running' && b.ctl.phase === 'running', 'both running');
  assert.equal(a.ctl.run.collective.holdUntil, first, 'a run started during the hold waits on until its end');
  assert.equal(b.ctl.run.collective.holdUntil, 0, 'no hold on a device whose server is up');
  a.ctl.holdDeadlines(first + 1);
  assert.equal(a.ctl.run.collective.holdUntil, first + 1);
  a.ctl.stop();
  await g.ended([a, b]);
  await g.close();
});

test('join, leave, crash, and the leader leaving: every step on the reference of the history', async () => {
  const { g, nodes } = await startGroup(4, 11);
  const [a, b, c, d] = nodes;
  await g.until(() => a.completed >= 4, '4 steps');
  const [e] = g.add(1);
  await g.linked();
  await g.until(() => e.ctl.phase === 'running', 'e synced in', 20_000);   // a lost state is asked for again
  assert.deepEqual(e.history.map(([, p]) => p), [4, 5]);
  await g.until(() => a.completed >= e.history[1][0] + 4, 'steps with e');
  g.leave(d);
  await g.until(() => a.run.roster.length === 4, 'd removed');
  await g.until(() => a.completed >= a.history.at(-1)[0] + 4, 'steps without d');
  g.crash(c);
  await g.until(() => a.run.roster.length === 3, 'c removed');
  await g.until(() => a.completed >= a.history.at(-1)[0] + 4, 'steps without c');
  g.leave(a);                                       // the leader closes its page
  await g.until(() => b.ctl.phase === 'running' && b.run.roster.length === 2 && b.run.roster[0] === b.id, 'b leads');
  await g.until(() => b.completed >= b.history.at(-1)[0] + 4, 'steps under b');
  b.ctl.stop();
  const ends = await g.ended([b, e]);
  assert.equal(ends[0].hash, ends[1].hash);
  assert.deepEqual(b.history.map(([, p]) => p), [4, 5, 4, 3, 2]);
  assert.deepEqual(e.history, b.history);
  await assertHonest([a, b, c, d, e]);
  await g.close();
});

test('the leader leaving, heard late by its successor: the STATUS it dropped meanwhile comes again', async () => {
  const { g, nodes } = await startGroup(3, 31);
  const [a, b, c] = nodes;
  await g.until(() => a.completed >= 4, '4 steps');
  // b hears of a's departure late (a busy device): c's STATUS may reach b while b still reaches
  // a, and b drops it (it does not lead yet); c answers b's HALT with its position again
  const receive = b.mesh.receive.bind(b.mesh), removeLink = b.mesh.removeLink.bind(b.mesh);
  b.mesh.receive = (from, bytes) => { if (from === a.id) setTimeout(() => receive(from, bytes), 250); else receive(from, bytes); };
  b.mesh.removeLink = (id, why) => { if (id === a.id) setTimeout(() => removeLink(id, why), 300); else removeLink(id, why); };
  g.leave(a);
  await g.until(() => [b, c].every((n) => n.ctl.phase === 'running' && n.run.roster.join() === `${b.id},${c.id}`), 'b leads c');
  await g.until(() => b.completed >= b.history.at(-1)[0] + 3, 'steps under b');
  b.ctl.stop();
  const ends = await g.ended([b, c]);
  assert.equal(ends[0].hash, ends[1].hash);
  assert.deepEqual(c.history, b.history);
  await assertHonest(nodes);
  await g.close();
});

test('server outage: with no word on departures a crash needs a quorum (3 of 4 go on, 2 of 3 stop with the alarm)', async () => {
  {
    const { g, nodes } = await startGroup(4, 21);
    g.serverDown = true;
    await g.until(() => nodes[0].completed >= 4, '4 steps');
    g.crash(nodes[3]);
    await g.until(() => nodes[0].run.roster.length === 3, 'd removed on the quorum');
    await g.until(() => nodes[0].completed >= nodes[0].history.at(-1)[0] + 3, 'steps without d');
    nodes[0].ctl.stop();
    await g.ended(nodes.slice(0, 3));
    await assertHonest(nodes);
    await g.close();
  }
  {
    const { g, nodes } = await startGroup(3, 22);
    g.serverDown = true;
    await g.until(() => nodes[0].completed >= 4, '4 steps');
    g.crash(nodes[2]);
    const ends = await g.ended(nodes.slice(0, 2));
    for (const e of ends) assert.equal(e.state, 'stopped');
    assert.match(nodes[0].ended.message, /split the group in two/);
    assert.equal(ends[0].hash, ends[1].hash);
    assert.equal(changes(nodes[0]).length, 0);
    await assertHonest(nodes);
    await g.close();
  }
});

// ---- 2. one lying member ------------------------------------------------------------------------

// honest pages that end: all stopped at one step with one hash, nobody removed from a roster
async function assertStoppedTogether(g, honest, re) {
  const ends = await g.ended(honest);
  for (const e of ends) assert.equal(e.state, 'stopped', g.describe());
  assert.equal(new Set(ends.map((e) => e.hash)).size, 1, g.describe());
  if (re) assert.ok(honest.some((n) => re.test(n.ended.message)), `no ${re} in: ${g.describe()}`);
  for (const n of honest) for (const ch of changes(n)) for (const id of ch.left) assert.ok(!honest.some((h) => h.id === id), `${n.id} removed honest ${id}`);
  await assertHonest(honest);
}

test('a liar says STATUS {gone: [P1]} to the leader while P1 is linked: nobody is removed, the run stops with the alarm naming both', async () => {
  const { g, nodes } = await startGroup(3, 31);
  const [L, P1, H] = nodes;
  await g.until(() => L.completed >= 4, '4 steps');
  const run = H.ctl.run;
  // H's every STATUS to L (its own controller's too) says it lost P1
  const sendJson = H.mesh.sendJson.bind(H.mesh);
  H.mesh.sendJson = (to, type, obj, fields) => sendJson(to, type, type === TYPES.STATUS ? { ...obj, gone: [P1.id] } : obj, fields);
  // a stale position too: it must not pull the stop out of the honest pages' reach
  H.sendJson(L.id, TYPES.STATUS, { runId: run.desc.runId, epoch: run.epoch, completed: 0, hash: run.hash, gone: [P1.id] }, { runId: run.desc.runId, slot: 2 });
  await assertStoppedTogether(g, [L, P1], new RegExp(`${H.id} reports it lost ${P1.id}, who answers this device`));
  await g.close();
});

test('a liar HALTs the leader and a member, naming an honest peer gone: at most a stall, nobody removed', async () => {
  const { g, nodes } = await startGroup(4, 32);
  const [L, A, B, H] = nodes;
  await g.until(() => L.completed >= 4, '4 steps');
  const run = H.ctl.run;
  for (const to of [L, A]) H.sendJson(to.id, TYPES.HALT, { runId: run.desc.runId, epoch: run.epoch + 1, gone: [B.id, L.id] }, { runId: run.desc.runId, slot: 3 });
  await g.until(() => L.completed >= 12, 'training goes on after the halt');
  L.ctl.stop();
  await g.ended(nodes);
  for (const n of [L, A, B]) for (const ch of changes(n)) assert.deepEqual(ch.left, [], `${n.id}: ${JSON.stringify(ch)}`);
  await assertHonest(nodes);
  await g.close();
});

test('a liar sends the leader ROSTER [H] and a replayed roster: refused and said, nobody removed', async () => {
  const { g, nodes } = await startGroup(3, 33);
  const [L, P1, H] = nodes;
  await g.until(() => L.completed >= 4, '4 steps');
  const run = H.ctl.run;
  const forged = { runId: run.desc.runId, epoch: run.epoch + 1, base: run.epoch, from: run.completed, roster: [H.id], left: [L.id, P1.id], joined: [], history: [[0, 1]], reason: 'forged' };
  H.sendJson(L.id, TYPES.ROSTER, forged, { runId: run.desc.runId, slot: 2 });
  H.sendJson(P1.id, TYPES.ROSTER, { ...forged, roster: [H.id, P1.id] }, { runId: run.desc.runId, slot: 2 });
  H.sendJson(P1.id, TYPES.GO, { runId: run.desc.runId, epoch: run.epoch + 1, digest: 'f'.repeat(64) }, { runId: run.desc.runId, slot: 2 });
  await g.until(() => L.notes.some((t) => /Refused a new roster from p2: .*drops this device/.test(t)), 'L says why');
  await g.until(() => P1.notes.some((t) => /Refused a new roster from p2/.test(t)), 'P1 says why');
  await g.until(() => L.completed >= 12, 'training goes on');
  L.ctl.stop();
  await g.ended(nodes);
  assert.equal(changes(L).length + changes(P1).length, 0);
  await assertHonest(nodes);
  await g.close();
});

test('STOP {mismatch} to one page stops the run everywhere, named, nobody removed; a wrong FIN ends nobody in a disagreement', async () => {
  {
    const { g, nodes } = await startGroup(3, 34);
    const [L, P1, H] = nodes;
    await g.until(() => L.completed >= 4, '4 steps');
    const run = H.ctl.run;
    // (stopAfter a step ahead of both: H's own position may lag P1's by two on a loaded machine,
    // and a STOP P1 cannot step back to ends it with 'cannot meet the group' instead)
    const stopAfter = Math.max(run.completed, P1.completed) + 1;
    H.sendJson(P1.id, TYPES.STOP, { runId: run.desc.runId, stopAfter, reason: 'Replicas disagree (forged)', mismatch: true }, { runId: run.desc.runId, slot: 2 });
    // both stop; a forged stopAfter may leave them a step or two apart, each on the reference
    const ends = await g.ended([L, P1]);
    for (const e of ends) assert.equal(e.state, 'stopped');
    assert.ok([L, P1].some((n) => new RegExp(`by ${H.id}`).test(n.ended.message)), `the panel names who stopped it: ${g.describe()}`);
    assert.equal(P1.ended.error, 'replica mismatch', 'the alarm it reported is said, as its word');
    assert.equal(changes(L).length + changes(P1).length, 0, 'nobody removed');
    await assertHonest(nodes);
    await g.close();
  }
  {
    const g = new Group({ seed: 35 });
    const nodes = g.add(3);
    await g.linked();
    const [L, P1, H] = nodes;
    await L.ctl.start({ ...SETTINGS, steps: 100 });
    await g.until(() => H.ctl.phase === 'running', 'running');
    const run = H.ctl.run;
    for (const to of [L, P1]) H.sendJson(to.id, TYPES.FIN, { runId: run.desc.runId, epoch: 0, step: 100, hash: 'e'.repeat(64), undrawn: [] }, { runId: run.desc.runId, slot: 2 });
    const ends = await g.ended([L, P1], 60_000);
    for (const e of ends) assert.equal(e.state, 'done', g.describe());
    assert.equal(ends[0].hash, ends[1].hash);
    assert.match(L.ended.message, /p2 reports the final hash eeeeeeeeeeee/);
    await assertHonest([L, P1]);
    await g.close();
  }
});

test('a STOP naming another member shows its sender as the stopper and the name as its claim (issue 27, property 5)', async () => {
  // no deadline while H holds its gradients (below; g.until bounds the hold at 30 s): the honest
  // pages wait on them, and a 3 s deadline on a loaded box declared the others lost and stopped the
  // run for want of a quorum, not by the STOP this test is about
  const { g, nodes } = await startGroup(3, 37, {}, { ...TIMING, deadlineMs: 120_000 });
  const [L, P1, H] = nodes;
  await g.until(() => L.completed >= 4, '4 steps');
  const run = H.ctl.run, stopAfter = run.completed;
  // H's gradients past the step it names wait until P1 and L have taken the STOP (P1 from H, L from
  // P1's relay): frames are reordered in flight, and a STOP that reaches a page two steps past its
  // stopAfter is stale and dropped (loop.js onStop). H keeps training: released when P1 alone had
  // it, its gradients let L finish step stopAfter + 1 before P1's relay came, L dropped the relay
  // and waited for P1 at the next step until its deadline
  const send = H.mesh.send.bind(H.mesh);
  H.mesh.send = async (to, msg) => {
    if ((msg.type === TYPES.GRAD || msg.type === TYPES.GRAD_PART) && msg.step > stopAfter) {
      await g.until(() => [P1, L].every((n) => n.run.stopAfter !== null || n.ended), 'P1 and L to take the STOP');
    }
    return send(to, msg);
  };
  H.sendJson(P1.id, TYPES.STOP, { runId: run.desc.runId, stopAfter, reason: 'stopped on p0', by: L.id }, { runId: run.desc.runId, slot: 2 });
  const ends = await g.ended([L, P1]);
  for (const e of ends) assert.equal(e.state, 'stopped');
  // P1 saw H's frame: H stopped it, and what H says of p0 is H's word
  // (either it stops where H asked, or — H's step count read while P1 ran on, on a loaded box — it
  // could not step back that far: the words differ, the attribution is the same)
  assert.match(P1.ended.message, new RegExp(`^Stopped at step \\d+ by ${H.id} \\(which says ${L.id} asked: stopped on p0\\)|^stopped on p0 — stopped by ${H.id}, which says ${L.id} asked;`), P1.ended.message);
  assert.doesNotMatch(P1.ended.message, new RegExp(`by ${L.id}`), 'a relayed name is never shown as the stopper');
  // L got the STOP from P1's relay, or from H: a sender it saw, never itself
  assert.match(L.ended.message, new RegExp(`by (${P1.id}|${H.id})\\b`), L.ended.message);
  assert.doesNotMatch(L.ended.message, new RegExp(`by ${L.id}`), L.ended.message);
  await assertHonest(nodes);
  await g.close();
});

test('a liar that refuses every roster stops the run when a member leaves; kept out by a user, the next run goes on without it (issue 27, property 6)', async () => {
  const g = new Group({ seed: 39 });
  const [L, P1, P2] = g.add(3);
  const [X] = g.add(1, { faults: { refuseRosters: true } });
  await g.linked();
  await L.ctl.start(SETTINGS);
  await g.until(() => [L, P1, P2, X].every((n) => n.ctl.phase === 'running') && L.completed >= 4, 'four running, 4 steps');
  g.leave(P2);                                    // an honest member leaves: the new roster needs X's word
  const first = await g.ended([L, P1]);
  for (const e of first) assert.equal(e.state, 'stopped', g.describe());
  assert.match(L.ended.message, /p3 refused the new roster: the fault plan refuses every roster/, L.ended.message);
  // L's user: "don't train with this device"; L refuses any roster with it and never proposes one
  assert.equal(L.ctl.keepOut(X.id, 'its user said so'), true);
  const runEnds = (n) => n.events.filter(([e]) => e === 'run-ended').map(([, p]) => p);
  await g.until(() => X.ctl.phase === 'idle', 'X idle');
  await L.ctl.start(SETTINGS);
  await g.until(() => P1.ctl.phase === 'running' && L.completed >= 8, 'the next run, 8 steps', 30_000);
  assert.deepEqual(L.ctl.run.roster, [L.id, P1.id], 'the next run goes on without X');
  assert.match(L.notes.join('\n'), /Starting without p3: kept out on this device/);
  // X asks to join it (an idle device seeing its group train): refused, the reason said
  await sleep(Math.max(0, X.ctl.joinBackoffUntil - performance.now()) + 20);   // after its run's end, a short backoff
  X.ctl.maybeJoin();
  await g.until(() => X.notes.some((t) => /keeps this device out/.test(t)), `X told it is kept out: ${JSON.stringify(X.notes)} ${X.ctl.phase}`, 10_000);
  await sleep(200);
  assert.ok(!L.ctl.run.roster.includes(X.id) && !L.ctl.run.joiners.has(X.id), 'X never enters the run');
  // a RUN naming X, from P1, is declined by L (it would train with X)
  L.ctl.stop();
  const second = await g.until(() => runEnds(L).length === 2 && runEnds(P1).length === 2, 'the second run to end').then(() => [runEnds(L)[1], runEnds(P1)[1]]);
  for (const e of second) assert.equal(e.state, 'stopped');
  const off = await firstOffReference(L);
  assert.equal(off, null, off);
  await assert.rejects(P1.ctl.start(SETTINGS), /keeps out|kept out/, 'P1 proposes L and X: L declines');
  await g.close();
});

test('a liar echoes each side its own gradient: the sync guard stops every honest page with the alarm, no fork', async () => {
  // from step index LIE on, H's GRAD to each peer is that peer's own of the same step: the hooks are
  // in place before the start and H waits for the peer's GRAD (a promise, no polling budget that a
  // loaded box outlasts), so the lie lands at LIE exactly and the replicas differ after step LIE + 1
  const LIE = 3;
  const g = new Group({ seed: 36, timing: { ...TIMING, streamGrads: false, deadlineMs: 120_000 } });   // whole GRADs to echo
  const nodes = g.add(3);
  const [L, P1, H] = nodes;
  const mine = new Map(), waiting = new Map();     // `${from}:${step}` -> the GRAD's payload / its waiter
  H.mesh.on(TYPES.GRAD, (from, m) => {
    mine.set(`${from}:${m.step}`, m.payload);
    waiting.get(`${from}:${m.step}`)?.();
  });
  const peerGrad = (key) => (mine.has(key) ? null : new Promise((r) => waiting.set(key, r)));
  const sendOf = (n) => n.mesh.send.bind(n.mesh);
  const send = { [L.id]: sendOf(L), [P1.id]: sendOf(P1), [H.id]: sendOf(H) };
  H.mesh.send = async (to, msg) => {
    if (msg.type === TYPES.GRAD && msg.step >= LIE) {
      await peerGrad(`${to}:${msg.step}`);
      msg = { ...msg, payload: Uint8Array.from(mine.get(`${to}:${msg.step}`)) };
    }
    return send[H.id](to, msg);
  };
  // the alarms' STOPs to an honest page stay in flight until it ended: each page's own guard must
  // catch the lie (a page that took the first alarm before its own exchange completed ends through
  // the end barrier instead, convicting H and going back before the lie: a different path, and a
  // different step)
  const byId = new Map(nodes.map((n) => [n.id, n]));
  for (const n of nodes) {
    const own = n === H ? H.mesh.send : send[n.id];
    n.mesh.send = async (to, msg) => {
      if (msg.type === TYPES.STOP && to !== H.id) await g.until(() => byId.get(to).ended, `${to} to end`);
      return own(to, msg);
    };
  }
  await g.linked();
  await L.ctl.start(SETTINGS);
  const ends = await g.ended([L, P1]);
  for (const n of [L, P1]) {
    assert.equal(n.ended.error, 'replica mismatch', g.describe());
    assert.match(n.ended.message, new RegExp(`^Replicas disagree after step ${LIE + 1}: `), g.describe());
    // the end came before the barrier: the page checks what it keeps (run/kept_check.js) and goes
    // back before the lie; every step it keeps is the reference's
    assert.match(n.ended.message, new RegExp(`Checked before keeping: the gradient of ${H.id} at step ${LIE + 1} did not reproduce: this device keeps the state after step ${LIE}`), g.describe());
    assert.equal(n.ended.step, LIE, 'it keeps the state before the lie');
    assert.equal(await firstOffReference(n), null);
  }
  const applied = (n) => n.events.filter(([e, p]) => e === 'step' && p.step === LIE + 1).map(([, p]) => p.hash)[0];
  assert.notEqual(applied(L), applied(P1), 'the echo split them (what the guard caught)');
  assert.equal(ends[0].step, ends[1].step);
  await g.close();
});

test('a frame of this run for an epoch nobody accepted, from a linked member: the split alarm, never a silent drop', async () => {
  const { g, nodes } = await startGroup(3, 37);
  const [L, P1, H] = nodes;
  await g.until(() => L.completed >= 3, '3 steps');
  const run = H.ctl.run;
  const payload = new Uint8Array(run.collective.maxPayload(TYPES.GRAD));
  await H.mesh.send(L.id, { type: TYPES.GRAD, slot: 0, runId: (run.desc.runId + run.epoch + 1) >>> 0, step: run.completed + 1, payload });
  await g.ended([L, P1]);
  assert.match(L.ended.message, new RegExp(`Split alarm at step \\d+: ${H.id} trains epoch 1 of this run`));
  assert.equal(L.ended.error, 'split alarm');
  assert.equal(P1.ended.state, 'stopped');
  await assertHonest([L, P1]);
  await g.close();
});

test('JOIN repeated every few ms: one state transfer per interval, repeated JOINs dropped and counted', async () => {
  // a fixed count of JOINs and an interval longer than the test (not JOINs for 700 ms of wall time
  // against a 1.5 s interval: on a loaded machine fewer were sent, or a second interval began)
  const JOINS = 40;
  const { g, nodes } = await startGroup(2, 38, {}, { ...TIMING, resyncIntervalMs: 600_000 });
  const [L] = nodes;
  const [J] = g.add(1, { faults: { noJoin: true } });
  await g.linked();
  let repeats = 0;                                     // J's JOINs dropped as repeated
  L.mesh.on('drop', ({ peer, reason }) => { if (peer === J.id && /a repeated JOIN/.test(reason)) repeats++; });
  let transfers = 0;                                   // STATE messages from the leader to J
  const send = L.mesh.send.bind(L.mesh);
  L.mesh.send = (to, msg) => { if (to === J.id && msg.type === TYPES.STATE) transfers++; return send(to, msg); };
  for (let i = 0; i < JOINS; i++) {
    J.sendJson(L.id, TYPES.JOIN, { protocol: J.mesh.version, dataId: 'builtin:test' });
    await sleep(5);
  }
  // every JOIN but the first, and one after the transfer went (J gave up on it: stage 'snapshot'
  // again, silently), is a repeat while a transfer is pending
  await g.until(() => transfers >= 1 && repeats >= JOINS - 2, `the state transfer and the repeated JOINs dropped (${repeats})`);
  assert.equal(transfers, 1, 'one state transfer per interval to the same joiner');
  L.ctl.stop();
  await g.ended(nodes);
  await g.close();
});

test('a joiner that stalls (asks, never reads) gets a window of forwarded steps per transfer, and each time it asks again waits longer (issue 27, property 4)', async () => {
  const { g, nodes } = await startGroup(2, 39);
  const [L] = nodes;
  const [J] = g.add(1, { faults: { noJoin: true } });
  await g.linked();
  J.mesh.receive = () => {};                          // it asks, then never reads what it is sent
  let fwd = 0;
  const transfers = [];                               // when the leader decided to send it a state (join.js sendSync's clock)
  // per transfer, the group's steps from its state's step to firstAckMs after the state was sent
  // (a timer started then, which a loaded machine only makes later: a looser bound, never a false one)
  const firstWait = [];
  const send = L.mesh.send.bind(L.mesh);
  L.mesh.send = (to, msg) => {
    if (to === J.id && msg.type === TYPES.FWD) fwd++;
    const sent = send(to, msg);
    if (to === J.id && msg.type === TYPES.STATE) {
      // the time the rule compared (run.transfers), not this send's: the send comes after the state's
      // encoding and the SYNC, later by an amount a loaded machine varies (a gap 1 ms short was seen)
      transfers.push(L.ctl.run.transfers.get(J.id));
      sent.then(() => setTimeout(() => firstWait.push(L.completed - msg.step), TIMING.firstAckMs), () => {});
    }
    return sent;
  };
  const stalled = () => L.notes.filter((t) => /Stopped syncing p2 in: it confirmed none of the last \d+ forwarded steps/.test(t)).length;
  const at = L.completed;
  const perTransfer = [];
  for (let k = 0; k < 3; k++) {
    const before = fwd;
    J.sendJson(L.id, TYPES.JOIN, { protocol: J.mesh.version, dataId: 'builtin:test' });
    await g.until(() => stalled() > k, `stalled sync ${k + 1}`, 20_000);
    perTransfer.push(fwd - before);
  }
  const steps = L.completed - at;
  await g.until(() => firstWait.length === transfers.length, 'the first confirmation waits timed');
  const gaps = transfers.slice(1).map((t, i) => t - transfers[i]);
  console.log(`# a stalled joiner over ${steps} steps of the group: ${transfers.length} states, forwarded steps ${perTransfer.join(', ')} ` +
    `(group steps to the end of each first confirmation's wait ${firstWait.join(', ')}; gaps ${gaps.map((x) => x.toFixed(0)).join(', ')} ms)`);
  assert.equal(transfers.length, 3);
  // each transfer waited STALL_FACTOR (4) times longer than the one before
  gaps.forEach((gap, i) => assert.ok(gap >= TIMING.resyncIntervalMs * 4 ** (i + 1), `transfer ${i + 2} came ${gap.toFixed(0)} ms after the one before`));
  // per transfer a window of forwarded steps, or the steps of the first confirmation's wait (counted
  // in group steps, not guessed from an average rate: that bound failed on a loaded machine), where a
  // forwarded step per group step went out before, until the sync deadline
  perTransfer.forEach((n, k) => {
    const most = Math.max(FWD_WINDOW, firstWait[k]) + 2;
    assert.ok(n <= most, `${n} forwarded steps in stalled sync ${k + 1}: over ${most} (its first confirmation's wait ended ${firstWait[k]} steps after its state's)`);
  });
  const done = fwd, at2 = L.completed;
  await g.until(() => L.completed >= at2 + 20, 'more steps');
  assert.equal(fwd, done, 'no forwarded step once its sync is dropped');
  assert.equal(L.ctl.run.joiners.size, 0);
  L.ctl.stop();
  await g.ended(nodes);
  await assertHonest(nodes);
  await g.close();
});

// ---- 3. partial partitions ----------------------------------------------------------------------

for (const P of [3, 4]) {
  test(`partial partition of ${P}: the link A-B cut while both keep the others: no fork, nobody dropped on another's word`, async () => {
    const { g, nodes } = await startGroup(P, 40 + P);
    await g.until(() => nodes[0].completed >= 4, '4 steps');
    const [A, B] = nodes;
    g.cut(A, B);
    await g.until(() => nodes.every((n) => n.ended || n.ctl.phase !== 'running' || n.completed >= 14), 'an outcome', 15_000);
    const running = nodes.filter((n) => !n.ended);
    for (const n of running) n.ctl.stop();
    await g.ended(nodes, 10_000);
    // either everyone stopped with the alarm, or a quorum went on without one of A, B (the one the
    // acting leader lost by its own link) and every page that went on agrees
    await assertHonest(nodes);
    for (const n of nodes) for (const ch of changes(n)) for (const id of ch.left) assert.ok(id === A.id || id === B.id, `${n.id} removed ${id}`);
    await g.close();
  });
}

// ---- the start: resuming a stopped run sends the state (STATE, read by readPeerState) -----------

test('a stopped run resumed: the members take the leader\'s STATE and the steps go on as one run', async () => {
  const { g, nodes } = await startGroup(3, 51);
  const [a, b, c] = nodes;
  await g.until(() => a.completed >= 4, '4 steps');
  a.ctl.stop();
  const first = await g.ended(nodes);
  const at = first[0].step;
  for (const n of nodes) { n.events.length = 0; }
  await a.ctl.start({ resume: true });
  await g.until(() => nodes.every((n) => n.ctl.phase === 'running'), 'resumed everywhere');
  assert.equal(a.ctl.run.desc.startStep, at);
  await g.until(() => a.completed >= at + 4, '4 more steps');
  c.ctl.stop();
  const ends = await g.ended(nodes);
  assert.equal(new Set(ends.map((e) => e.hash)).size, 1, g.describe());
  // one run of 3 peers from step 0: the stop and the resume change no bit
  const want = await referenceHashes([[0, 3]], ends[0].step);
  for (const n of nodes) for (const [s, x] of n.steps) assert.equal(x, want[s - 1], `${n.id} step ${s}`);
  await g.close();
});

// ---- local steps (docs/VERIFICATION.md "Local steps"): pages = the JS Group, without audits --------
async function localStepsReference(P, steps) {
  const ref = new RefGroup(makeConfig({ ...SETTINGS, local_steps: 4 }), P, stream, BACKEND);
  const want = [];
  while (want.length < steps) want.push((await ref.step()).hashes[0]);
  return { ref, want };
}

for (const [P, seed, stopper] of [[2, 25, 1], [3, 26, 0], [3, 27, 2]]) {
  test(`${P} controllers train local steps (H 4, no audits), stop after a round and equal the reference (net seed ${seed})`, async () => {
    const g = new Group({ seed });
    const nodes = g.add(P);
    await g.linked();
    await nodes[0].ctl.start({ ...SETTINGS, local_steps: 4, auditRate: 0 });      // (audits of rounds: audit_rounds.test.mjs)
    await g.until(() => nodes.every((n) => n.ctl.phase === 'running'), 'every node running');
    await g.until(() => nodes[0].completed >= 10, '10 steps');
    nodes[stopper].ctl.stop();                       // mid-round: every page stops after the round's exchange
    const ends = await g.ended(nodes);
    assert.equal(new Set(ends.map((e) => `${e.state} ${e.step} ${e.hash}`)).size, 1, g.describe());
    assert.equal(ends[0].state, 'stopped');
    assert.equal(ends[0].step % 4, 0, `stopped at step ${ends[0].step}, not after an exchange`);
    const { ref, want } = await localStepsReference(P, ends[0].step);
    for (const n of nodes) {
      for (const [s, x] of n.steps) assert.equal(x, want[s - 1], `${n.id} step ${s}: ${x.slice(0, 12)}, the reference ${want[s - 1].slice(0, 12)}`);
      assert.equal(n.steps.size, ends[0].step);
      assert.deepEqual(n.run.replica.params['head.weight'], ref.replicas[0].anchor['head.weight'], 'a stopped page keeps the group weights');
    }
    await g.close();
  });
}

// A departure mid-round (docs/VERIFICATION.md "Local steps"): the round is redone from its start
// without the member, each survivor with its own Adam state under its new slot; the survivors train
// on to the run's end, every step = the reference of the history they agreed (--roster R:2:SLOT)
for (const [gone, seed] of [[2, 28], [0, 30]]) {
  test(`a member that crashes mid-round in a run of local steps (slot ${gone}): the survivors redo the round without it and train on to the end`, async () => {
    const g = new Group({ seed });
    const nodes = g.add(3);
    await g.linked();
    await nodes[0].ctl.start({ ...SETTINGS, steps: 100, local_steps: 4, auditRate: 0 });
    await g.until(() => nodes.every((n) => n.ctl.phase === 'running'), 'every node running');
    // (every page past the first exchange: a crash during it may leave the pages a round apart, and
    // the group then redoes the run's first round, where every replica is the same: no slots named)
    await g.until(() => nodes.every((n) => n.completed >= 6), '6 steps everywhere');
    g.crash(nodes[gone]);
    const survivors = nodes.filter((_, i) => i !== gone);
    const ends = await g.ended(survivors, 60_000);
    for (const e of ends) assert.equal(e.state, 'done', g.describe());
    assert.equal(new Set(ends.map((e) => `${e.step} ${e.hash}`)).size, 1, g.describe());
    assert.equal(ends[0].step, 100);
    const h = survivors[0].history;
    assert.deepEqual(survivors[1].history, h);
    assert.equal(h.length, 2, JSON.stringify(h));
    assert.deepEqual([h[0], h[1][1], h[1][2]], [[0, 3], 2, [gone]], JSON.stringify(h));
    assert.equal(h[1][0] % 4, 0, `the roster changed at step ${h[1][0]}, not at a round's start`);
    for (const n of survivors) assert.equal(n.steps.size, 100);
    await assertHonest(nodes);
    await g.close();
  });
}

// A member that left during an exchange reached one page and not the other: that page completed
// the round (one round ahead) and goes back to the round before, where the other waits
test('a member whose last delta reached one page only: that page goes back a round, the survivors redo it without the member', async () => {
  const g = new Group({ seed: 32 });
  const [a, b, c] = g.add(3);
  const send = c.mesh.send.bind(c.mesh);
  c.mesh.send = (to, msg) => (msg.type === TYPES.GRAD && msg.step === 7 && to === b.id ? Promise.resolve() : send(to, msg));
  await g.linked();
  await a.ctl.start({ ...SETTINGS, steps: 100, local_steps: 4, auditRate: 0 });
  await g.until(() => a.completed >= 8, 'a past the exchange of step 8');
  assert.ok(b.completed <= 7, `b completed ${b.completed} steps without c's delta`);
  g.crash(c);
  const ends = await g.ended([a, b], 60_000);
  for (const e of ends) assert.equal(e.state, 'done', g.describe());
  assert.equal(ends[0].hash, ends[1].hash);
  assert.deepEqual(a.history, [[0, 3], [4, 2, [2]]]);
  assert.deepEqual(b.history, a.history);
  assert.ok(a.events.some(([e, p]) => e === 'step-undone' && p.step === 4), 'a went back to step 4');
  await assertHonest([a, b]);
  await g.close();
});

// A joiner (docs/VERIFICATION.md "Local steps"): the leader's state at a round start (the anchor,
// zero moments), then each exchange's D forwarded; it enters at a round start with a fresh Adam
// state, and every page = the reference of the history [[0, 2], [R, 3]] to its Stop
test('a device that opens the page during a run of local steps is synced in at a round start with a fresh Adam state; every step = the reference', async () => {
  const g = new Group({ seed: 29 });
  const nodes = g.add(2);
  await g.linked();
  await nodes[0].ctl.start({ ...SETTINGS, local_steps: 4 });
  await g.until(() => nodes.every((n) => n.ctl.phase === 'running'), 'every node running');
  await g.until(() => nodes[0].completed >= 4, '4 steps');
  const [late] = g.add(1);
  await g.linked();
  await g.until(() => late.ctl.phase === 'running', 'the late device synced in', 20_000);
  await g.until(() => late.completed >= late.history[1][0] + 10, '10 steps with the joiner');
  late.ctl.stop();
  const all = [...nodes, late];
  const ends = await g.ended(all, 60_000);
  for (const e of ends) assert.equal(e.state, 'stopped', g.describe());
  assert.equal(new Set(ends.map((e) => `${e.step} ${e.hash}`)).size, 1, g.describe());
  const h = nodes[0].history;
  assert.equal(h.length, 2, JSON.stringify(h));
  assert.deepEqual([h[0], h[1][1], h[1].length], [[0, 2], 3, 2], JSON.stringify(h));
  assert.equal(h[1][0] % 4, 0, `the joiner entered at step ${h[1][0]}, not at a round's start`);
  for (const n of all) assert.deepEqual(n.history, h);
  assert.equal(late.steps.size, ends[0].step - h[1][0], 'the joiner computed every step from its first round');
  await assertHonest(all);
  await g.close();
});

test('a joiner, then the leader crashes in a run of local steps: the joiner and the other member train on (own Adam states, renumbered) = the reference', async () => {
  const g = new Group({ seed: 33 });
  const [a, b] = g.add(2);
  await g.linked();
  await a.ctl.start({ ...SETTINGS, local_steps: 4 });
  await g.until(() => a.ctl.phase === 'running' && b.ctl.phase === 'running' && a.completed >= 4, 'running, 4 steps');
  const [c] = g.add(1);
  await g.linked();
  await g.until(() => c.ctl.phase === 'running', 'c synced in', 20_000);
  await g.until(() => c.completed >= c.history[1][0] + 2, 'c in its first round');
  g.crash(a);
  await g.until(() => [b, c].every((n) => n.ctl.phase === 'running' && n.run.roster.join() === `${b.id},${c.id}`), 'b leads c');
  await g.until(() => b.completed >= b.history.at(-1)[0] + 8, 'two rounds under b');
  c.ctl.stop();
  const ends = await g.ended([b, c]);
  assert.equal(ends[0].hash, ends[1].hash, g.describe());
  assert.equal(ends[0].step % 4, 0);
  assert.deepEqual(c.history, b.history);
  const last = b.history.at(-1);
  assert.equal(last[0] % 4, 0);
  // slot 0 left: at c's first round start folded into its entry ([R, 2, [0]]), or later ([R', 2, [0]])
  assert.deepEqual([last[1], last[2]], [2, [0]], JSON.stringify(b.history));
  await assertHonest([a, b, c]);
  await g.close();
});

test('server outage in a run of local steps: a crash leaves 2 of 3 without a quorum; both stop at one round start with one hash', async () => {
  const g = new Group({ seed: 34 });
  const nodes = g.add(3);
  await g.linked();
  g.serverDown = true;
  await nodes[0].ctl.start({ ...SETTINGS, local_steps: 4 });
  await g.until(() => nodes.every((n) => n.ctl.phase === 'running') && nodes[0].completed >= 6, 'running, 6 steps');
  g.crash(nodes[2]);
  const ends = await g.ended(nodes.slice(0, 2));
  for (const e of ends) assert.equal(e.state, 'stopped');
  assert.match(nodes[0].ended.message, /split the group in two/);
  assert.equal(ends[0].step, ends[1].step, g.describe());
  assert.equal(ends[0].hash, ends[1].hash);
  assert.equal(ends[0].step % 4, 0, `stopped at step ${ends[0].step}, not at a round start`);
  assert.equal(changes(nodes[0]).length, 0);
  await assertHonest(nodes);
  await g.close();
});

