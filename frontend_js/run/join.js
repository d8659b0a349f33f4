// Joining a running group (docs/ARCHITECTURE.md "Membership"). An idle device linked to a
// training group asks to join (JOIN). The leader answers at its next step boundary with SYNC (the
// run descriptor, roster, schedule, step, hash) and the state at that boundary (STATE), then
// forwards the group's reduced gradient of every later step (FWD), so the joiner catches up by
// Adam steps alone while the group keeps training. The joiner reports its hash (SYNCED); the
// leader checks it against its own at that step (a wrong one is re-synced) and, once the joiner
// is current, proposes the next roster two steps ahead (ROSTER; recovery.js takes it through
// ACCEPT and GO): the joiner contributes from that step.
//
// Work a joiner can cause is bounded: one state transfer in flight per joiner, at most one per
// resyncIntervalMs to the same device, a sync not finished within syncDeadlineMs drops the
// joiner (and its forwarding); a JOIN while its transfer is pending is dropped (counted toward
// the flood limit), one during its sync restarts it (the joiner gave up on it).
import { validAuditRate } from './audits.js';
import { TYPES } from '../mesh/frames.js';
import { unflatten } from '../collective.js';
import { encodeState, stateLimit, MAX_STATE_BYTES } from '../state_codec.js';
import { makeConfig, configToDict } from '../config.js';
import { paramShapes } from '../model.js';
import { scheduleWith, scheduleLocal, checkRoster, rosterDigest } from '../mesh/roster.js';
import { adamInit } from '../optim.js';
import { cloneParams, localJoiner } from '../train.js';
import { roundEnd } from './ending.js';
import { Joiner, JoinAttempt, RosterChange, MAX_JOINERS, MAX_RESYNCS, MAX_FWD_QUEUED, MAX_FWD_HELD, FWD_WINDOW,
  STALL_FACTOR, MAX_STALL_WAITS, validHistory, isHash, isRunId, short } from './record.js';
import { readPeerState, gradientBytes } from '../peer_state.js';

// ---- the leader ---------------------------------------------------------------------------------
export function onJoin(ctl, from, m) {
  const run = ctl.at, d = m.json, h = ctl.host;
  if (run.ended || run.roster[0] !== ctl.selfId) return;      // only the leader answers
  const no = (reason) => ctl.mesh.sendJson(from, TYPES.REFUSE, { runId: 0, reason }).catch(() => {});
  if (run.roster.includes(from)) { ctl.mesh.drop(from, m, 'JOIN from a member of the run'); return; }
  if (ctl.keptOut.has(from)) { no(`${h.nameOf(ctl.selfId)} keeps this device out (${ctl.keptOut.get(from)})`); return; }
  const j = run.joiners.get(from);
  if (j && j.stage === 'snapshot') { ctl.mesh.drop(from, m, 'a repeated JOIN while its state transfer is pending'); return; }
  if (j) {
    // it gave up on the transfer under way: no more forwarding to it; a new transfer goes out at
    // a boundary, no sooner than resyncIntervalMs after the last one (a sync it confirmed nothing
    // of stalled: the wait grows, as for one dropped by the forwarding window)
    if (j.verified === null) run.stalls.set(from, (run.stalls.get(from) || 0) + 1);
    j.stage = 'snapshot'; j.verified = null; j.admitted = null;
    return;
  }
  if (d.protocol !== ctl.mesh.version) { no(`protocol v${d.protocol}, the run's v${ctl.mesh.version}`); return; }
  if (d.dataId !== run.desc.dataId) { no(`different training data: the run's is ${run.desc.dataId}, the device's ${String(d.dataId).slice(0, 120)}`); return; }
  if (run.completed + 4 >= run.cfg.steps) { no('the run is about to end'); return; }
  if (run.joiners.size >= MAX_JOINERS || run.roster.length + run.joiners.size >= 64) { no('the group is full'); return; }
  run.joiners.set(from, new Joiner(0));
  h.note(`${h.nameOf(from)} asked to join: syncing it in at the next step boundary.`);
}

