// Audited gradients over the mesh (frontend_js/run/audits.js, issue 20): run controllers over the
// in-memory transport (run_harness.mjs) with one page misbehaving through its fault plan, every
// page drawing the reference run's nonces. Each honest page must end with exactly the reference
// run of the same attack (frontend_js/attack.js AuditedRun, itself tested equal to python -m
// daisy.train --attack): the same steps kept, hash for hash, the same peer removed.
//   1. a member scaling its gradient by -1000 (all-gather, P = 3 and 2); a departure is a barrier (a
//      forger leaving at once); the leaver's last message lost to one survivor: its lie is moot
//   2. a lying auditor (accuses whomever it audits)
//   3. a NaN gradient (the cheap check; f64 exchange, where it decodes)
//   4. two colluders of five (reduce-scatter): each passes the other; both caught, rolled back in turn
//   5. a lying shard owner (reduce-scatter): its REDUCED forged, caught by the audit of its transcript;
//      a lying auditor accusing an owner's reduce: the transcript clears the owner, the accuser goes
//   6. nobody lies: audits on change nothing (every step = the plain reference); a forged
//      EVIDENCE naming no audit, and a malformed AUDIT: dropped, nobody removed
//   7. a member floods TRANSCRIPT_ASKs and repeated AUDITs (issue 27): the bytes it makes the honest
//      pages send beyond the run's own are at most 10x its flood, every frame of it a bad frame
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Group, SETTINGS, BACKEND, TIMING, TYPES, firstOffReference, jsonPayload, sleep } from './run_harness.mjs';
import { attackedRun } from './attack_runs.mjs';
import { HEADER_BYTES, parseHeader, typeName } from '../../frontend_js/mesh/frames.js';
import { scheduleString } from '../../frontend_js/mesh/roster.js';

const STEPS = 100;          // the shortest run a config allows

// -> {nodes, g}: a group of `peers`, the one in slot `liar` with `faults`, all with the reference's nonces
async function audited(peers, liar, faults, settings, timing = TIMING) {
  const g = new Group({ seed: 11, timing });
  const nodes = [];
  for (let i = 0; i < peers; i++) nodes.push(...g.add(1, { faults: { referenceNonces: true, ...(i === liar ? faults : {}) } }));
  await g.linked();
  await nodes[0].ctl.start({ ...SETTINGS, steps: STEPS, ...settings });
  return { g, nodes };
}

// the reference run of `attack`: Map step -> hash of the kept timeline, and its removals
async function reference(peers, attack, settings) {
  const { rec } = await attackedRun({ settings: { ...SETTINGS, steps: STEPS, ...settings }, peers, attack, steps: STEPS, backend: BACKEND });
  return { hashes: new Map([...rec.steps].map(([s, { hashes }]) => [s, hashes[0]])), removals: rec.events };
}

// every step the honest page kept equals the reference's, and it kept all of them
function assertKept(node, ref) {
  for (let s = 1; s <= STEPS; s++) {
    const got = node.steps.get(s), want = ref.hashes.get(s);
    assert.ok(got !== undefined, `${node.id} kept no step ${s}`);
    assert.equal(got, want, `${node.id}: first mismatch at step ${s}: ${got?.slice(0, 16)} vs the reference's ${want.slice(0, 16)}`);
  }
}

const convictions = (n) => n.events.filter(([e]) => e === 'convicted').map(([, p]) => p);
// the convictions a roster left moot (a leaver's lie at a step it undid): [[peer, step]]
const moots = (n) => n.events.filter(([e]) => e === 'conviction-moot').map(([, p]) => [p.peer, p.step]);

