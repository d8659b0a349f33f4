// The group run controller (docs/ARCHITECTURE.md "The run controller"): one run per group,
// started by any device and trained in lockstep by every peer of its roster over the mesh. One
// explicit phase, one handler per frame type and phase, the protocols in their own modules:
//
//   idle ──start()──► proposing ──all ACCEPT, GO──► running ──end──► idle
//   idle ──RUN──────► accepted ──GO─────────────────► running
//   idle ──maybeJoin─► joining ──SYNC, STATE, FWD, ROSTER, GO──► running
//
//   start.js     RUN / ACCEPT / REFUSE / STATE / GO: starting a run
//   loop.js      the step loop, the sync guard, FIN, STOP
//   recovery.js  evidence, HALT / STATUS / ROSTER / ACCEPT / GO: departures, failover, the
//                two-phase roster change, the split alarm
//   join.js      JOIN / SYNC / STATE / FWD / SYNCED: joining mid-run, bounded per joiner
//   audits.js    AUDIT / EVIDENCE / TRANSCRIPT_ASK / TRANSCRIPT / ROUND_STATE_ASK / ROUND_STATE:
//                commitments, the audits two steps (exchanges) back, an owner's transcript of its
//                shard, a round's start state (local steps), conviction and rollback
//   ending.js    how a run ends or steps back (shared by the modules above): end, the alarm, one
//                step of undo, waking the parked loop, the panel's view of the run
//   record.js    the records (every field declared once), timings, the fault plan
//   ../peer_state.js   readPeerState: the one check of a peer's state body (start, join)
//
// The host (peer.js in the page, tests/js/run_harness.mjs in Node) is all the controller sees
// of the world:
//   host.selfId                this device's peer id
//   host.mesh                  the Mesh (links, send, frames)
//   host.members()             the group's members as the server lists them: [{id, name, role, state, joinedAt}]
//   host.canRun()              null, or why this device may not start or join a run (pending, rejected)
//   host.nameOf(id)            a peer's name for the panel
//   host.show(patch)           panel state; host.note(text) a line worth telling; host.emit(event, payload)
//   host.announce()            tell the server this device's run state
//   host.ready(), host.backend(), host.gpu    the compute path, the step backend
//   host.prepare(cfg)          the compute path timed at a run's settings before its first step (backends.js prepare)
//   host.trainer(cfg, replica, batches)                       this device's trainer of a run (train.js Trainer's interface)
//   host.dataId(), host.batches(cfg, dataId)                  the run's data
//   host.models                the model store (adopt, runEnded, step, resumePoint, model, extra, resumable)
//   host.stored                the stored run ({afterStep(run), afterRun(run, end)}) or null
// and the host tells the controller: serverSaysGone(id) / serverSaysBack(id) (peer-left and the
// member list), maybeJoin() (the member list or a link changed), goodbye() (the page is closing).
import { HEADER_BYTES, MIN_CHUNK_BYTES, TYPES } from '../mesh/frames.js';
import { MeshCollective, PART_INDEX_BYTES } from '../mesh/mesh_collective.js';
import { Stale } from '../mesh/mesh.js';
import { epochKey } from '../mesh/roster.js';
import { MAX_STATE_BYTES } from '../state_codec.js';
import { paramShapes } from '../model.js';
import { isExchangeStep } from '../train.js';
import { weightHash } from '../hashing.js';
import { TIMING, NO_FAULTS } from './record.js';
import * as startP from './start.js';
import * as loopP from './loop.js';
import * as recoveryP from './recovery.js';
import * as joinP from './join.js';
import * as auditsP from './audits.js';
import { forgeReduced } from '../attack.js';
import { codecFor } from '../exchange_codec.js';