// after step s completed: the state to new joiners (no more often than resyncIntervalMs each, that
// wait multiplied by STALL_FACTOR for each of the device's syncs that stalled), the step's G to
// those catching up; a sync past its deadline is dropped, and so is one whose joiner confirms
// (SYNCED) none of FWD_WINDOW forwarded steps for ackMs (its first: firstAckMs after its state's
// send completed): a joiner that stalls costs the group a few seconds of forwarding and one
// state per wait, not a forwarded step per group step until the deadline (docs/PROTOCOL.md "One
// lying member" 5)
export function forwardToJoiners(ctl, run, s, flat) {
  const now = performance.now(), h = ctl.host;
  for (const [id, j] of run.joiners) {
    if (!ctl.mesh.isReady(id) || j.queued > MAX_FWD_QUEUED) { dropJoiner(run, id); continue; }
    if (j.stage === 'snapshot') {
      const last = run.transfers.get(id);
      const wait = ctl.t.resyncIntervalMs * STALL_FACTOR ** Math.min(run.stalls.get(id) || 0, MAX_STALL_WAITS);
      if (last === undefined || now - last >= wait) sendSync(ctl, run, id, j, now);
      continue;
    }
    // (local steps forward one exchange per round: the window is counted in rounds)
    if (j.admitted === null && s - Math.max(j.stateStep, j.verified ?? 0) >= FWD_WINDOW * run.cfg.local_steps
        && now - j.ackedAt >= (j.verified === null ? ctl.t.firstAckMs : ctl.t.ackMs)) {
      dropJoiner(run, id);
      run.stalls.set(id, (run.stalls.get(id) || 0) + 1);
      const why = `it confirmed none of the last ${s - Math.max(j.stateStep, j.verified ?? 0)} forwarded steps`;
      ctl.mesh.sendJson(id, TYPES.REFUSE, { runId: 0, reason: why }).catch(() => {});
      h.note(`Stopped syncing ${h.nameOf(id)} in: ${why}.`);
      continue;
    }
    if (j.admitted === null && now - j.sentAt > ctl.t.syncDeadlineMs) {
      dropJoiner(run, id);
      const why = `its sync did not finish within ${ctl.t.syncDeadlineMs / 1000} s`;
      ctl.mesh.sendJson(id, TYPES.REFUSE, { runId: 0, reason: why }).catch(() => {});
      h.note(`Stopped syncing ${h.nameOf(id)} in: ${why}.`);
      continue;
    }
    const payload = new Uint8Array(flat.buffer.slice(flat.byteOffset, flat.byteOffset + flat.byteLength));
    queueTo(j, () => ctl.mesh.send(id, { type: TYPES.FWD, runId: run.desc.runId, step: s, payload }));
    if (j.admitted !== null && s + 1 >= j.admitted) { run.joiners.delete(id); run.stalls.delete(id); }     // it has all it needs
  }
}

function queueTo(j, send) {
  j.queued++;
  j.chain = j.chain.then(() => (j.dropped ? null : send())).catch(() => {}).finally(() => { j.queued--; });
}

function dropJoiner(run, id) {
  const j = run.joiners.get(id);
  if (j) j.dropped = true;
  run.joiners.delete(id);
}

function sendSync(ctl, run, id, j, now) {
  const r = run.replica, step = run.completed;    // (the STATE goes out later: its header names this boundary, not the step then)
  j.stage = 'syncing';
  j.sentAt = now;
  j.stateStep = run.completed;
  j.ackedAt = Infinity;                        // until its state's send completed (below)
  j.verified = null;
  run.transfers.set(id, now);
  // encodeState copies the weights now: the state of this boundary, whatever the loop does next.
  // Local steps: a round start (W = the anchor); a joiner starts a fresh Adam state there, so zero
  // moments travel, never this device's own (docs/VERIFICATION.md "Local steps")
  const fresh = run.cfg.local_steps > 1 ? adamInit(r.params) : null;
  const body = new Uint8Array(encodeState(paramShapes(run.cfg), {
    config: run.desc.config, step: run.completed, adamT: fresh ? run.completed : r.adam.t, params: r.params,
    m: fresh ? fresh.m : r.adam.m, v: fresh ? fresh.v : r.adam.v, weightHash: run.hash, extra: run.extra }));
  const sync = { runId: run.desc.runId, desc: run.desc, roster: run.roster, epoch: run.epoch, history: run.history,
                 step: run.completed, hash: run.hash, bytes: body.length };
  queueTo(j, () => ctl.mesh.sendJson(id, TYPES.SYNC, sync, { runId: run.desc.runId }));
  queueTo(j, () => ctl.mesh.send(id, { type: TYPES.STATE, runId: run.desc.runId, step, payload: body }));
  queueTo(j, () => { j.ackedAt = performance.now(); });
}

