// Random schedules of the run controller (frontend_js/run/, issue 19) over the in-memory
// transport: 2..4 controllers train real tiny steps while joins, goodbyes, crashes, cut links, a
// server outage and one lying member's forged messages happen at random points. After each
// schedule:
//   1. no silent fork: two honest pages that both completed a step hold the same hash there,
//      unless one of them stopped with an alarm; every completed step of every honest page equals
//      the JS Group (frontend_js/train.js, tested equal to Python) on that page's roster history;
//   2. no eviction on hearsay: an honest page that never left, crashed or lost a link is in no
//      honest page's list of removed peers;
//   3. leadership from the rules: every new roster is led by the most senior member of the one
//      before that it keeps.
// The liar's lies: forged STATUS, HALT, ROSTER, STOP, FIN, replays, JOIN floods, and a forged
// gradient right before its own Stop (a run's end is a barrier: every honest page removes it).
// FUZZ_SCHEDULES=N (default 200), DAISY_FUZZ_SEED=S reproduces a run (its seed is printed on
// failure and at the start), FUZZ_ONLY=i runs its schedule i alone.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Group, SETTINGS, DATA_ID, TYPES, firstOffReference } from './run_harness.mjs';
import { draw, key } from '../../frontend_js/prng.js';

const SCHEDULES = Number(process.env.FUZZ_SCHEDULES || 200);
const SEED = Number(process.env.DAISY_FUZZ_SEED || (Date.now() % 1_000_000));
const TIMING = { linkWaitMs: 100, acceptWaitMs: 2000, goWaitMs: 2000, finWaitMs: 300, deadlineMs: 2000, reachMs: 400, deadlineSteps: 5,
  confirmWaitMs: 150, joinWaitMs: 600, syncDeadlineMs: 800, resyncIntervalMs: 100, chunkMs: 25 };

const rngOf = (seed) => { const k = key(0x46555a5a, seed >>> 0); let i = 0; return (n) => draw(k, i++) % n; };

const changes = (n) => n.events.filter(([e]) => e === 'roster-changed').map(([, p]) => p);
const starts = (n) => n.events.filter(([e]) => e === 'run-started').map(([, p]) => p);

// The deadline is long (a loaded machine must not trip it: property 2 is checked strictly, every
// honest page removed must have left, crashed or lost a link); how recently a peer was heard for
// this device to vouch for it (reachMs) is short, so a cut link's refusal comes quickly.
// Liveness bounds are generous (a loaded CI machine stretches every deadline, which follows the
// group's pace); they are never reached when all goes well, so they cost no time.

// the liar's forged messages: its controller runs honestly otherwise (its gradients are real, so
// every honest step still has a reference), except when it stops the run (forgeStop)
const LIES = {
  status(g, H, victim, target) {
    const send = H.mesh.sendJson.bind(H.mesh);
    H.mesh.sendJson = (to, type, obj, f) => send(to, type, type === TYPES.STATUS ? { ...obj, gone: [victim.id] } : obj, f);
    const run = H.ctl.run;
    if (run) H.sendJson(target.id, TYPES.STATUS, { runId: run.desc.runId, epoch: run.epoch, completed: run.completed, hash: run.hash, gone: [victim.id] }, { runId: run.desc.runId, slot: run.slot });
  },
  halt(g, H, victim, target) {
    const run = H.ctl.run;
    if (run) H.sendJson(target.id, TYPES.HALT, { runId: run.desc.runId, epoch: run.epoch + 1, gone: [victim.id] }, { runId: run.desc.runId, slot: run.slot });
  },
  roster(g, H, victim, target) {
    const run = H.ctl.run;
    if (!run) return;
    const roster = run.roster.filter((id) => id !== victim.id);
    const [self] = roster.splice(roster.indexOf(H.id), 1);
    roster.unshift(self);
    const msg = { runId: run.desc.runId, epoch: run.epoch + 1, base: run.epoch, from: run.completed, roster, left: [victim.id], joined: [], history: [[0, roster.length]], reason: 'forged' };
    H.sendJson(target.id, TYPES.ROSTER, msg, { runId: run.desc.runId, slot: run.slot });
    H.sendJson(target.id, TYPES.GO, { runId: run.desc.runId, epoch: run.epoch + 1, digest: '0'.repeat(64) }, { runId: run.desc.runId, slot: run.slot });
  },
  stop(g, H, victim, target) {
    const run = H.ctl.run;
    if (run) H.sendJson(target.id, TYPES.STOP, { runId: run.desc.runId, stopAfter: run.completed, reason: 'forged mismatch', mismatch: true }, { runId: run.desc.runId, slot: run.slot });
  },
  fin(g, H, victim, target) {
    const run = H.ctl.run;
    if (run) H.sendJson(target.id, TYPES.FIN, { runId: run.desc.runId, epoch: run.epoch, step: run.completed, hash: 'a'.repeat(64), undrawn: [] }, { runId: run.desc.runId, slot: run.slot });
  },
  replay(g, H, victim, target) {
    // an old proposal of this run (the start's descriptor, a RUN) and a GO: refused or ignored
    const run = H.ctl.run;
    if (run) { H.sendJson(target.id, TYPES.RUN, run.desc, { runId: run.desc.runId }); H.sendJson(target.id, TYPES.GO, { runId: run.desc.runId }, { runId: run.desc.runId }); }
  },
  join(g, H, victim, target) {
    for (let i = 0; i < 20; i++) H.sendJson(target.id, TYPES.JOIN, { protocol: H.mesh.version, dataId: DATA_ID });
  },
};