async function attackCase(peers, liarSlot, faults, attack, settings = {}) {
  const ref = await reference(peers, attack, settings);
  assert.equal(ref.removals.length, 1, `the reference removes one peer: ${JSON.stringify(ref.removals)}`);
  const { g, nodes } = await audited(peers, liarSlot, faults, settings);
  try {
    const removed = `p${ref.removals[0].peer}`;
    const honest = nodes.filter((n) => n.id !== removed);
    await g.ended(honest, 60_000);
    for (const n of honest) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(n.run.roster.includes(removed), false, `${n.id} still has ${removed}`);
      const c = convictions(n).find((x) => x.peer === removed);
      assert.ok(c, `${n.id} convicted ${removed}: ${JSON.stringify(convictions(n))}`);
      assert.equal(c.back, ref.removals[0].back, `${n.id} rolled back to ${c.back} (${c.why}), the reference to ${ref.removals[0].back}`);
      // an audit's conviction names the audited step, whenever its verdict came (a cheap check's may
      // name the step before, when the lie came with the next step's frames: its rollback is the same)
      if (!/not finite/.test(c.why)) assert.equal(c.step, ref.removals[0].step, `${n.id} convicted at step ${c.step}, the reference at ${ref.removals[0].step}`);
      assertKept(n, ref);
    }
    return { ref, honest };
  } finally { await g.close(); }
}

test('a member scaling its gradient by -1000 from step 5 (P = 3): caught, removed, rolled back; every honest page = the reference run of that attack', async () => {
  const { ref, honest } = await attackCase(3, 1, { forge: { from: 5, kind: 'scale', factor: -1000 } }, 'slot=1,from=5,kind=scale:-1000');
  for (const n of honest) assert.match(convictions(n)[0].why, /gradient from p1 did not reproduce at step \d+: removed/);
  assert.ok(ref.removals[0].step > 5);
});

test('a member scaling its gradient by -1000 (P = 2): the single honest page goes on alone, = the reference', async () => {
  await attackCase(2, 1, { forge: { from: 3, kind: 'scale', factor: -1000 } }, 'slot=1,from=3,kind=scale:-1000');
});

test('a lying auditor (P = 3): its false accusation is checked by recomputation and removes it', async () => {
  const { honest } = await attackCase(3, 2, { liarAuditor: { from: 4 } }, 'slot=2,from=4,kind=liar-auditor');
  for (const n of honest) assert.match(convictions(n)[0].why, /p2 accused p\d at step \d+, whose gradient reproduced: p2 removed/);
});

test('a NaN gradient (f64 exchange): the cheap check convicts at once', async () => {
  const { honest } = await attackCase(3, 1, { forge: { from: 6, kind: 'nan' } }, 'slot=1,from=6,kind=nan', { exchange: 'f64' });
  // (step 7's lie, or step 8's frames when the lie came with them on a loaded machine: attackCase)
  for (const n of honest) assert.match(convictions(n)[0].why, /gradient from p1 is not finite at step [78]: removed/);
});

test('two colluders in a group of five (reduce-scatter) forge and pass each other: both caught in turn, every honest page = the reference', async () => {
  const attack = 'slot=1+3,from=5,kind=scale:-1000';
  const ref = await reference(5, attack, {});
  assert.equal(ref.removals.length, 2, `the reference removes both: ${JSON.stringify(ref.removals)}`);
  const g = new Group({ seed: 12 });
  const nodes = [];
  const forge = { from: 5, kind: 'scale', factor: -1000, colluders: ['p1', 'p3'] };
  for (let i = 0; i < 5; i++) nodes.push(...g.add(1, { faults: { referenceNonces: true, ...(i === 1 || i === 3 ? { forge } : {}) } }));
  await g.linked();
  await nodes[0].ctl.start({ ...SETTINGS, steps: STEPS });
  try {
    const honest = [nodes[0], nodes[2], nodes[4]];
    await g.ended(honest, 90_000);
    for (const n of honest) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(n.run.roster, ['p0', 'p2', 'p4']);
      assert.deepEqual(convictions(n).map((c) => [c.peer, c.back]), ref.removals.map((r) => [`p${r.peer}`, r.back]), `${n.id}: the same removals and rollbacks as the reference`);
      assertKept(n, ref);
    }
  } finally { await g.close(); }
});