// frame type -> phase -> handler (ctl, from, message). A type with no handler in the current
// phase is dropped with a reason (counted toward the sender's flood limit by the mesh).
const HANDLERS = {
  [TYPES.RUN]: { idle: startP.onRun, proposing: startP.onRun, accepted: startP.onRun, running: startP.onRun, joining: startP.onRun },
  [TYPES.ACCEPT]: { proposing: (ctl, f, m) => startP.onAnswer(ctl, f, m, true), running: (ctl, f, m) => recoveryP.onRosterAnswer(ctl, f, m, true) },
  [TYPES.REFUSE]: { proposing: (ctl, f, m) => startP.onAnswer(ctl, f, m, false), running: (ctl, f, m) => recoveryP.onRosterAnswer(ctl, f, m, false),
                    joining: joinP.onJoinRefused },
  [TYPES.STATE]: { idle: startP.onEarlyState, accepted: startP.onStartState, joining: joinP.onJoinState },
  [TYPES.GO]: { accepted: startP.onStartGo, running: recoveryP.onCommit, joining: joinP.onJoinCommit },
  [TYPES.STOP]: { accepted: startP.onStartStop, running: loopP.onStop },
  [TYPES.FIN]: { running: loopP.onFin },
  [TYPES.ROSTER]: { running: recoveryP.onRoster, joining: joinP.onJoinRoster },
  [TYPES.STATUS]: { running: recoveryP.onStatus },
  [TYPES.HALT]: { running: recoveryP.onHalt },
  [TYPES.LEAVE]: { running: recoveryP.onLeave },
  [TYPES.JOIN]: { running: joinP.onJoin },
  [TYPES.SYNC]: { joining: joinP.onSync },
  [TYPES.FWD]: { joining: joinP.onFwd },
  [TYPES.SYNCED]: { running: joinP.onSynced },
  [TYPES.AUDIT]: { running: auditsP.onAudit },
  [TYPES.EVIDENCE]: { running: auditsP.onEvidence },
  [TYPES.TRANSCRIPT_ASK]: { running: auditsP.onTranscriptAsk, idle: auditsP.onTranscriptAsk, ending: auditsP.onTranscriptAsk },
  [TYPES.TRANSCRIPT]: { running: auditsP.onTranscript },
  [TYPES.ROUND_STATE_ASK]: { running: auditsP.onRoundStateAsk, idle: auditsP.onRoundStateAsk, ending: auditsP.onRoundStateAsk },
  [TYPES.ROUND_STATE]: { running: auditsP.onRoundState },
};
// frames that are simply not for this device in some phases (no drop: they are expected there)
// ('ending': the run's members may still send this device its frames while it checks what it keeps)
const QUIET = new Map([[TYPES.JOIN, new Set(['idle', 'proposing', 'accepted', 'joining', 'ending'])], [TYPES.LEAVE, new Set(['idle', 'proposing', 'accepted', 'joining', 'ending'])],
  [TYPES.AUDIT, new Set(['idle', 'joining', 'ending'])], [TYPES.EVIDENCE, new Set(['idle', 'joining', 'ending'])],
  [TYPES.TRANSCRIPT_ASK, new Set(['joining'])], [TYPES.ROUND_STATE_ASK, new Set(['joining'])], [TYPES.RUN, new Set(['ending'])], [TYPES.STATUS, new Set(['ending'])],
  [TYPES.HALT, new Set(['ending'])], [TYPES.ROSTER, new Set(['ending'])], [TYPES.GO, new Set(['ending'])], [TYPES.SYNCED, new Set(['ending'])]]);
const LATE_OF_ENDED = new Set([TYPES.STOP, TYPES.FIN]);

// What one link may still deliver of a run that ended (bytes on the wire): a peer's messages of the
// step it was exchanging and of the one it may have begun streaming (GRAD or its parts, REDUCED),
// at that run's sizes, each cut into the most frames a sender may (chunks of MIN_CHUNK_BYTES). A
// Stop mid-exchange leaves them on their way (mesh.js Stale).
const wireBytes = (payload) => payload + HEADER_BYTES * Math.max(1, Math.ceil(payload / MIN_CHUNK_BYTES));
export function staleBudget(run) {
  const c = run.collective;
  const parts = c.inParts.reduce((sum, p) => sum + wireBytes(PART_INDEX_BYTES + p.to - p.from), 0);
  return 2 * (Math.max(wireBytes(c.maxPayload(TYPES.GRAD)), parts) + wireBytes(c.maxPayload(TYPES.REDUCED)));
}