export function onSynced(ctl, from, m) {
  const run = ctl.at, d = m.json, h = ctl.host;
  const j = run.joiners.get(from);
  if (!j || j.stage !== 'syncing' || d.runId !== run.desc.runId || !Number.isInteger(d.step) || !isHash(d.hash)) { ctl.mesh.drop(from, m, 'SYNCED from no joiner of ours'); return; }
  const ours = run.hashLog.get(d.step);
  if (ours === undefined) return;                     // too old to check: a later report will be
  if (ours !== d.hash) {
    j.resyncs++;
    if (j.resyncs > MAX_RESYNCS) {
      dropJoiner(run, from);
      ctl.mesh.sendJson(from, TYPES.REFUSE, { runId: 0, reason: `its state hashed wrong ${j.resyncs} times after syncing` }).catch(() => {});
      return;
    }
    h.note(`${h.nameOf(from)} reported ${short(d.hash)} after step ${d.step}, the group has ${short(ours)}: refused, re-syncing it.`);
    j.stage = 'snapshot'; j.verified = null; j.admitted = null;
    return;
  }
  if (j.verified === null || d.step > j.verified) { j.verified = d.step; j.ackedAt = performance.now(); }
}

// before this device's gradient of step s leaves: propose joiners current within one step for a
// roster from step s + 2 (sent, and awaited, first: every member has it before it can finish s).
// Local steps (s an exchange step): joiners that confirmed a round start within the last four
// rounds (what they lack is one outer step a round, no compute: they catch up before their first
// exchange), from the round start after the next (docs/VERIFICATION.md "Local steps": a joiner
// enters at a round's start)
export async function admitJoiners(ctl, run, s) {
  const local = run.cfg.local_steps > 1;
  const from = local ? roundEnd(run.cfg, s + 1) : s + 2;
  if (run.recovery || run.change || run.stopAfter !== null || s + 3 >= run.cfg.steps || from >= run.cfg.steps) return;
  const current = local ? run.undo.step - 4 * run.cfg.local_steps : s - 1;
  const ready = [...run.joiners].filter(([id, j]) => j.stage === 'syncing' && j.verified !== null && j.verified >= current && ctl.mesh.isReady(id))
    .map(([id]) => id).slice(0, 64 - run.roster.length);
  if (!ready.length) return;
  const roster = run.roster.concat(ready);
  const msg = { runId: run.desc.runId, epoch: run.epoch + 1, base: run.epoch, from, roster, joined: ready, left: [],
                history: local ? scheduleLocal(run.history, from, run.roster.length, [], ready.length) : scheduleWith(run.history, from, roster.length), reason: 'joined' };
  const change = new RosterChange(msg, rosterDigest(msg), 'join',
    ctl.newCollective(run.desc.runId, msg.epoch, roster, from, run.cfg, run.collective.deadlineMs));
  change.accepts.add(ctl.selfId);
  run.change = change;
  for (const id of ready) run.joiners.get(id).admitted = from;
  await Promise.all(roster.filter((id) => id !== ctl.selfId).map((id) => ctl.mesh.sendJson(id, TYPES.ROSTER, msg, { runId: run.desc.runId, slot: run.slot }).catch(() => {})));
}