test('a lying shard owner (reduce-scatter, P = 4, int8): its forged REDUCED poisons every replica alike, the audit of its reduce (its transcript) removes it; every honest page = the reference', async () => {
  const { ref, honest } = await attackCase(4, 2, { liarOwner: { from: 4 } }, 'slot=2,from=4,kind=liar-owner', { exchange: 'int8' });
  for (const n of honest) assert.match(convictions(n)[0].why, /reduced shard from p2 did not reproduce at step \d+: removed \(its reduced shard did not reproduce; audited by p\d\)/);
  assert.ok(ref.removals[0].step > 4);
});

test('a lying auditor accusing an owner\'s reduce (P = 4): every member asks the owner for its transcript, which clears it; the accuser is removed, as the reference removes a lying auditor', async () => {
  const { honest } = await attackCase(4, 2, { liarAuditor: { from: 4, reduce: true } }, 'slot=2,from=4,kind=liar-auditor', { exchange: 'int8' });
  for (const n of honest) assert.match(convictions(n)[0].why, /p2 accused the reduced shard of p\d at step \d+, which reproduced: p2 removed/);
});

test('a departure is a barrier: a member forges at step 9, withholds its AUDIT frames and leaves once every member completed that step; every honest page checks its unaudited steps, convicts it and keeps the reference run of that removal', async () => {
  const K = 9;
  const ref = await reference(3, `slot=1,from=${K},kind=scale:-1000,leave=${K + 1}`, {});
  assert.deepEqual(ref.removals.map((r) => [r.peer, r.step]), [[1, K + 1]], `the reference's barrier convicts at step ${K + 1}: ${JSON.stringify(ref.removals)}`);
  // (a long exchange deadline: nobody here is lost by one, and each survivor's recomputation at the
  // barrier shares this process's one event loop with the others': on a loaded 2-core machine a
  // survivor went unheard for the 3 s default, its peer reported it lost, and the run stopped)
  const { g, nodes } = await audited(3, 1, { forge: { from: K, kind: 'scale', factor: -1000 }, withholdAudits: { from: K } }, {}, { ...TIMING, deadlineMs: 15_000 });
  try {
    const [a, forger, c] = nodes;
    g.freeze(forger, K + 1);          // it computes nothing after its forged step: the reference's leave=K+1
    await g.until(() => nodes.every((n) => n.completed >= K + 1), `every member completed step ${K + 1}`, 30_000);
    g.leave(forger);
    await g.ended([a, c], 60_000);
    for (const n of [a, c]) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(n.run.roster, ['p0', 'p2']);
      const got = convictions(n).map((x) => [x.peer, x.step, x.back]);
      assert.deepEqual(got, [['p1', K + 1, ref.removals[0].back]], `${n.id}: convicted ${JSON.stringify(got)}, the reference ${JSON.stringify(ref.removals)}`);
      assert.match(convictions(n)[0].why, /checked when it left/);
      assert.deepEqual(moots(n), [], `${n.id}: no conviction left moot`);
      assertKept(n, ref);
    }
  } finally { await g.close(); }
});