export class RunController {
  // host: see above; timing: TIMING overrides (tests); faults: the injected fault plan (tests)
  constructor(host, { timing = {}, faults = {} } = {}) {
    this.host = host;
    this.mesh = host.mesh;
    this.t = { ...TIMING, ...timing };
    this.faults = { ...NO_FAULTS, ...faults };
    this.phase = 'idle';         // 'idle' | 'proposing' | 'accepted' | 'running' | 'joining' | 'ending' (ending.js end)
    this.at = null;              // the phase's record: Proposal | Acceptance | Run | JoinAttempt (the ended Run while 'ending')
    this.lastRun = null;         // the last run that ended (stats, the outage's re-admission)
    this.joinBackoffUntil = 0;
    this.joinWantSince = 0;      // when this idle device first saw a group it could join (0: none)
    this.linkWaitTimer = null;
    this.serverGone = new Set(); // peers the signaling server saw leave (peer-left), until they come back
    this.keptOut = new Map();    // peer id -> why this device never trains with it (its user's word, or the room host's)
    this.collectives = new Map();// frame run id (run id + epoch) -> MeshCollective
    this.holdUntil = 0;          // performance.now() before which a passed exchange deadline waits on (a server outage)
    this.pokes = new Set();      // waiters woken when a roster change or recovery moves on
    this.endedWaiters = new Set();
    this.earlyState = null;      // idle: a STATE that came before its RUN ({from, m}; the latest one only)
    this.lateOfEnded = { run: null, seen: new Set() };   // the last run's late STOP/FIN taken uncounted: 'from:type', one each
    // what a STATE may weigh while no run expects one: one state body, kept for the RUN (or, joining,
    // the SYNC) that may follow (links deliver in order, the in-memory test transport does not)
    this.idleStateLimit = (hd) => (this.phase === 'idle' || this.phase === 'joining' ? MAX_STATE_BYTES : 'STATE while no run expects it');
    this.mesh.setLimit(TYPES.STATE, this.idleStateLimit);
    for (const [type, byPhase] of Object.entries(HANDLERS)) {
      this.mesh.on(Number(type), (from, m) => this.dispatch(Number(type), byPhase, from, m));
    }
    this.mesh.on('link', ({ peer: id, state, reason }) => {
      if (state === 'closed') this.peerGone(id, reason || 'its link closed');
      else this.maybeJoin();
    });
    this.mesh.on('progress', (e) => { if (this.phase === 'joining') joinP.onProgress(this, e); });
    this.mesh.on('drop', (e) => { if (this.phase === 'joining') joinP.onDropped(this, e); });
    // gradient frames go to the collective of their run and epoch (run id + epoch in the header),
    // and are accepted only at its sizes; a frame of this run for an epoch or roster this device
    // never accepted is the split alarm (recovery.js)
    for (const type of [TYPES.GRAD, TYPES.GRAD_PART, TYPES.REDUCED]) {
      this.mesh.on(type, (from, m) => this.routeGradient(from, m));
      this.mesh.setLimit(type, (hd) => this.gradientLimit(type, hd));
    }
    // a transcript only from an owner this device asked, at its exact size (run/audits.js)
    this.mesh.setLimit(TYPES.TRANSCRIPT, (hd) => auditsP.transcriptLimit(this, hd));
    // local steps: a round's start state only from a slot this device asked, at its exact size
    this.mesh.setLimit(TYPES.ROUND_STATE, (hd) => auditsP.roundStateLimit(this, hd));
  }

  get selfId() { return this.host.selfId; }
  get run() { return this.phase === 'running' ? this.at : null; }
  get busy() { return this.phase !== 'idle'; }

  enter(phase, record) {
    this.phase = phase;
    this.at = record;
    if (phase === 'idle') this.mesh.setLimit(TYPES.STATE, this.idleStateLimit);
    else this.earlyState = null;
    this.poke();
  }

  dispatch(type, byPhase, from, m) {
    const run = this.run;
    if (run && (run.roster.includes(from) || run.change?.msg.roster.includes(from))) run.heard.set(from, performance.now());
    const fn = byPhase[this.phase];
    if (fn) {
      const out = fn(this, from, m);
      if (out && typeof out.catch === 'function') out.catch((err) => console.warn('daisy: a run handler failed:', err));
      return;
    }
    if (QUIET.get(type)?.has(this.phase)) return;
    // the run that just ended here: a member's relay of its STOP (each relays it once) or its FIN
    // may still be on its way (a FIN is kept: its sender is owed one state at the end's barrier)
    if (LATE_OF_ENDED.has(type) && this.justEnded(m.runId) && this.firstLate(from, type)) {
      if (type === TYPES.FIN) loopP.onFin(this, from, m, this.lastRun);
      else this.mesh.dropStale();
      return;
    }
    this.mesh.drop(from, m, `not expected while this device is ${this.phase}`);
  }