// ---- the joiner ---------------------------------------------------------------------------------
export function maybeJoin(ctl) {
  const h = ctl.host;
  if (ctl.phase !== 'idle' || !ctl.selfId || h.canRun()) {
    ctl.joinWantSince = 0; clearTimeout(ctl.linkWaitTimer);       // not idle: a later wait starts afresh
    return;
  }
  if (ctl.faults.noJoin || performance.now() < ctl.joinBackoffUntil) return;
  const others = h.members().filter((q) => q.id !== ctl.selfId && /^training/.test(q.state || ''));
  const training = others.filter((q) => ctl.mesh.isReady(q.id)).map((q) => q.id);
  if (!training.length) { ctl.joinWantSince = 0; return; }
  // wait for links to the whole group first: the leader's SYNC names the roster, and a joiner not
  // linked to all of it must drop the state it is sent and ask again (a wasted transfer). Bounded:
  // a peer that never links delays each attempt by linkWaitMs at most, then the SYNC decides
  const now = performance.now();
  ctl.joinWantSince ||= now;
  if (training.length < others.length && now - ctl.joinWantSince < ctl.t.linkWaitMs) {
    clearTimeout(ctl.linkWaitTimer);
    ctl.linkWaitTimer = setTimeout(() => maybeJoin(ctl), ctl.joinWantSince + ctl.t.linkWaitMs - now + 10);
    return;
  }
  ctl.joinWantSince = 0;
  askToJoin(ctl, training);
}

async function askToJoin(ctl, ids) {
  const jn = new JoinAttempt(ids);
  ctl.enter('joining', jn);
  // a FWD may come before the SYNC it follows (links deliver in order, the in-memory test transport
  // does not): admitted at the size onSync admits before its checks, kept for the SYNC
  ctl.mesh.setLimit(TYPES.FWD, () => Math.floor(MAX_STATE_BYTES / 3));
  let dataId;
  try {
    dataId = await ctl.host.dataId();
  } catch (err) { abandonJoin(ctl, err.message, ctl.t.refusedWaitMs); return; }
  if (ctl.at !== jn) return;
  for (const id of ids) ctl.mesh.sendJson(id, TYPES.JOIN, { protocol: ctl.mesh.version, dataId }).catch(() => {});
  // quiet until the leader answers: a run that was just ending everywhere never answers
  armJoinTimer(ctl, jn, 'no answer from the running group');
}

function armJoinTimer(ctl, jn, why) {
  clearTimeout(jn.timer);
  jn.timer = setTimeout(() => { if (ctl.at === jn) abandonJoin(ctl, `${why} within ${ctl.t.joinWaitMs / 1000} s; asking again`, 500); }, ctl.t.joinWaitMs);
}

// give up this attempt; maybeJoin tries again after `backoffMs`
export function abandonJoin(ctl, why, backoffMs) {
  const jn = ctl.at;
  if (ctl.phase !== 'joining') return;
  clearTimeout(jn.timer);
  if (jn.change) ctl.dispose(jn.change.collective);
  jn.batches?.close?.();
  // the leader that answered stops forwarding now (each FWD it sent on would be a bad frame here)
  if (jn.from) ctl.mesh.sendJson(jn.from, TYPES.LEAVE, { runId: 0, reason: `gave up its sync: ${why}`.slice(0, 200) }).catch(() => {});
  ctl.enter('idle', null);
  ctl.mesh.setLimit(TYPES.STATE, ctl.idleStateLimit); ctl.mesh.setLimit(TYPES.FWD, null);
  ctl.joinBackoffUntil = performance.now() + backoffMs;
  if (jn.desc || jn.refused) {                  // the leader had answered: say what happened
    ctl.host.note(`Joining the group's run: ${why}.`);
    ctl.host.show({ runState: 'idle', sync: null });
  }
  if (backoffMs < 60_000) {
    const retry = setTimeout(() => maybeJoin(ctl), backoffMs + 10);
    retry?.unref?.();              // Node: a pending retry never keeps a process alive (as the mesh's SYSTEM_CLOCK)
  }
}

// REFUSE {runId: 0} from a peer this device asked
export function onJoinRefused(ctl, from, m) {
  const jn = ctl.at;
  if (m.json.runId !== 0 || !jn.asked.includes(from)) { ctl.mesh.drop(from, m, 'REFUSE for no request of ours'); return; }
  jn.refused = true;
  abandonJoin(ctl, `${ctl.host.nameOf(from)} declined: ${String(m.json.reason || 'no reason').slice(0, 200)}`, ctl.t.refusedWaitMs);
}

