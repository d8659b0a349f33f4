// Starting a run (docs/ARCHITECTURE.md "A group run"):
//
//   leader                                   each other member
//   RUN {runId, config, dataId, roster,  ──►  checks it (idle, same data, in the roster), builds
//        startStep, initHash}                 the start weights, compares their hash
//   [STATE: the weights + Adam, resuming] ──►
//                                        ◄──  ACCEPT {runId, initHash} | REFUSE {runId, reason}
//   GO {runId} (every member accepted)   ──►  step startStep begins everywhere
//
// Two Start presses at once: the proposal with the smaller runId wins everywhere.
import { TYPES } from '../mesh/frames.js';
import { encodeState, stateLimit, MAX_STATE_BYTES } from '../state_codec.js';
import { Replica, cloneParams, cloneReplica } from '../train.js';
import { makeConfig, configToDict } from '../config.js';
import { initParams, paramShapes } from '../model.js';
import { adamInit } from '../optim.js';
import { weightHash } from '../hashing.js';
import { waitUntil } from '../page_clock.js';
import { Proposal, Acceptance, newRunId, short, isHash } from './record.js';
import { readPeerState } from '../peer_state.js';
import { validAuditRate } from './audits.js';
import { keptOutOf } from '../mesh/roster.js';
import { defaultAuditRate } from '../audit.js';


export function freshReplica(cfg) {
  const params = initParams(cfg);
  return new Replica(cloneParams(params), adamInit(params));
}