// CI's fuzz of timings found this (a fresh-clone run, 2026-12-05): the leaver completed its forged
// step and closed its page before its last message reached one survivor. The survivors then stand
// one step apart: the one ahead convicts it at that step, the one behind cannot (the bytes never
// came); they judged otherwise and the run stopped. The roster resumes at the lower position, which
// undoes that step everywhere: the lie is moot (run/rollback.js standing) and both agree.
test('the leaver\'s forged message reached one survivor only (its page closed before the last frames went): that survivor convicts, the other cannot; the roster undoes the step, the lie is moot, and both keep the plain run of the departure', async () => {
  const K = 9;
  const { g, nodes } = await audited(3, 1, { forge: { from: K, kind: 'scale', factor: -1000 }, withholdAudits: { from: K } }, {}, { ...TIMING, deadlineMs: 15_000 });
  try {
    const [a, forger, c] = nodes;
    g.freeze(forger, K + 1);
    const gradOf = (bytes, step) => {
      try { const h = parseHeader(bytes); return (h.type === TYPES.GRAD || h.type === TYPES.GRAD_PART) && h.step === step; } catch { return false; }
    };
    g.net.lose((from, to, bytes) => from === forger.id && to === a.id && gradOf(bytes, K));
    await g.until(() => forger.completed >= K + 1 && c.completed >= K + 1, `the forger and p2 completed step ${K + 1}`, 30_000);
    assert.equal(a.completed, K, 'p0 still waits for the forged message it never gets');
    g.leave(forger);
    await g.ended([a, c], 60_000);
    for (const n of [a, c]) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(n.run.roster, ['p0', 'p2']);
      assert.equal(scheduleString(n.history), `0:3,${K}:2`, `${n.id}: the group of 2 trains from step ${K + 1}`);
      const off = await firstOffReference(n);
      assert.equal(off, null, off);
    }
    assert.deepEqual(convictions(c).map((x) => [x.peer, x.step]), [['p1', K + 1]], 'p2 completed the forged step and convicted its sender');
    assert.deepEqual(moots(c), [['p1', K + 1]], 'p2: the roster left that conviction moot');
    assert.deepEqual(convictions(a), [], 'p0 never had the forged bytes');
  } finally { await g.close(); }
});

test('nobody lies: every page audits and every step is the plain reference; evidence naming no audit and a malformed AUDIT are dropped', async () => {
  const { g, nodes } = await audited(3, -1, {});
  try {
    const [a, b, c] = nodes;
    await g.until(() => a.completed >= 6, 'six steps', 20_000);
    // a forged EVIDENCE from c: step 2, slot 0, which c did not audit (or with another commitment)
    c.sendJson(a.id, TYPES.EVIDENCE, { runId: a.run.desc.runId, epoch: 0, step: 2, slot: 0, accuser: 2, committed: '0'.repeat(64), recomputed: '1'.repeat(64) }, { runId: a.run.desc.runId, slot: 2 });
    c.sendJson(b.id, TYPES.AUDIT, { runId: a.run.desc.runId, epoch: 0, step: 3, hashes: ['zz'], loss: 1, nonceHash: 'x', reveal: null, beacon: null }, { runId: a.run.desc.runId, slot: 2 });
    await g.ended(nodes, 60_000);
    for (const n of nodes) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(convictions(n), [], `${n.id} convicted nobody`);
      const off = await firstOffReference(n);
      assert.equal(off, null, off);
      assert.ok(n.run.book === null || n.run.book.audits >= 0);
    }
    const { run: plain } = await attackedRun({ settings: { ...SETTINGS, steps: STEPS }, peers: 3, attack: null, steps: STEPS, backend: BACKEND });
    const ran = nodes.reduce((k, n) => k + n.ctl.lastRun.book.audits, 0);
    assert.equal(ran, plain.audits, `the pages ran ${ran} audits, the reference's schedule has ${plain.audits}`);
    assert.ok(ran >= 0.1 * 3 * STEPS * 0.5, `about rate x P audits per step: ${ran} in ${STEPS} steps`);
    assert.ok(a.mesh.drops?.some?.((d) => /EVIDENCE/.test(d.why || d.reason || '')) ?? true);
  } finally { await g.close(); }
});

// ---- 7. bounded audit traffic ----------------------------------------------------------------------