// the leader's answer
export async function onSync(ctl, from, m) {
  const jn = ctl.at, d = m.json, h = ctl.host;
  if (!jn.asked.includes(from)) { ctl.mesh.drop(from, m, 'SYNC without a JOIN'); return; }
  if (jn.from && jn.from !== from) { ctl.mesh.drop(from, m, 'SYNC from a second leader'); return; }
  // the STATE's first chunks may arrive while this handler awaits below: admit the run's STATE
  // and FWD now at the largest allowed sizes, then at the run's exact sizes once SYNC checks out
  const runId = d.runId, most = MAX_STATE_BYTES;
  ctl.mesh.setLimit(TYPES.STATE, (hd) => (hd.runId === runId ? most : 'STATE for another run'));
  ctl.mesh.setLimit(TYPES.FWD, (hd) => (hd.runId === runId ? Math.floor(most / 3) : 'FWD for another run'));
  let cfg;
  try {
    const desc = d.desc;
    if (!desc || typeof desc !== 'object' || desc.runId !== d.runId || !isRunId(d.runId)) throw new Error('bad run id');
    if (desc.protocol !== ctl.mesh.version) throw new Error(`protocol v${desc.protocol}`);
    cfg = makeConfig(desc.config);
    if (desc.dataId !== await h.dataId()) throw new Error('different training data');
    if (!Array.isArray(d.roster) || d.roster[0] !== from || d.roster.includes(ctl.selfId) || d.roster.length > 64) throw new Error('bad roster');
    if (!Number.isInteger(d.step) || d.step < 0 || d.step >= cfg.steps || !isHash(d.hash) || !Number.isInteger(d.epoch) || d.epoch < 0) throw new Error('bad position');
    if (!validHistory(d.history) || !isHash(desc.initHash) || typeof desc.dataId !== 'string' || !validAuditRate(desc.auditRate)) throw new Error('bad descriptor');
  } catch (err) {
    ctl.mesh.drop(from, m, `SYNC refused: ${err.message}`);
    abandonJoin(ctl, `the leader's SYNC was refused (${err.message})`, ctl.t.refusedWaitMs);
    return;
  }
  if (ctl.at !== jn) return;
  const unlinked = d.roster.filter((id) => !ctl.mesh.isReady(id));
  if (unlinked.length) { abandonJoin(ctl, `not linked to ${unlinked.map((id) => h.nameOf(id)).join(', ')} yet`, 2000); return; }
  if (jn.change) { ctl.dispose(jn.change.collective); jn.change = null; }
  jn.from = from; jn.desc = d.desc; jn.cfg = cfg; jn.roster = d.roster; jn.epoch = d.epoch; jn.history = d.history;
  jn.snap = d.step; jn.hash = d.hash; jn.replica = null; jn.trainer = null; jn.completed = null; jn.fwd = new Map(); jn.draining = null;
  ctl.mesh.setLimit(TYPES.STATE, (hd) => (hd.runId === d.runId ? stateLimit(cfg) : 'STATE for another run'));
  ctl.mesh.setLimit(TYPES.FWD, (hd) => (hd.runId === d.runId ? gradientBytes(cfg) : 'FWD for another run'));
  armJoinTimer(ctl, jn, 'the state transfer stalled');
  h.show({ runState: 'syncing', sync: { pct: 0, step: d.step }, message: `syncing (0 %): the state at step ${d.step} from ${h.nameOf(from)}…` });
  const early = jn.early, earlyFwd = jn.earlyFwd;
  jn.early = null; jn.earlyFwd = [];
  if (early && early.from === from && early.m.step === d.step) onJoinState(ctl, from, early.m);
  for (const f of earlyFwd) if (f.from === from && ctl.at === jn) onFwd(ctl, from, f.m);
}

export function onProgress(ctl, e) {
  const jn = ctl.at;
  if (e.peer !== jn.from || e.type !== TYPES.STATE || jn.replica) return;
  armJoinTimer(ctl, jn, 'the state transfer stalled');
  const pct = Math.floor((100 * e.bytes) / e.length);
  ctl.host.show({ sync: { pct, step: jn.snap }, message: `syncing (${pct} %): the state at step ${jn.snap} from ${ctl.host.nameOf(jn.from)}…` });
}

// a state that failed its digest in transit: ask again now rather than wait for the timer
export function onDropped(ctl, e) {
  const jn = ctl.at;
  if (e.peer === jn.from && e.type === TYPES.STATE && !jn.replica) abandonJoin(ctl, `the state transfer failed (${e.reason})`, 200);
}