  // one late STOP and one late FIN per member of the run that just ended go uncounted; a second is a bad frame
  firstLate(from, type) {
    if (this.lateOfEnded.run !== this.lastRun) this.lateOfEnded = { run: this.lastRun, seen: new Set() };
    const key = `${from}:${type}`;
    if (this.lateOfEnded.seen.has(key)) return false;
    this.lateOfEnded.seen.add(key);
    return true;
  }

  routeGradient(from, m) {
    const run = this.run;
    const c = this.collectives.get(m.runId);
    if (run && run.roster.includes(from)) run.heard.set(from, performance.now());
    if (run && recoveryP.checkForeignFrame(this, run, from, m, c)) return;
    if (c) c.onFrame(from, m);
    else if (this.justEnded(m.runId)) this.mesh.dropStale();
    else this.mesh.drop(from, m, `a gradient frame of run ${m.runId}, not a run or epoch of this device`);
  }

  // what a gradient frame may weigh: its epoch's exact sizes; this run's other epochs at the
  // largest (so the split check sees them); the run that just ended: nothing, dropped uncounted up
  // to what a peer may have had on its way at the end (staleBudget); anything else nothing
  gradientLimit(type, hd) {
    const c = this.collectives.get(hd.runId);
    if (c) return c.maxPayload(type);
    const run = this.run;
    if (run && ((hd.runId - run.desc.runId) >>> 0) <= run.epoch + 1000) return 40 + 8 * run.collective.N;
    if (this.justEnded(hd.runId)) {
      return new Stale(`a gradient frame of run ${this.lastRun.desc.runId}, which ended`, this.lastRun.desc.runId, staleBudget(this.lastRun));
    }
    return `a gradient frame of run ${hd.runId}, not a run or epoch of this device`;
  }

  // a frame run id (run id + epoch) of the last run that ended here: its epochs and a change's next
  justEnded(frameRunId) {
    const last = this.lastRun;
    return Boolean(last && this.run !== last && ((frameRunId - last.desc.runId) >>> 0) <= last.epoch + 1);
  }

  // ---- collectives: one per roster epoch, registered before anyone may send it a gradient ----
  newCollective(runId, epoch, roster, startStep, cfg, deadlineMs = this.t.deadlineMs) {
    const key = epochKey(runId, epoch);
    this.collectives.get(key)?.close();
    const collective = new MeshCollective(this.mesh, { runId: key, roster, selfId: this.selfId,
      shapes: paramShapes(cfg), startStep, deadlineMs, subscribe: false, exchange: cfg.exchange, seed: cfg.seed,
      forgeReduced: this.faults.liarOwner ? forgedReduce(this.faults.liarOwner.from, cfg.exchange) : null,
      exchangeAt: cfg.local_steps > 1 ? (s) => isExchangeStep(cfg, s) : null,
      ...(this.host.backend()?.sha ? { sha: this.host.backend().sha } : {}) });
    collective.onLie = (slot, step, lie) => auditsP.onLie(this, collective, slot, step, lie);
    collective.holdUntil = this.holdUntil;
    this.collectives.set(key, collective);
    return collective;
  }

  dispose(collective) {
    if (!collective) return;
    collective.close();
    if (this.collectives.get(collective.runId) === collective) this.collectives.delete(collective.runId);
  }

  // a JSON message to every other peer of `ids` (best effort: a closed link is a departure)
  tellAll(run, type, obj, ids = run.roster) {
    for (const id of ids) {
      if (id !== this.selfId) this.mesh.sendJson(id, type, obj, { runId: run.desc.runId, slot: run.slot }).catch(() => {});
    }
  }

  // waits woken when the phase, a recovery or a roster change moves on
  onPoke(fn) { this.pokes.add(fn); return () => this.pokes.delete(fn); }
  poke() { for (const fn of [...this.pokes]) fn(); if (this.phase !== 'running') for (const fn of [...this.endedWaiters]) fn(); }
  onEnded(fn) { this.endedWaiters.add(fn); return () => this.endedWaiters.delete(fn); }

  // ---- the host's calls -------------------------------------------------------------------------
  start(config) { return startP.start(this, config); }

  begin(desc, replica, cfg, opts) { loopP.begin(this, desc, replica, cfg, opts); }

  // The user's Stop: every member ends after the step in flight; the panel names who stopped.
  stop(reason = '') {
    if (this.phase === 'running') return loopP.stop(this, reason);
    if (this.phase === 'proposing') { this.at.reject(new Error('stopped before it started')); return true; }
    if (this.phase === 'joining') { joinP.abandonJoin(this, 'stopped on this device', 60_000); return true; }
    return false;
  }