// a run of 4 (reduce-scatter, int8) where p3, when `flood`, at every FLOOD_EVERY-th step it completes
// asks every owner for its transcripts of the 5 steps around the one audits are at (one of them twice)
// and repeats its AUDIT of that step; and repeats each TRANSCRIPT_ASK its own audits send, at once.
// Paced by p3's steps, not a clock, so the flood is the same on any machine: 9 rounds of at most 7
// frames on a link, far under the flood limit however fast the steps go. It never asks an owner for
// a transcript the beacon owes p3 before p3's own audit asked for it: the owner would answer the
// flood's ask at once, p3's page (not asking yet) would drop the answer, and its own ask, now a
// repeat, would go unanswered: p3 would report the owner lost and stop the run, by its own doing
// (the old clock-paced flood did, on a loaded machine). -> {flood: {frames, bytes} it flooded,
// caused: bytes the honest pages sent p3 beyond the run's own traffic, byType: the same by frame
// type, drops: the honest pages' drop lines about p3, unasked, asked: the transcripts p3's audits asked}
const FLOOD_EVERY = 10;
// what a trouble-free run sends p3: no frame of these types answers a frame of p3's
const OWN_TRAFFIC = new Set([TYPES.HELLO, TYPES.RUN, TYPES.GO, TYPES.GRAD, TYPES.GRAD_PART, TYPES.REDUCED, TYPES.AUDIT, TYPES.TRANSCRIPT_ASK, TYPES.FIN]);
async function floodRun(flood) {
  const { g, nodes } = await audited(4, -1, {}, { exchange: 'int8' });
  const liar = nodes[3], honest = nodes.slice(0, 3);
  const drops = [];
  for (const n of honest) n.mesh.on('drop', ({ peer, line }) => { if (peer === liar.id) drops.push(line); });
  let unasked = 0;           // transcripts p3's own (honest) code never asked for
  liar.mesh.on('drop', ({ line }) => { if (/TRANSCRIPT (for no audit|of step \d+ from slot \d+, not asked|not asked)/.test(line)) unasked++; });
  const sent = { frames: 0, bytes: 0 };      // the flood: every frame one chunk (its JSON << a frame)
  const floodJson = (to, type, obj, fields) => { sent.frames++; sent.bytes += HEADER_BYTES + jsonPayload(obj).length; liar.sendJson(to, type, obj, fields); };
  // per-frame accounting of what the honest pages send p3: a TRANSCRIPT is the run's own when it is
  // the first of its owner and step and p3's audits asked for it (its book says so when p3's ask is
  // sent); any other TRANSCRIPT, and any frame of a type not of the run's own traffic, the flood caused
  const askedByAudits = new Set(), answered = new Set(), caused = new Map();   // owner:step
  const cause = (type, n) => caused.set(typeName(type), (caused.get(typeName(type)) ?? 0) + n);
  g.net.watch((from, to, bytes) => {
    const h = parseHeader(bytes), run = liar.run;
    if (from === liar.id && h.type === TYPES.TRANSCRIPT_ASK && h.chunkCount === 1) {
      const ask = JSON.parse(new TextDecoder().decode(h.data)), key = `${to}:${ask.step}`;
      if (run.book?.asked.has(`${ask.epoch}:${ask.step}:${run.roster.indexOf(to)}`) && !askedByAudits.has(key)) {
        askedByAudits.add(key);
        if (flood) floodJson(to, TYPES.TRANSCRIPT_ASK, ask, { runId: h.runId, slot: h.slot });   // the repeat
      }
    }
    if (to !== liar.id) return;
    if (h.type === TYPES.TRANSCRIPT) {
      const key = `${from}:${h.step}`, first = `${key}:${h.msgId}`;
      if (askedByAudits.has(key) && (!answered.has(key) || answered.has(first))) { answered.add(key); answered.add(first); return; }
      cause(h.type, bytes.length);
    } else if (!OWN_TRAFFIC.has(h.type)) cause(h.type, bytes.length);
  });
  const tick = () => {
    const run = liar.ctl.run, b = run.book;
    const step = run.completed - 2, runId = run.desc.runId, fields = { runId, slot: run.slot };
    for (const n of honest) {
      const k = run.roster.indexOf(n.id);
      for (const t of [step + 1, step, step - 1, step - 2, step - 3, step]) {
        const pairs = b.pairs.get(t), owed = pairs?.some(([auditor, audited]) => auditor === run.slot && audited === k);
        if (pairs && (!owed || b.asked.has(`${run.epoch}:${t}:${k}`))) floodJson(n.id, TYPES.TRANSCRIPT_ASK, { runId, epoch: run.epoch, step: t }, fields);
      }
      floodJson(n.id, TYPES.AUDIT, { runId, epoch: run.epoch, step, hashes: Array(4).fill('ab'.repeat(32)), loss: 1,
        nonceHash: 'cd'.repeat(32), reveal: null, beacon: null }, fields);
    }
  };
  const onEvent = liar.onEvent.bind(liar);
  if (flood) liar.onEvent = (event, payload) => { onEvent(event, payload); if (event === 'step' && payload.step % FLOOD_EVERY === 0 && payload.step < STEPS) tick(); };
  try {
    await g.ended(nodes, 60_000);
    await sleep(TIMING.deadlineMs + 500);         // asks held for their deadline are answered or dropped by then
    for (const n of honest) {
      assert.equal(n.ended.state, 'done', `${n.id}: ${n.ended.message}`);
      assert.deepEqual(convictions(n), [], `${n.id} convicted nobody`);
      const off = await firstOffReference(n);
      assert.equal(off, null, off);
    }
    assert.equal(liar.ended.state, 'done', `${liar.id}: ${liar.ended.message}`);
    return { flood: sent, caused: [...caused.values()].reduce((a, x) => a + x, 0), byType: Object.fromEntries(caused), drops, unasked, asked: askedByAudits.size };
  } finally { await g.close(); }
}