export function onJoinState(ctl, from, m) {
  const jn = ctl.at;
  // a STATE before its SYNC, from a peer this device asked: kept for the SYNC (one, the first)
  if (!jn.desc && !jn.from && jn.asked.includes(from)) { if (!jn.early) jn.early = { from, m }; return; }
  if (from !== jn.from || !jn.desc || m.runId !== jn.desc.runId || m.step !== jn.snap || jn.replica) { ctl.mesh.drop(from, m, 'STATE for no sync of ours'); return; }
  try {
    jn.replica = readPeerState(m.payload, { config: configToDict(jn.cfg), step: jn.snap, hash: jn.hash }).replica;
  } catch (err) {
    abandonJoin(ctl, `the state was refused: ${err.message}`, 500);
    return;
  }
  if (jn.cfg.local_steps > 1) {               // local steps: the anchor, and a fresh Adam state (docs/VERIFICATION.md "Local steps")
    jn.replica.anchor = cloneParams(jn.replica.params);
    jn.replica = localJoiner(jn.replica);
  }
  if (ctl.faults.corruptNextSync) {           // test hook: a joiner whose state goes wrong after its checks
    ctl.faults.corruptNextSync = false;
    const w = jn.replica.params['wte.weight'];
    new BigUint64Array(w.buffer, w.byteOffset, 1)[0] ^= 1n;
  }
  jn.batches = ctl.host.batches(jn.cfg, jn.desc.dataId);
  jn.trainer = ctl.host.trainer(jn.cfg, jn.replica, jn.batches);
  jn.completed = jn.snap;
  // from now on the leader's silence is the stall: each forwarded step re-arms the wait
  armJoinTimer(ctl, jn, 'the leader went silent while this device caught up');
  ctl.host.show({ sync: { pct: 100, step: jn.snap }, message: `Synced the state at step ${jn.snap}; catching up with the group…` });
  drainFwd(ctl, jn);
}

export function onFwd(ctl, from, m) {
  const jn = ctl.at;
  // a FWD before its SYNC, from a peer this device asked: kept for the SYNC (at most MAX_FWD_HELD
  // of them and one state body's bytes together: bounded whatever a liar sends)
  if (!jn.desc && !jn.from && jn.asked.includes(from)) {
    const held = jn.earlyFwd.reduce((n, f) => n + f.m.payload.length, 0);
    if (jn.earlyFwd.length < MAX_FWD_HELD && held + m.payload.length <= MAX_STATE_BYTES) jn.earlyFwd.push({ from, m });
    return;
  }
  if (from !== jn.from || !jn.desc || m.runId !== jn.desc.runId || m.step < jn.snap) { ctl.mesh.drop(from, m, 'FWD for no sync of ours'); return; }
  // the state (which comes before the first FWD) is this late, or this device cannot keep up: the
  // attempt cannot finish (a step past the buffer would be missing). Ask again now, rather than
  // drop each later FWD until the stall timer (each a bad frame: a fast group's would cut the link)
  if (jn.fwd.size >= MAX_FWD_HELD) { abandonJoin(ctl, `${MAX_FWD_HELD} forwarded steps arrived before this device could apply them`, 200); return; }
  const u8 = m.payload;
  jn.fwd.set(m.step, u8.byteOffset % 8 === 0 ? new Float64Array(u8.buffer, u8.byteOffset, u8.length / 8) : new Float64Array(u8.slice().buffer));
  drainFwd(ctl, jn);
}

// the forwarded step this joiner applies next: its next step, or with local steps its round's exchange
const nextFwd = (jn) => (jn.cfg.local_steps > 1 ? roundEnd(jn.cfg, jn.completed) - 1 : jn.completed);