// ---- leader -----------------------------------------------------------------------------------
export async function start(ctl, config) {
  const h = ctl.host;
  const why = h.canRun();
  if (why) throw new Error(why);
  if (ctl.phase === 'running') throw new Error('a run is already going: stop it first');
  if (ctl.phase === 'proposing' || ctl.phase === 'accepted') throw new Error('a run is being set up in this group: wait a moment');
  if (ctl.phase === 'joining') throw new Error('this device is being synced into the group\'s run');
  if (ctl.phase === 'ending') throw new Error('the last run is ending: this device checks the steps it keeps (a moment)');
  const other = h.members().find((q) => q.id !== ctl.selfId && /^training/.test(q.state || ''));
  if (other) throw new Error(`a run is already going in this group (${other.name} is training): one run per group; this device joins it once linked`);
  // resume: true continues the model this tab holds (a loaded checkpoint or a stopped run) from
  // its step with its config; false starts a new run from step 0; absent: a loaded checkpoint
  // short of its last step is continued
  // auditRate: given, else the default (local steps: each slot's rounds are audited, docs/VERIFICATION.md §13 "Rounds of local steps")
  const { resume: want, auditRate: givenRate, ...settings } = config || {};
  if (want !== undefined && typeof want !== 'boolean') throw new Error(`resume must be true or false, got ${JSON.stringify(want)}`);
  if (givenRate !== undefined && !validAuditRate(givenRate)) throw new Error(`auditRate must be a chance from 0 to 1 (each slot's contribution audited with it at each step), got ${JSON.stringify(givenRate)}`);
  const m = h.models;
  const point = m.resumePoint();
  if (want === true && !point) {
    throw new Error(!m.model ? 'nothing to continue: this tab holds no model (train or load one)'
      : `nothing to continue: the model is at the last step of its run (${m.step} of ${m.model.cfg.steps}); start a new run`);
  }
  await h.ready();
  const dataId = await h.dataId();
  const resume = point && (want === true || (want === undefined && m.resumable)) ? m.model : null;
  const cfg = resume ? resume.cfg : makeConfig(settings);
  const auditRate = givenRate ?? defaultAuditRate(cfg.local_steps);
  await h.prepare(cfg);                               // a measured GPU route timed at these settings (backends.js)
  // members: every admitted peer of the group whose link is up (waiting for links still opening)
  const keptOut = h.members().filter((q) => ctl.keptOut.has(q.id));
  if (keptOut.length) h.note(`Starting without ${keptOut.map((q) => q.name || q.id).join(', ')}: kept out on this device.`);
  const candidates = h.members().filter((q) => q.id !== ctl.selfId && q.role !== 'pending' && !ctl.keptOut.has(q.id));
  await waitUntil(() => candidates.every((q) => ctl.mesh.isReady(q.id)), ctl.t.linkWaitMs, (wake) => ctl.mesh.on('link', wake));
  const ready = candidates.filter((q) => ctl.mesh.isReady(q.id));
  const left = candidates.filter((q) => !ctl.mesh.isReady(q.id));
  // slot order: the leader, then the others by time of joining the group, then id
  ready.sort((a, b) => (a.joinedAt - b.joinedAt) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const roster = [ctl.selfId, ...ready.map((q) => q.id)];
  const replica = resume ? cloneReplica(resume.replicas[0]) : freshReplica(cfg);
  const startStep = resume ? m.step : 0;
  const desc = { runId: newRunId(), protocol: ctl.mesh.version, leader: ctl.selfId, config: configToDict(cfg),
                 dataId, roster, startStep, initHash: weightHash(replica.params), auditRate,
                 extra: resume ? (m.extra || null) : null };
  if (left.length) h.note(`Left out of this run (no peer-to-peer link yet): ${left.map((q) => q.name).join(', ')}.`);
  const collective = ctl.newCollective(desc.runId, 0, roster, startStep, cfg);
  try {
    if (roster.length > 1) await propose(ctl, desc, replica, cfg);
  } catch (err) { ctl.dispose(collective); throw err; }
  ctl.begin(desc, replica, cfg, { resumed: Boolean(resume), collective });
  return { config: { ...cfg }, roster: roster.slice(), runId: desc.runId };
}

// RUN (+ STATE) to every member; resolves when all accepted, rejects with the reason otherwise
async function propose(ctl, desc, replica, cfg) {
  const members = desc.roster.slice(1);
  const prop = new Proposal(desc);
  ctl.enter('proposing', prop);
  ctl.host.show({ runState: 'starting', message: `Starting a run with ${members.length} other device(s)…`, error: '' });
  const done = new Promise((resolve, reject) => { prop.resolve = resolve; prop.reject = reject; });
  const timer = setTimeout(() => prop.reject(new Error(`no answer from ${members.filter((id) => !prop.answers.has(id)).map((id) => ctl.host.nameOf(id)).join(', ')} within ${ctl.t.acceptWaitMs / 1000} s`)), ctl.t.acceptWaitMs);
  try {
    const body = desc.startStep > 0 ? new Uint8Array(encodeState(paramShapes(cfg), {
      config: desc.config, step: desc.startStep, adamT: replica.adam.t, params: replica.params,
      m: replica.adam.m, v: replica.adam.v, weightHash: desc.initHash, extra: desc.extra })) : null;
    await Promise.all(members.map(async (id) => {
      await ctl.mesh.sendJson(id, TYPES.RUN, desc, { runId: desc.runId });
      if (body) await ctl.mesh.send(id, { type: TYPES.STATE, runId: desc.runId, payload: body });
    }));
    await done;
    if (ctl.at !== prop) throw new Error('the run was cancelled');
    await Promise.all(members.map((id) => ctl.mesh.sendJson(id, TYPES.GO, { runId: desc.runId }, { runId: desc.runId })));
  } catch (err) {
    for (const id of members) ctl.mesh.sendJson(id, TYPES.STOP, { runId: desc.runId, stopAfter: desc.startStep, reason: `the run did not start: ${err.message}` }, { runId: desc.runId }).catch(() => {});
    if (ctl.at === prop) ctl.enter('idle', null);
    if (ctl.phase === 'idle') ctl.host.show({ runState: 'idle' });
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

// ACCEPT / REFUSE of our RUN
export function onAnswer(ctl, from, m, yes) {
  const prop = ctl.at;
  if (m.json.runId !== prop.desc.runId || !prop.desc.roster.includes(from)) { ctl.mesh.drop(from, m, 'an answer to no proposal of ours'); return; }
  if (!yes) { prop.reject(new Error(`${ctl.host.nameOf(from)} refused: ${String(m.json.reason || 'no reason').slice(0, 200)}`)); return; }
  if (m.json.initHash !== prop.desc.initHash) {
    prop.reject(new Error(`${ctl.host.nameOf(from)} built different start weights (${short(m.json.initHash)} vs ${short(prop.desc.initHash)})`));
    return;
  }
  prop.answers.add(from);
  if (prop.desc.roster.slice(1).every((id) => prop.answers.has(id))) prop.resolve();
}

// ---- member -----------------------------------------------------------------------------------
function refuse(ctl, to, runId, reason) {
  ctl.mesh.sendJson(to, TYPES.REFUSE, { runId, reason }, { runId }).catch(() => {});
}

// idle: a STATE before its RUN (a link that reorders): kept, the latest one, for onRun
export function onEarlyState(ctl, from, m) {
  ctl.earlyState = { from, m };
}

export async function onRun(ctl, from, m) {
  const d = m.json;
  const runId = d.runId;
  if (!Number.isInteger(runId) || runId <= 0 || runId > 0xffffffff || m.runId !== runId) { ctl.mesh.drop(from, m, 'RUN without a valid run id'); return; }
  const name = ctl.host.nameOf(ctl.selfId);
  // one run per group: a running peer refuses; two proposals at once: the smaller runId wins
  if (ctl.phase === 'running') { refuse(ctl, from, runId, `${name} is training in another run`); return; }
  if (ctl.phase === 'joining') { refuse(ctl, from, runId, `${name} is being synced into another run`); return; }
  if (ctl.phase === 'proposing') {
    if (runId < ctl.at.desc.runId) ctl.at.reject(new Error(`${ctl.host.nameOf(from)} started a run at the same moment; joining it instead`));
    else { refuse(ctl, from, runId, 'a competing run was proposed at the same moment'); return; }
  }
  if (ctl.phase === 'accepted') {
    if (runId < ctl.at.desc.runId) {
      refuse(ctl, ctl.at.from, ctl.at.desc.runId, 'a competing run was proposed at the same moment');
      dropAccepted(ctl);
    } else { refuse(ctl, from, runId, 'this device already accepted another run'); return; }
  }
  // this device considers the run from now on (a STATE may follow at once: it is kept, at the
  // largest allowed size, until the RUN checked out)
  const acc = new Acceptance(d, from);
  const early = ctl.earlyState;
  ctl.enter('accepted', acc);
  if (early && early.from === from && early.m.runId === runId) acc.early = early.m;   // its STATE came first
  ctl.mesh.setLimit(TYPES.STATE, (hd) => (hd.runId === runId ? MAX_STATE_BYTES : 'STATE for another run'));
  let cfg = null;
  try {
    if (d.protocol !== ctl.mesh.version) throw new Error(`protocol v${d.protocol}, this page v${ctl.mesh.version}`);
    if (d.leader !== from || !Array.isArray(d.roster) || d.roster[0] !== from) throw new Error('the leader must be the sender and slot 0');
    if (d.roster.length > 64 || new Set(d.roster).size !== d.roster.length || !d.roster.every((x) => typeof x === 'string')) throw new Error('bad roster');
    if (!d.roster.includes(ctl.selfId)) throw new Error('this device is not in the roster');
    const out = keptOutOf(d.roster, ctl.keptOut, ctl.host.nameOf);
    if (out) throw new Error(out);
    cfg = makeConfig(d.config);
    if (!Number.isInteger(d.startStep) || d.startStep < 0 || d.startStep >= cfg.steps) throw new Error(`bad start step ${d.startStep}`);
    if (!isHash(d.initHash)) throw new Error('bad start hash');
    if (!validAuditRate(d.auditRate)) throw new Error(`bad audit rate ${JSON.stringify(d.auditRate)}`);
    const mine = await ctl.host.dataId();
    if (d.dataId !== mine) throw new Error(`different training data: the leader's is ${String(d.dataId).slice(0, 120)}, this device's ${mine}`);
    await ctl.host.prepare(cfg);                      // before ACCEPT: the leader waits for it (acceptWaitMs)
  } catch (err) {
    if (ctl.at !== acc) return;                       // superseded meanwhile
    refuse(ctl, from, runId, err.message);
    dropAccepted(ctl);
    ctl.host.note(`Declined a run from ${ctl.host.nameOf(from)}: ${err.message}`);
    return;
  }
  if (ctl.at !== acc) return;                         // superseded meanwhile (a competing RUN, a STOP)
  acc.cfg = cfg;
  acc.collective = ctl.newCollective(d.runId, 0, d.roster, d.startStep, cfg);
  acc.timer = setTimeout(() => {
    if (ctl.at !== acc) return;
    dropAccepted(ctl);
    ctl.host.note(`The run from ${ctl.host.nameOf(from)} never started (no GO within ${ctl.t.goWaitMs / 1000} s).`);
  }, ctl.t.goWaitMs);
  const limit = stateLimit(cfg);
  ctl.mesh.setLimit(TYPES.STATE, (hd) => (hd.runId === runId ? limit : 'STATE for another run'));
  ctl.host.show({ runState: 'joining', message: `Joining the run started by ${ctl.host.nameOf(from)}…` });
  if (d.startStep === 0) {
    acc.replica = freshReplica(cfg);
    answerRun(ctl, acc);
  } else if (acc.early) {                             // else: ACCEPT once its STATE arrived and checked out
    const early = acc.early;
    acc.early = null;
    onStartState(ctl, from, early);
  }
}

export function onStartState(ctl, from, m) {
  const acc = ctl.at;
  if (acc.from !== from || m.runId !== acc.desc.runId || acc.replica || acc.early) { ctl.mesh.drop(from, m, 'STATE for no accepted run'); return; }
  if (!acc.cfg) { acc.early = m; return; }           // the RUN is still being checked
  ctl.mesh.setLimit(TYPES.STATE, ctl.idleStateLimit);
  try {
    acc.replica = readPeerState(m.payload, { config: acc.desc.config, step: acc.desc.startStep }).replica;
  } catch (err) {
    refuse(ctl, from, acc.desc.runId, `its state was refused: ${err.message}`);
    dropAccepted(ctl);
    return;
  }
  answerRun(ctl, acc);
}

function answerRun(ctl, acc) {
  const hash = weightHash(acc.replica.params);
  if (hash !== acc.desc.initHash) {
    refuse(ctl, acc.from, acc.desc.runId, `start weights hash to ${short(hash)}, the leader's to ${short(acc.desc.initHash)}`);
    dropAccepted(ctl);
    return;
  }
  ctl.mesh.sendJson(acc.from, TYPES.ACCEPT, { runId: acc.desc.runId, initHash: hash }, { runId: acc.desc.runId }).catch(() => {});
}

// this device's user keeps a member of the accepted run out (controller.keepOut): declined
export function refuseAccepted(ctl, why) {
  const acc = ctl.at;
  refuse(ctl, acc.from, acc.desc.runId, why);
  dropAccepted(ctl);
  ctl.host.note(`Declined the run from ${ctl.host.nameOf(acc.from)}: ${why}`);
}

export function dropAccepted(ctl) {
  const acc = ctl.at;
  if (ctl.phase !== 'accepted') return;
  clearTimeout(acc.timer);
  ctl.enter('idle', null);
  ctl.dispose(acc.collective);
  ctl.mesh.setLimit(TYPES.STATE, ctl.idleStateLimit);
  ctl.host.show({ runState: 'idle' });
}

export function onStartGo(ctl, from, m) {
  const acc = ctl.at;
  if (acc.from !== from || m.json.runId !== acc.desc.runId || !acc.replica) { ctl.mesh.drop(from, m, 'GO for no accepted run'); return; }
  clearTimeout(acc.timer);
  ctl.begin(acc.desc, acc.replica, acc.cfg, { resumed: acc.desc.startStep > 0, collective: acc.collective });
}

// STOP before GO: the leader gave up
export function onStartStop(ctl, from, m) {
  const acc = ctl.at;
  if (acc.from !== from || m.json.runId !== acc.desc.runId) { ctl.mesh.drop(from, m, 'STOP for no run of ours'); return; }
  dropAccepted(ctl);
  ctl.host.note(`The run from ${ctl.host.nameOf(from)} did not start: ${String(m.json.reason || '').slice(0, 400)}`);
}