test('a member flooding TRANSCRIPT_ASKs and repeated AUDITs makes the honest pages send at most 10x what it floods; each frame of it is a bad frame (issue 27, property 3)', async () => {
  const floodLine = /a second TRANSCRIPT_ASK|not this step's auditor|no transcript of it kept|a repeated AUDIT/;
  const base = await floodRun(false);
  const hit = await floodRun(true);
  const bad = hit.drops.filter((l) => floodLine.test(l)).length;
  console.log(`# p3 flooded ${hit.flood.frames} frames (${hit.flood.bytes} bytes); its audits asked ${hit.asked} transcripts; ` +
    `the honest pages sent it ${hit.caused} bytes beyond the run's own ${JSON.stringify(hit.byType)}; ${bad} counted as bad frames`);
  assert.ok(hit.flood.frames >= 9 * 3 * 2, `the member flooded ${hit.flood.frames} frames`);
  assert.ok(hit.caused <= 10 * hit.flood.bytes, `the honest pages sent ${hit.caused} bytes beyond the run's own ${JSON.stringify(hit.byType)} for ${hit.flood.bytes} flooded bytes`);
  assert.equal(hit.unasked, 0, 'every transcript p3 got was one its audits asked for');
  // every flooded frame is a bad frame (unasked, repeated or stale asks, repeated AUDITs), one drop
  // each: where the flood's repeat of p3's own ask came first, p3's own ask is the repeat dropped
  assert.ok(bad >= hit.flood.frames, `${bad} of ${hit.flood.frames} flooded frames counted as bad: ${hit.drops.filter((l) => !floodLine.test(l)).slice(0, 5).join(' | ')}`);
  // an honest p3 gets no transcript but the answers to its audits' asks (a recovery's HALT or STATUS,
  // should a loaded machine miss a deadline, is no answer to p3: not asserted here)
  assert.equal(base.byType.TRANSCRIPT ?? 0, 0, `an honest p3 got more transcripts than its audits asked for: ${JSON.stringify(base.byType)}`);
  assert.equal(base.drops.filter((l) => floodLine.test(l)).length, 0, `an honest p3 sends none: ${base.drops.slice(0, 5).join(' | ')}`);
});