  maybeJoin() { joinP.maybeJoin(this); }

  // The server is down (peer/outage.js): a peer may be stalled on its batch, not gone, so every
  // exchange deadline that passes before `until` waits on, in this run's collectives and in those
  // a run started later makes (newCollective).
  holdDeadlines(until) {
    this.holdUntil = until;
    for (const collective of this.collectives.values()) collective.holdUntil = until;
  }

  // "don't train with this device": this device refuses any roster with `id` and never proposes
  // one (roster.js keptOutOf). A run it is in now is stopped (its next Start goes on without it),
  // unless the signaling server already said it left (a room host's removal): then the run's
  // recovery goes on without it.
  keepOut(id, why) {
    if (typeof id !== 'string' || id === this.selfId) return false;
    this.keptOut.set(id, why);
    if (this.phase === 'proposing' && this.at.desc.roster.includes(id)) this.at.reject(new Error(`${this.host.nameOf(id)} is kept out: ${why}`));
    if (this.phase === 'accepted' && this.at.desc.roster.includes(id)) { startP.refuseAccepted(this, `${this.host.nameOf(id)} is kept out: ${why}`); }
    if (this.phase === 'joining' && this.at.from === id) joinP.abandonJoin(this, `${this.host.nameOf(id)} is kept out: ${why}`, 0);
    if (this.phase === 'running' && this.at.roster.includes(id) && !this.serverGone.has(id)) loopP.stop(this, `${this.host.nameOf(id)} is kept out: ${why}`);
    return true;
  }

  trustAgain(id) { return this.keptOut.delete(id); }

  // a peer's link closed: this device's own evidence
  peerGone(id, why) {
    if (this.phase === 'proposing' && this.at.desc.roster.includes(id)) this.at.reject(new Error(`${this.host.nameOf(id)} left (${why})`));
    if (this.phase === 'accepted' && this.at.from === id) { startP.dropAccepted(this); this.host.note(`The run's leader ${this.host.nameOf(id)} left before it started.`); }
    if (this.phase === 'joining' && this.at.from === id) joinP.abandonJoin(this, `${this.host.nameOf(id)} left while syncing this device in`, 0);
    if (this.phase === 'running') recoveryP.evidence(this, this.at, id, why);
  }

  // a peer convicted on this device's own evidence (audits.js): gone, like a departure; a roster
  // proposal that waited for this device's own judgement is checked again now
  convicted(run, id, why) {
    recoveryP.evidence(this, run, id, why);
    recoveryP.reportJudgement(this, run);
  }

  // this device's judgement of the audit evidence changed: its STATUS (or its proposal) follows
  judged(run) { recoveryP.reportJudgement(this, run); }

  // the signaling server's word: a departure it saw may let survivors go on (recovery.js)
  serverSaysGone(id) {
    this.serverGone.add(id);
    if (this.phase === 'running') recoveryP.onServerGone(this, this.at, id);
  }

  serverSaysBack(id) { this.serverGone.delete(id); }

  // the page is going away: tell the run's peers now (they would otherwise wait for a deadline)
  goodbye() {
    const run = this.run;
    if (!run) return;
    this.tellAll(run, TYPES.LEAVE, { runId: run.desc.runId, reason: `${this.host.nameOf(this.selfId)} closed its page` });
  }

  // bytes sent and time waited over the whole run (every epoch's collective)
  stats(run) {
    const c = run.collective;
    return { bytesSent: run.sent.bytes + (run.ended ? 0 : c.bytesSent), waitMs: run.sent.waitMs + (run.ended ? 0 : c.waitMs) };
  }

  // test hook (window.daisy.corruptWeights): flip the lowest bit of one weight of this replica
  corruptWeights() {
    const run = this.run;
    if (!run) throw new Error('no run');
    const w = run.replica.params['wte.weight'];
    new BigUint64Array(w.buffer, w.byteOffset, 1)[0] ^= 1n;
    run.hash = weightHash(run.replica.params);
    return run.hash;
  }
}

// the fault plan's lying shard owner: its REDUCED from step index `from` on (attack.js forgeReduced)
function forgedReduce(from, exchange) {
  const codec = codecFor(exchange);
  return (step, message) => (step >= from ? forgeReduced(message, codec) : message);
}