// The liar's Stop: a gradient x -1000 at its next step, then its Stop right after (issue 27 §1).
// Every honest page must remove it at the end's barrier (a forged step kept is off the reference:
// check 1). (Drawn as the liar's 'stop', so the other schedules of a seed stay as they were.)
let forgeStops = 0;                 // schedules where it happened (said at the end)
function forgeStop(g, H) {
  const run = H.ctl.run;
  if (!run) return;
  forgeStops++;
  const from = run.lastSent + 1;
  H.ctl.faults.forge = { from, kind: 'scale', factor: -1000 };
  g.until(() => H.ctl.run !== run || run.lastSent >= from, 'the liar forged', 10_000)
    .then(() => { if (H.ctl.run === run) H.ctl.stop('forged, then stopped'); }, () => {});
}

async function schedule(seed) {
  const r = rngOf(seed);
  const g = new Group({ seed, timing: TIMING });
  const log = [];
  const P = 2 + r(3);
  const nodes = g.add(P);
  const liar = P >= 3 && r(2) === 0 ? nodes[1 + r(P - 1)] : null;
  const hurt = new Set();         // honest pages that left, crashed or lost a link (evidence is real)
  g.serverDown = r(5) === 0;
  await g.linked();
  try {
    await nodes[0].ctl.start(SETTINGS);
    await g.until(() => nodes.every((n) => n.ctl.phase === 'running'), 'every node running', 10_000);
    const honest = () => g.nodes.filter((n) => n !== liar);
    const alive = () => g.nodes.filter((n) => n.alive && n.ctl.phase === 'running');
    const progress = async (steps) => {
      const lead = alive()[0];
      if (!lead) return;
      const at = lead.completed;
      await g.until(() => !lead.alive || lead.ctl.phase !== 'running' || lead.completed >= at + steps, 'progress', 10_000);
    };
    const events = 1 + r(3);
    for (let e = 0; e < events; e++) {
      await progress(1 + r(2));
      const pool = alive();
      if (!pool.length) break;
      const pick = pool[r(pool.length)];
      const kind = ['crash', 'leave', 'join', 'cut', 'lie', 'lie', 'stop'][r(7)];
      log.push(`${kind} ${pick.id}`);
      if (kind === 'crash' && pick !== liar) { g.crash(pick); hurt.add(pick); }
      else if (kind === 'leave' && pick !== liar) { g.leave(pick); hurt.add(pick); }
      else if (kind === 'join' && g.nodes.length < 6) { g.add(1); await g.linked(); }
      else if (kind === 'cut') {
        const other = pool.find((n) => n !== pick && g.net.open.has(`${pick.id}\u0000${n.id}`));
        if (other) { g.cut(pick, other); hurt.add(pick); hurt.add(other); log.push(`  with ${other.id}`); }
      } else if (kind === 'lie' && liar && liar.ctl.phase === 'running') {
        const names = Object.keys(LIES);
        const lie = names[r(names.length)];
        const victims = honest().filter((n) => n.alive);
        if (!victims.length) continue;
        const victim = victims[r(victims.length)], target = victims[r(victims.length)];
        log.push(`  lie ${lie} about ${victim.id} to ${target.id}`);
        LIES[lie](g, liar, victim, target);
      } else if (kind === 'stop' && pick === liar) { log.push('  forge, then stop'); forgeStop(g, liar); }
      else if (kind === 'stop') { pick.ctl.stop(); }
    }
    await progress(1);
    for (const n of alive()) n.ctl.stop();
    const ending = honest().filter((n) => n.alive);
    await g.until(() => ending.every((n) => !n.alive || !['running', 'proposing', 'ending'].includes(n.ctl.phase)), 'every honest page ends', 15_000);
    // 1. no fork, and the reference
    // (a page closed or crashed before its run ended keeps nothing: it may hold a forged step it
    // applied, whose audit or barrier had not caught it yet, as every page does for a while —
    // seed 790054136: p0 closed during the end's barrier that convicted the forger)
    const hs = honest();
    for (const n of hs) {
      if (!n.alive && !n.ended) continue;
      const off = await firstOffReference(n);
      assert.equal(off, null, off);
    }
    const alarmed = (n) => n.ended && /split alarm|replica mismatch/.test(n.ended.error || '');
    for (const a of hs) for (const b of hs) {
      if (a === b || a.crashed || b.crashed || alarmed(a) || alarmed(b)) continue;
      // pages in different runs (one joined a run the other never was in) share no steps' meaning
      if (starts(a)[0]?.runId !== starts(b)[0]?.runId) continue;
      for (const [s, x] of a.steps) if (b.steps.has(s)) assert.equal(b.steps.get(s), x, `${a.id} and ${b.id} differ at step ${s}: a fork`);
    }
    // 2. no eviction on hearsay (a page whose run had ended before the step the group dropped it
    // from stopped on its own, e.g. on the liar's STOP, relayed too late for the others to step
    // back to: it left, nobody evicted it; seed 867456074, under CI's load)
    const stoppedBefore = (who, ch) => who.ended && who.ended.step < ch.from;
    for (const n of hs) for (const ch of changes(n)) for (const id of ch.left) {
      const who = g.nodes.find((x) => x.id === id);
      assert.ok(who === liar || hurt.has(who) || stoppedBefore(who, ch), `${n.id} removed ${id}, an honest page with every link up`);
    }
    // 3. leadership from the rules
    for (const n of hs) {
      let roster = starts(n)[0]?.roster;
      for (const ch of changes(n)) {
        if (roster) assert.equal(ch.roster[0], roster.find((id) => ch.roster.includes(id)), `${n.id}: ${ch.roster[0]} leads after ${JSON.stringify(roster)}`);
        roster = ch.roster;
      }
    }
  } catch (err) {
    err.message = `schedule seed ${seed} (P=${P}, liar ${liar?.id ?? 'none'}, server ${g.serverDown ? 'down' : 'up'}; ${log.join('; ')}): ${err.message}\n${g.describe()}`;
    throw err;
  } finally {
    await g.close();
  }
}