// apply the forwarded gradients in step order (Adam only: no forward or backward pass; local
// steps: the outer step with each exchange's D, from round start to round start)
function drainFwd(ctl, jn) {
  if (jn.draining || !jn.trainer) return;
  jn.draining = (async () => {
    const shapes = paramShapes(jn.cfg);
    while (ctl.at === jn && jn.fwd.has(nextFwd(jn)) && !(jn.change && jn.completed >= jn.change.msg.from)) {
      const at = nextFwd(jn);
      const G = jn.fwd.get(at);
      jn.fwd.delete(at);
      const applied = await (jn.cfg.local_steps > 1 ? jn.trainer.outer(unflatten(G, shapes)) : jn.trainer.apply(unflatten(G, shapes)));
      if (ctl.at !== jn) return;
      jn.completed = at + 1;
      jn.hashNow = applied.hash;
      armJoinTimer(ctl, jn, 'the leader went silent while this device caught up');
      ctl.mesh.sendJson(jn.from, TYPES.SYNCED, { runId: jn.desc.runId, step: jn.completed, hash: applied.hash }).catch(() => {});
      ctl.host.show({ step: jn.completed, hash: applied.hash, message: `Synced; caught up to step ${jn.completed}…` });
    }
  })().finally(() => {
    jn.draining = null;
    if (ctl.at !== jn) return;
    if (jn.fwd.has(nextFwd(jn)) && !(jn.change && jn.completed >= jn.change.msg.from)) drainFwd(ctl, jn);
    else maybeEnter(ctl, jn);
  });
}

// the leader's proposal naming this device: accepted when it holds together
export function onJoinRoster(ctl, from, m) {
  const jn = ctl.at, d = m.json;
  if (!jn.desc || from !== jn.from || d.runId !== jn.desc.runId) { ctl.mesh.drop(from, m, 'ROSTER from outside the run'); return; }
  if (!Array.isArray(d.roster) || !d.roster.includes(ctl.selfId)) { ctl.mesh.drop(from, m, 'a roster change that does not name this device'); return; }
  const why = checkRoster(d, { roster: d.roster.filter((id) => id !== ctl.selfId), epoch: Math.min(jn.epoch, d.epoch - 1), completed: d.from - 1, selfId: ctl.selfId, keptOut: ctl.keptOut, round: jn.cfg.local_steps }, from);
  if (why || !validHistory(d.history, d.from, d.roster.length) || !Number.isInteger(d.base) || d.base < jn.epoch || d.from < jn.snap) {
    ctl.mesh.drop(from, m, `ROSTER refused: ${why || 'bad schedule'}`);
    ctl.mesh.sendJson(from, TYPES.REFUSE, { runId: jn.desc.runId, epoch: d.epoch, reason: why || 'bad schedule' }, { runId: jn.desc.runId }).catch(() => {});
    return;
  }
  if (jn.change) ctl.dispose(jn.change.collective);
  jn.change = new RosterChange(d, rosterDigest(d), 'join', ctl.newCollective(jn.desc.runId, d.epoch, d.roster, d.from, jn.cfg));
  armJoinTimer(ctl, jn, 'no GO for the roster naming this device');
  ctl.mesh.sendJson(from, TYPES.ACCEPT, { runId: jn.desc.runId, epoch: d.epoch, digest: jn.change.digest }, { runId: jn.desc.runId }).catch(() => {});
}

export function onJoinCommit(ctl, from, m) {
  const jn = ctl.at, d = m.json;
  if (!jn.change || from !== jn.from || d.epoch !== jn.change.msg.epoch || d.digest !== jn.change.digest) { ctl.mesh.drop(from, m, 'GO for no roster this device accepted'); return; }
  jn.change.committed = true;
  maybeEnter(ctl, jn);
}

// once the roster naming this device is committed and this device caught up to its first step
function maybeEnter(ctl, jn) {
  if (ctl.at !== jn || !jn.change || !jn.change.committed || jn.completed !== jn.change.msg.from || jn.draining) return;
  clearTimeout(jn.timer);
  ctl.mesh.setLimit(TYPES.STATE, ctl.idleStateLimit); ctl.mesh.setLimit(TYPES.FWD, null);
  const d = jn.change.msg;
  if (jn.cfg.local_steps > 1) jn.replica.t0 = d.from;      // its fresh Adam state starts at its first round
  ctl.begin(jn.desc, jn.replica, jn.cfg, { collective: jn.change.collective, roster: d.roster, epoch: d.epoch, history: d.history,
    completed: d.from, hash: jn.hashNow || jn.hash, trainer: jn.trainer, batches: jn.batches, joined: true });
}