test(`fuzz: ${SCHEDULES} random schedules (base seed ${SEED}; DAISY_FUZZ_SEED=${SEED} reproduces)`, async () => {
  const t0 = Date.now();
  const only = process.env.FUZZ_ONLY === undefined ? null : Number(process.env.FUZZ_ONLY);
  for (let i = only ?? 0; i < (only === null ? SCHEDULES : only + 1); i++) {
    try {
      await schedule(SEED * 1000 + i);
    } catch (err) {
      console.log(`fuzz failed: DAISY_FUZZ_SEED=${SEED}, schedule ${i}`);
      throw err;
    }
  }
  console.log(`fuzz: ${SCHEDULES} schedules in ${((Date.now() - t0) / 1000).toFixed(1)} s (seed ${SEED}; the liar forged and stopped in ${forgeStops})`);
});

// schedules that failed once, run every time: a user's Stop plus a liar's HALT (a Stop that was a
// barrier let the HALT start a recovery the pages already ended did not answer: an honest page
// removed); the liar's forge-then-Stop with the liar's link to the leader cut (a conviction of a
// peer already gone started no recovery: the leader looped at the end's barrier); the liar's
// forge-then-Stop while the honest two lost their link (the quorum lost before the barrier: the
// page kept the forged step until an end before the barrier checked what it keeps, kept_check.js);
// an honest page closed during the end's barrier that convicted the forger (a closed page keeps
// nothing: check 1 looks at pages whose run ended); the forger cut from its auditor, which never
// drew that step's pairs, yet its FIN settled the pass another page drew (seen once under CI's load)
for (const seed of [449555049, 315974009, 707992039, 790054136, 300257098]) test(`fuzz schedule ${seed}, a past failure`, () => schedule(seed));
