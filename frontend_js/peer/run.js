// The group run controller: one run per group, started by any device (the run's leader) and
// trained in lockstep by every peer of its roster over the mesh (docs/ARCHITECTURE.md "A group run").
//
//   leader                                   each other member
//   RUN {runId, config, dataId, roster,  ──►  checks it (idle, same data, in the roster), builds
//        startStep, initHash}                 the start weights, compares their hash
//   [STATE: the weights + Adam, resuming] ──►
//                                        ◄──  ACCEPT {initHash} | REFUSE {reason}
//   GO (every member accepted)           ──►  step startStep begins everywhere
//   then per step s, every peer: batch (seed, s, slot) from /data/batch, local step, the
//   MeshCollective exchange (its frames carry the sender's hash after step s-1: the sync
//   guard), Adam, hash. After the last step FIN {hash}: every peer checks every final hash.
//
// Stopping: STOP {stopAfter} from any peer; every peer ends after exactly stopAfter steps
// (the sender sends no gradient past it, so nobody can complete a later step). A peer that
// leaves (link closed, goodbye, exchange deadline) stops the run on every page with the reason;
// every survivor keeps the state after the last step they all completed (one step of undo).
// Two Start presses at once: the proposal with the smaller runId wins everywhere.
import { TYPES, NO_SLOT } from './frames.js';
import { unflatten } from '../collective.js';
import { MeshCollective, ExchangeError } from './mesh_collective.js';
import { Trainer, Replica, cloneParams, cloneReplica, checkLoss } from '../train.js';
import { HttpBatches } from '../batch_source.js';
import { StepArena } from '../arena.js';
import { encodeState, decodeState, maxStateBytes } from '../state_codec.js';
import { MAX_RUN_ID, epochKey, actingLeader, mayGoOn, checkRoster, scheduleWith } from './roster.js';
import { yieldToPage, waitUntil } from './page_clock.js';       // no throttled timer on a run's path (background tabs)

export const LINK_WAIT_MS = 8_000;       // Start, and a joiner before asking, wait this long for links still connecting
export const ACCEPT_WAIT_MS = 15_000;    // the leader's bound on the members' answers
export const GO_WAIT_MS = 20_000;        // a member's bound on the leader's GO
export const FIN_WAIT_MS = 10_000;       // bound on the final hashes
export const DEADLINE_MS = 7_000;        // no frame from a needed peer for this long: it is gone
export const DEADLINE_STEPS = 5;         // ... or for this many of the run's recent step times, if longer
export const CONFIRM_WAIT_MS = 10_000;   // half the group or less left: wait this long for the server's word
export const JOIN_WAIT_MS = 6_000;       // a joiner asks again when the leader's SYNC or STATE stalls this long
export const MAX_JOINERS = 8;            // devices being synced in at once
const HASH_LOG = 64;                     // the leader's recent hashes, to check joiners' reports
const MAX_RESYNCS = 3;                   // a joiner that reports a wrong hash this often is refused
const CHUNK_MS = 25;                     // train at most this long before yielding to the page
const RATE_WINDOW = 20;                  // steps in the tokens/s window
const MAX_CURVE = 2000;                  // loss points kept for the plot (older ones thinned)
const HASH_BYTES = 32;

const short = (h) => (h ? h.slice(0, 12) : '(none)');
const isHash = (h) => typeof h === 'string' && /^[0-9a-f]{64}$/.test(h);

function newRunId() {
  const a = new Uint32Array(1);
  do crypto.getRandomValues(a); while ((a[0] & MAX_RUN_ID) === 0 || (a[0] & MAX_RUN_ID) > MAX_RUN_ID - 100_000);
  return a[0] & MAX_RUN_ID;               // below 2^31 - 1e5: run id + epoch never wraps (roster.js)
}

// a replicated P schedule [[fromStep, P], ...]: strictly increasing steps, P in 1..64
function validHistory(h, from, P) {
  if (!Array.isArray(h) || !h.length || h.length > 4096) return false;
  let last = -1;
  for (const e of h) {
    if (!Array.isArray(e) || e.length !== 2 || !Number.isInteger(e[0]) || !Number.isInteger(e[1]) || e[0] <= last || e[1] < 1 || e[1] > 64) return false;
    last = e[0];
  }
  const tail = h[h.length - 1];
  return from === undefined || (tail[0] <= from && tail[1] === P);
}

export class RunController {
  // peer: the Peer (state, bus, model store); mesh: the Mesh
  constructor(peer, mesh) {
    this.peer = peer;
    this.mesh = mesh;
    this.proposal = null;     // leader: {runId, desc, answers: Map, resolve}
    this.accepted = null;     // member: {desc, from, timer, state}
    this.run = null;          // the active run
    this.joining = null;      // this idle device asking a running group to sync it in (below)
    this.joinBackoffUntil = 0;
    this.serverGone = new Set();  // peers the signaling server saw leave (peer-left), until they come back
    this.collectives = new Map(); // frame run id (run id + epoch) -> MeshCollective
    // test hook (set before the page loads, tests/test_membership.py): this joiner's state goes
    // wrong after its checks, so the leader must catch its hash and re-sync it
    this.testCorruptSync = Boolean(globalThis.__daisyTest?.corruptNextSync);
    this.joinWantSince = 0;         // when this idle device first saw a group it could join (0: none)
    this.linkWaitTimer = null;
    this.testNoJoin = Boolean(globalThis.__daisyTest?.noJoin);   // tests: an outsider that never asks to join
    const on = (type, fn) => mesh.on(type, (from, m) => fn.call(this, from, m));
    on(TYPES.RUN, this.onRun); on(TYPES.STATE, this.onState); on(TYPES.GO, this.onGo);
    mesh.on(TYPES.ACCEPT, (from, m) => this.onAnswer(from, m, true));
    mesh.on(TYPES.REFUSE, (from, m) => this.onAnswer(from, m, false));
    on(TYPES.STOP, this.onStop); on(TYPES.FIN, this.onFin);
    on(TYPES.ROSTER, this.onRoster); on(TYPES.STATUS, this.onStatus); on(TYPES.HALT, this.onHalt);
    on(TYPES.LEAVE, this.onLeave); on(TYPES.JOIN, this.onJoin); on(TYPES.SYNC, this.onSync);
    on(TYPES.FWD, this.onFwd); on(TYPES.SYNCED, this.onSynced);
    mesh.on('link', ({ peer: id, state, reason }) => {
      if (state === 'closed') this.peerGone(id, reason || 'its link closed');
      else this.maybeJoin();
    });
    mesh.on('progress', (e) => this.onProgress(e));
    mesh.on('drop', (e) => this.onDropped(e));
    // gradient frames go to the collective of their run and epoch (run id + epoch in the header),
    // and are accepted only at its sizes
    for (const type of [TYPES.GRAD, TYPES.REDUCED]) {
      mesh.on(type, (from, m) => {
        const c = this.collectives.get(m.runId);
        if (c) c.onFrame(from, m);
        else this.mesh.drop(from, m, `a gradient frame of run ${m.runId}, not a run or epoch of this device`);
      });
      mesh.setLimit(type, (h) => {
        const c = this.collectives.get(h.runId);
        return c ? c.maxPayload(type) : `a gradient frame of run ${h.runId}, not a run or epoch of this device`;
      });
    }
  }

  get selfId() { return this.peer.s.peerId; }

  get busy() { return Boolean(this.run || this.proposal || this.accepted || this.joining); }

  // ---- leader -------------------------------------------------------------------------------
  async start(config) {
    const p = this.peer, s = p.s;
    if (s.role === 'pending') throw new Error('waiting for the room host to accept this device: it cannot start a run yet');
    if (s.rejected) throw new Error('the room host declined this device');
    if (this.run) throw new Error('a run is already going: stop it first');
    if (this.proposal || this.accepted) throw new Error('a run is being set up in this group: wait a moment');
    if (this.joining) throw new Error('this device is being synced into the group\'s run');
    const other = s.peers.find((q) => q.id !== s.peerId && /^training/.test(q.state || ''));
    if (other) throw new Error(`a run is already going in this group (${other.name} is training): one run per group; this device joins it once linked`);
    // resume: true continues the model this tab holds (a loaded checkpoint or a stopped run) from
    // its step with its config; false starts a new run from step 0; absent: a loaded checkpoint
    // short of its last step is continued (the API's behaviour before `resume` existed)
    const { resume: want, ...settings } = config || {};
    if (want !== undefined && typeof want !== 'boolean') throw new Error(`resume must be true or false, got ${JSON.stringify(want)}`);
    const m = p.models;
    const point = m.resumePoint();
    if (want === true && !point) {
      throw new Error(!m.model ? 'nothing to continue: this tab holds no model (train or load one)'
        : `nothing to continue: the model is at the last step of its run (${m.step} of ${m.model.cfg.steps}); start a new run`);
    }
    const c = await p.compute();
    await p.pathReady;
    const dataId = await p.dataId();
    const resume = point && (want === true || (want === undefined && m.resumable)) ? m.model : null;
    const cfg = resume ? resume.cfg : c.config.makeConfig(settings);
    // members: every admitted peer of the group whose link is up (waiting for links still opening)
    const candidates = s.peers.filter((q) => q.id !== s.peerId && q.role !== 'pending');
    await this.waitForLinks(candidates.map((q) => q.id));
    const ready = candidates.filter((q) => this.mesh.isReady(q.id));
    const left = candidates.filter((q) => !this.mesh.isReady(q.id));
    // slot order: the leader, then the others by time of joining the group, then id
    ready.sort((a, b) => (a.joinedAt - b.joinedAt) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    const roster = [s.peerId, ...ready.map((q) => q.id)];
    const replica = resume ? cloneReplica(resume.replicas[0]) : freshReplica(c, cfg);
    const startStep = resume ? m.step : 0;
    const desc = { runId: newRunId(), protocol: this.mesh.version, leader: s.peerId, config: c.config.configToDict(cfg),
                   dataId, roster, startStep, initHash: c.hashing.weightHash(replica.params),
                   extra: resume ? (m.extra || null) : null };
    if (left.length) p.note(`Left out of this run (no peer-to-peer link yet): ${left.map((q) => q.name).join(', ')}.`);
    const collective = this.prepare(desc, cfg, c);
    try {
      if (roster.length > 1) await this.propose(desc, replica, c, cfg);
    } catch (err) { this.dispose(collective); throw err; }
    this.begin(desc, replica, cfg, c, { leader: true, resumed: Boolean(resume), collective });
    return { config: { ...cfg }, roster: roster.slice(), runId: desc.runId };
  }

  async waitForLinks(ids) {
    await waitUntil(() => ids.every((id) => this.mesh.isReady(id)), LINK_WAIT_MS, (wake) => this.mesh.on('link', wake));
  }

  // RUN (+ STATE) to every member; resolves when all accepted, rejects with the reason otherwise
  async propose(desc, replica, c, cfg) {
    const members = desc.roster.slice(1);
    const prop = { runId: desc.runId, desc, answers: new Map() };
    this.proposal = prop;
    this.peer.set({ runState: 'starting', message: `Starting a run with ${members.length} other device(s)…`, error: '' });
    const done = new Promise((resolve, reject) => { prop.resolve = resolve; prop.reject = reject; });
    const timer = setTimeout(() => prop.reject(new Error(`no answer from ${members.filter((id) => !prop.answers.has(id)).map((id) => this.peer.nameOf(id)).join(', ')} within ${ACCEPT_WAIT_MS / 1000} s`)), ACCEPT_WAIT_MS);
    try {
      const body = desc.startStep > 0 ? new Uint8Array(encodeState(c.model.paramShapes(cfg), {
        config: desc.config, step: desc.startStep, adamT: replica.adam.t, params: replica.params,
        m: replica.adam.m, v: replica.adam.v, weightHash: desc.initHash, extra: desc.extra })) : null;
      await Promise.all(members.map(async (id) => {
        await this.mesh.sendJson(id, TYPES.RUN, desc, { runId: desc.runId });
        if (body) await this.mesh.send(id, { type: TYPES.STATE, runId: desc.runId, payload: body });
      }));
      await done;
      if (this.proposal !== prop) throw new Error('the run was cancelled');
      await Promise.all(members.map((id) => this.mesh.sendJson(id, TYPES.GO, { runId: desc.runId }, { runId: desc.runId })));
    } catch (err) {
      for (const id of members) this.mesh.sendJson(id, TYPES.STOP, { runId: desc.runId, stopAfter: desc.startStep, reason: `the run did not start: ${err.message}` }, { runId: desc.runId }).catch(() => {});
      this.peer.set({ runState: this.peer.s.runState === 'starting' ? 'idle' : this.peer.s.runState });
      throw err;
    } finally {
      clearTimeout(timer);
      if (this.proposal === prop) this.proposal = null;
    }
  }

  onAnswer(from, m, yes) {
    if (!yes && m.json.runId === 0 && this.joining && this.joining.asked.includes(from)) {
      this.joining.refused = true;
      this.abandonJoin(`${this.peer.nameOf(from)} declined: ${String(m.json.reason || 'no reason').slice(0, 200)}`, 30_000);
      return;
    }
    const prop = this.proposal;
    if (!prop || m.json.runId !== prop.runId || !prop.desc.roster.includes(from)) {
      this.mesh.drop(from, m, 'an answer to no proposal of ours');
      return;
    }
    if (!yes) { prop.reject(new Error(`${this.peer.nameOf(from)} refused: ${String(m.json.reason || 'no reason').slice(0, 200)}`)); return; }
    if (m.json.initHash !== prop.desc.initHash) {
      prop.reject(new Error(`${this.peer.nameOf(from)} built different start weights (${short(m.json.initHash)} vs ${short(prop.desc.initHash)})`));
      return;
    }
    prop.answers.set(from, true);
    if (prop.desc.roster.slice(1).every((id) => prop.answers.has(id))) prop.resolve();
  }

  // ---- member -------------------------------------------------------------------------------
  refuse(to, runId, reason) {
    this.mesh.sendJson(to, TYPES.REFUSE, { runId, reason }, { runId }).catch(() => {});
  }

  async onRun(from, m) {
    const d = m.json, s = this.peer.s;
    const runId = d.runId;
    if (!Number.isInteger(runId) || runId <= 0 || runId > 0xffffffff || m.runId !== runId) { this.mesh.drop(from, m, 'RUN without a valid run id'); return; }
    // one run per group: a running peer refuses; two proposals at once: the smaller runId wins
    if (this.run) { this.refuse(from, runId, `${s.name} is training in another run`); return; }
    if (this.joining) { this.refuse(from, runId, `${s.name} is being synced into another run`); return; }
    if (this.proposal) {
      if (runId < this.proposal.runId) this.proposal.reject(new Error(`${this.peer.nameOf(from)} started a run at the same moment; joining it instead`));
      else { this.refuse(from, runId, 'a competing run was proposed at the same moment'); return; }
    }
    if (this.accepted) {
      if (runId < this.accepted.desc.runId) {
        this.refuse(this.accepted.from, this.accepted.desc.runId, 'a competing run was proposed at the same moment');
        this.dropAccepted();
      } else { this.refuse(from, runId, 'this device already accepted another run'); return; }
    }
    let why = null, cfg = null;
    const c = await this.peer.compute().catch((e) => { why = e.message; return null; });
    try {
      if (!c) throw new Error(why);
      if (d.protocol !== this.mesh.version) throw new Error(`protocol v${d.protocol}, this page v${this.mesh.version}`);
      if (d.leader !== from || !Array.isArray(d.roster) || d.roster[0] !== from) throw new Error('the leader must be the sender and slot 0');
      if (d.roster.length > 64 || new Set(d.roster).size !== d.roster.length || !d.roster.every((x) => typeof x === 'string')) throw new Error('bad roster');
      if (!d.roster.includes(s.peerId)) throw new Error('this device is not in the roster');
      cfg = c.config.makeConfig(d.config);
      if (!Number.isInteger(d.startStep) || d.startStep < 0 || d.startStep >= cfg.steps) throw new Error(`bad start step ${d.startStep}`);
      if (typeof d.initHash !== 'string' || !/^[0-9a-f]{64}$/.test(d.initHash)) throw new Error('bad start hash');
      const mine = await this.peer.dataId();
      if (d.dataId !== mine) throw new Error(`different training data: the leader's is ${String(d.dataId).slice(0, 120)}, this device's ${mine}`);
    } catch (err) {
      this.refuse(from, runId, err.message);
      this.peer.note(`Declined a run from ${this.peer.nameOf(from)}: ${err.message}`);
      return;
    }
    const acc = { desc: d, from, cfg, c, replica: null, collective: this.prepare(d, cfg, c) };
    this.accepted = acc;
    acc.timer = setTimeout(() => { if (this.accepted === acc) { this.dropAccepted(); this.peer.note(`The run from ${this.peer.nameOf(from)} never started (no GO within ${GO_WAIT_MS / 1000} s).`); } }, GO_WAIT_MS);
    const shapes = c.model.paramShapes(cfg);
    const stateBytes = 8 * 3 * shapes.reduce((n, [, sh]) => n + sh.reduce((x, y) => x * y, 1), 0) + 64 * 1024;
    this.mesh.setLimit(TYPES.STATE, (h) => (h.runId === runId ? stateBytes : 'STATE for another run'));
    this.peer.set({ runState: 'joining', message: `Joining the run started by ${this.peer.nameOf(from)}…` });
    if (d.startStep === 0) {
      acc.replica = freshReplica(c, cfg);
      this.answerRun(acc);
    }       // else: ACCEPT once its STATE arrived and checked out (onState)
  }

  onState(from, m) {
    if (this.joining && this.joining.from === from) { this.onJoinState(from, m); return; }
    const acc = this.accepted;
    if (!acc || acc.from !== from || m.runId !== acc.desc.runId || acc.replica) { this.mesh.drop(from, m, 'STATE for no accepted run'); return; }
    this.mesh.setLimit(TYPES.STATE, null);
    try {
      const st = decodeState(m.payload.buffer.slice(m.payload.byteOffset, m.payload.byteOffset + m.payload.byteLength), { makeConfig: acc.c.config.makeConfig, paramShapes: acc.c.model.paramShapes });
      if (!st.m || !st.v) throw new Error('the state has no Adam moments');
      if (JSON.stringify(acc.c.config.configToDict(acc.c.config.makeConfig(st.config))) !== JSON.stringify(acc.desc.config)) throw new Error('the state\'s settings differ from the run\'s');
      if (st.step !== acc.desc.startStep || st.adamT !== st.step) throw new Error(`the state is at step ${st.step}, the run starts at ${acc.desc.startStep}`);
      acc.replica = cloneReplica({ params: st.params, adam: { t: st.adamT, m: st.m, v: st.v } });
    } catch (err) {
      this.refuse(from, acc.desc.runId, `its state was refused: ${err.message}`);
      this.dropAccepted();
      return;
    }
    this.answerRun(acc);
  }

  answerRun(acc) {
    const hash = acc.c.hashing.weightHash(acc.replica.params);
    if (hash !== acc.desc.initHash) {
      this.refuse(acc.from, acc.desc.runId, `start weights hash to ${short(hash)}, the leader's to ${short(acc.desc.initHash)}`);
      this.dropAccepted();
      return;
    }
    this.mesh.sendJson(acc.from, TYPES.ACCEPT, { runId: acc.desc.runId, initHash: hash }, { runId: acc.desc.runId }).catch(() => {});
  }

  dropAccepted() {
    const acc = this.accepted;
    if (!acc) return;
    clearTimeout(acc.timer);
    this.accepted = null;
    this.dispose(acc.collective);
    this.mesh.setLimit(TYPES.STATE, null);
    if (!this.run && (this.peer.s.runState === 'joining')) this.peer.set({ runState: 'idle' });
  }

  onGo(from, m) {
    const acc = this.accepted;
    if (!acc || acc.from !== from || m.json.runId !== acc.desc.runId || !acc.replica) { this.mesh.drop(from, m, 'GO for no accepted run'); return; }
    clearTimeout(acc.timer);
    this.accepted = null;
    this.begin(acc.desc, acc.replica, acc.cfg, acc.c, { leader: false, resumed: acc.desc.startStep > 0, collective: acc.collective });
  }

  // ---- the run ------------------------------------------------------------------------------
  // A collective per roster epoch, registered before anyone may send it a gradient (the leader:
  // before RUN; a member: when it accepts; everyone: when a ROSTER announces the next epoch), so
  // a fast peer's first frames are kept, not dropped.
  newCollective(runId, epoch, roster, startStep, cfg, c, deadlineMs = DEADLINE_MS) {
    const key = epochKey(runId, epoch);
    const collective = new MeshCollective(this.mesh, { runId: key, roster, selfId: this.selfId,
      shapes: c.model.paramShapes(cfg), startStep, deadlineMs, subscribe: false });
    this.collectives.set(key, collective);
    return collective;
  }

  prepare(desc, cfg, c) { return this.newCollective(desc.runId, 0, desc.roster, desc.startStep, cfg, c); }

  dispose(collective) {
    if (!collective) return;
    collective.close();
    if (this.collectives.get(collective.runId) === collective) this.collectives.delete(collective.runId);
  }

  // opts: {leader, resumed, collective} for a run that starts; a joiner also passes {roster,
  // epoch, history, completed, hash, trainer, batches} of the run it enters
  begin(desc, replica, cfg, c, opts) {
    const p = this.peer, s = p.s;
    const roster = opts.roster || desc.roster;
    const completed = opts.completed ?? desc.startStep;
    const batches = opts.batches || new HttpBatches(cfg, { dataId: desc.dataId });
    const run = {
      desc, cfg, c, batches, collective: opts.collective, roster, epoch: opts.epoch || 0,
      history: opts.history || [[desc.startStep, roster.length]], slot: roster.indexOf(s.peerId),
      trainer: opts.trainer || new Trainer(cfg, replica, batches, p.backend()), replica, arena: p.backend()?.newArena() ?? new StepArena(),
      completed, lastSent: completed - 1, stopAfter: null, stopReason: '',
      hash: opts.hash || desc.initHash, hashLog: new Map([[completed, opts.hash || desc.initHash]]),
      peerHashes: new Map(roster.map((id) => [id, opts.hash || desc.initHash])),
      fins: new Map(), undo: null, ended: false, finishing: false,
      gone: new Set(), confirmed: new Set(), goneWhy: new Map(), recovery: null, nextRoster: null,
      joiners: new Map(), sent: { bytes: 0, waitMs: 0 },
      extra: desc.extra && typeof desc.extra === 'object' ? desc.extra : { data: desc.dataId.startsWith('builtin') ? 'builtin' : 'fineweb-edu', data_id: desc.dataId },
    };
    this.run = run;
    p.models.adopt(cfg, replica, completed, run.extra);
    p.stepTimes = [];
    const others = roster.length - 1;
    const topology = run.collective.topology;
    p.set({ running: true, runState: 'training', leader: roster[0], config: cfg, step: completed,
            totalSteps: cfg.steps, loss: null, hash: run.hash, curve: [], tokensPerS: null, sync: null,
            replicas: { count: roster.length, agree: true, step: completed },
            run: this.runView(run), peerHashes: Object.fromEntries(run.peerHashes), error: '',
            message: (opts.joined ? `Synced in: training from step ${completed + 1}` : opts.resumed ? `Resuming from step ${completed}` : 'Training')
              + (others ? ` with ${others} other device(s) (${topology === 'allgather' ? 'all-gather' : 'reduce-scatter + all-gather'}).` : ' on this device alone.') });
    p.announce();
    p.bus.emit('run-started', { config: { ...cfg }, roster: roster.slice(), runId: desc.runId, leader: roster[0], joined: Boolean(opts.joined) });
    this.loop(run).catch((err) => {
      console.warn('daisy: the run failed:', err);
      this.end(run, 'failed', `The run stopped: ${err.message || err}`, err.message || String(err));
    });
  }

  runView(run) {
    return { id: run.desc.runId, roster: run.roster.slice(), topology: run.collective.topology, leader: run.roster[0],
             epoch: run.epoch, history: run.history.map((e) => e.slice()) };
  }

  async loop(run) {
    const p = this.peer, { cfg } = run;
    let chunkStart = performance.now();
    const gpu = p.gpu;
    for (;;) {
      if (run.ended) return;
      if (run.recovery) { await this.awaitRecovery(run); continue; }
      const s = run.completed;
      if (s >= cfg.steps) break;
      if (run.stopAfter !== null && s >= run.stopAfter) break;
      if (run.nextRoster && run.nextRoster.from === s) this.switchRoster(run);
      run.arena.reset();
      const slot = run.slot;
      // a GPU result that failed its audit: the engine is on the CPU by then; redo the local step
      const local = gpu ? await gpu.withGpuFallback(run.trainer.backend.engine, () => run.trainer.localStep(s, slot, run.arena))
        : await run.trainer.localStep(s, slot, run.arena);
      if (run.ended) return;
      if (run.recovery) continue;                     // a departure while we computed: recompute
      if (run.stopAfter !== null && s >= run.stopAfter) break;
      if (run.roster[0] === this.selfId) await this.admitJoiners(run, s);
      run.lastSent = s;
      let out;
      try {
        out = await run.collective.exchange(s, run.roster, slot, local.loss, local.grads, run.hash);
      } catch (err) {
        if (!(err instanceof ExchangeError)) throw err;
        if (run.ended) return;
        if (!run.recovery && run.stopAfter !== null && s >= run.stopAfter) break;   // stopped by a peer mid-exchange
        if (err.peer) this.suspect(run, err.peer, err.message);
        if (!run.recovery) throw err;
        continue;                                       // parks in awaitRecovery, then recomputes
      }
      // the sync guard: every peer's hash after step s (0-based s-1 done) must equal ours
      const bad = out.hashes.map((h, i) => [run.roster[i], h]).filter(([, h]) => h !== run.hash);
      for (const [i, h] of out.hashes.entries()) run.peerHashes.set(run.roster[i], h);
      if (bad.length) {
        const who = [[p.s.peerId, run.hash], ...bad].map(([id, h]) => `${p.nameOf(id)} has ${short(h)}`).join(', ');
        const message = `Replicas disagree after step ${s}: ${who}. Stopped (never fork).`;
        this.tellAll(run, TYPES.STOP, { runId: run.desc.runId, stopAfter: run.completed, reason: message, mismatch: true });
        this.end(run, 'stopped', message, 'replica mismatch');
        return;
      }
      this.saveUndo(run);
      const applied = await run.trainer.apply(out.grads);
      checkLoss(out.loss, s + 1);
      run.completed = s + 1;
      run.hash = applied.hash;
      run.hashLog.set(s + 1, applied.hash);
      run.hashLog.delete(s + 1 - HASH_LOG);
      run.peerHashes.set(p.s.peerId, applied.hash);
      this.report(run, s + 1, out.loss, cfg.batch * cfg.seq_len * run.roster.length);
      if (run.roster[0] === this.selfId && run.joiners.size) this.forwardToJoiners(run, s, out.flat);
      this.peer.storedRun?.afterStep(run);          // the leader stores the group's run (stored_run.js)
      // the deadline follows the group's pace: a slow group (big settings, phones) is not "gone"
      const t = p.stepTimes, n = t.length;
      if (n > 2) run.collective.deadlineMs = Math.max(DEADLINE_MS, DEADLINE_STEPS * (t[n - 1] - t[0]) / (n - 1));
      if (performance.now() - chunkStart > CHUNK_MS) { await yieldToPage(); chunkStart = performance.now(); }
    }
    if (run.ended) return;
    if (run.stopAfter !== null && run.completed < cfg.steps) {
      this.end(run, 'stopped', `Stopped at step ${run.completed}${run.stopReason ? ` (${run.stopReason})` : ''}.`, '');
      return;
    }
    await this.finishRun(run);
  }

  report(run, step, loss, tokensPerStep) {
    const p = this.peer;
    const now = performance.now();
    p.stepTimes.push(now);
    if (p.stepTimes.length > RATE_WINDOW) p.stepTimes.shift();
    const n = p.stepTimes.length;
    const rate = n > 1 ? (tokensPerStep * (n - 1) * 1000) / (p.stepTimes[n - 1] - p.stepTimes[0]) : null;
    const curve = p.s.curve;
    curve.push([step, loss]);
    if (curve.length > MAX_CURVE) p.s.curve = curve.filter((_, i) => i % 2 === 0 || i === curve.length - 1);
    p.models.step = step;
    // peers' hashes arrive one step late (with the next step's frames): agreement is at step-1
    const P = run.roster.length;
    p.set({ step, loss, hash: run.hash, tokensPerS: rate, peerHashes: Object.fromEntries(run.peerHashes),
            replicas: { count: P, agree: true, agreeing: P, step: P > 1 ? step - 1 : step } });
    p.bus.emit('step', { step, loss, hash: run.hash, peers: P });
  }

  // after the last step: FIN with our hash to everyone; every final hash must agree
  async finishRun(run) {
    const p = this.peer;
    run.finishing = true;
    const others = run.roster.filter((id) => id !== p.s.peerId);
    run.fins.set(p.s.peerId, run.hash);
    await Promise.all(others.map((id) => this.mesh.sendJson(id, TYPES.FIN, { runId: run.desc.runId, step: run.completed, hash: run.hash }, { runId: run.desc.runId, slot: run.slot }).catch(() => {})));
    await waitUntil(() => run.ended || others.every((id) => run.fins.has(id)), FIN_WAIT_MS,
      (wake) => this.mesh.on(TYPES.FIN, wake), (wake) => this.peer.bus.on('run-ended', wake));
    if (run.ended) return;
    const missing = others.filter((id) => !run.fins.has(id));
    const bad = others.filter((id) => run.fins.has(id) && run.fins.get(id) !== run.hash);
    for (const [id, h] of run.fins) run.peerHashes.set(id, h);
    p.set({ peerHashes: Object.fromEntries(run.peerHashes),
            replicas: { count: run.roster.length, agree: !bad.length, agreeing: run.roster.length - bad.length - missing.length, step: run.completed } });
    if (bad.length) {
      this.end(run, 'stopped', `Replicas disagree at the final step ${run.completed}: ${bad.map((id) => `${p.nameOf(id)} has ${short(run.fins.get(id))}`).join(', ')}, this device ${short(run.hash)}.`, 'replica mismatch');
      return;
    }
    const note = missing.length ? ` (no final hash from ${missing.map((id) => p.nameOf(id)).join(', ')})` : '';
    this.end(run, 'done', `Run finished: ${run.completed} steps, loss ${p.s.loss.toFixed(4)}${run.roster.length > 1 ? `, ${run.roster.length - missing.length} replicas agree` : ''}${note}.`, '');
  }

  onFin(from, m) {
    const run = this.run;
    if (!run || m.json.runId !== run.desc.runId || !run.roster.includes(from) || typeof m.json.hash !== 'string') { this.mesh.drop(from, m, 'FIN for no run of ours'); return; }
    run.fins.set(from, m.json.hash.slice(0, 64));
  }

  // ---- stopping -----------------------------------------------------------------------------
  // The user's Stop: every peer ends after the steps this device has sent gradients for.
  stop(reason = '') {
    const run = this.run;
    if (!run || run.ended) {
      if (this.proposal) { this.proposal.reject(new Error('stopped before it started')); return true; }
      if (this.joining) { this.abandonJoin('stopped on this device', 60_000); return true; }
      return false;
    }
    const stopAfter = run.recovery ? run.completed : run.lastSent + 1;
    run.stopReason = reason || `stopped on ${this.peer.s.name}`;
    this.setStop(run, stopAfter);
    this.tellAll(run, TYPES.STOP, { runId: run.desc.runId, stopAfter, reason: run.stopReason });
    this.peer.set({ message: 'Stopping after the current step…' });
    return true;
  }

  setStop(run, stopAfter) {
    run.stopAfter = run.stopAfter === null ? stopAfter : Math.min(run.stopAfter, stopAfter);
    // an exchange of a step past the stop can never complete: end it now
    if (run.lastSent >= run.stopAfter) run.collective.fail(new ExchangeError('stopped'));
    if (run.recovery) this.wakeParked(run);
  }

  // a JSON message to every other peer of the run (best effort: a closed link is a departure)
  tellAll(run, type, obj, ids = run.roster) {
    for (const id of ids) {
      if (id !== this.peer.s.peerId) this.mesh.sendJson(id, type, obj, { runId: run.desc.runId, slot: run.slot }).catch(() => {});
    }
  }

  onStop(from, m) {
    const d = m.json;
    const reason = String(d.reason || '').slice(0, 400);
    if (this.accepted && this.accepted.from === from && d.runId === this.accepted.desc.runId) {
      this.dropAccepted();
      this.peer.note(`The run from ${this.peer.nameOf(from)} did not start: ${reason}`);
      return;
    }
    const run = this.run;
    if (!run || d.runId !== run.desc.runId || !run.roster.includes(from) || !Number.isInteger(d.stopAfter)) { this.mesh.drop(from, m, 'STOP for no run of ours'); return; }
    if (d.stopAfter < run.completed - 1 || d.stopAfter > run.lastSent + 2) { this.mesh.drop(from, m, `STOP after step ${d.stopAfter}, this device is at ${run.completed}`); return; }
    if (d.mismatch === true) {              // a peer saw replicas disagree: never fork, stop now
      this.end(run, 'stopped', `${reason || 'replicas disagree'} (reported by ${this.peer.nameOf(from)})`, 'replica mismatch');
      return;
    }
    if (d.stopAfter < run.completed && !this.restoreUndo(run)) {
      this.end(run, 'stopped', `${reason} — this device could not step back to ${d.stopAfter}`, 'cannot meet the group');
      return;
    }
    run.stopReason = reason || `stopped by ${this.peer.nameOf(from)}`;
    this.setStop(run, d.stopAfter);
  }

  // ---- membership: departures and recovery (docs/ARCHITECTURE.md "Membership") --------------
  // A link closed, a goodbye, a missed deadline: evidence that a peer left. The run halts at
  // the step in flight; the acting leader (the most senior peer not gone) collects every
  // survivor's position (STATUS), and sends the new roster (ROSTER) from the first step not
  // completed by all; peers one step ahead undo it, and that step is recomputed by the new
  // roster, exactly as the reference computes it with one peer fewer from that step.

  // a peer's link closed / the server or the peer said it left
  peerGone(id, why) {
    if (this.proposal && this.proposal.desc.roster.includes(id)) this.proposal.reject(new Error(`${this.peer.nameOf(id)} left (${why})`));
    if (this.accepted && this.accepted.from === id) { this.dropAccepted(); this.peer.note(`The run's leader ${this.peer.nameOf(id)} left before it started.`); }
    if (this.joining && this.joining.from === id) this.abandonJoin(`${this.peer.nameOf(id)} left while syncing this device in`, 0);
    this.suspect(this.run, id, why);
  }

  serverSaysGone(id) {
    this.serverGone.add(id);
    const run = this.run;
    if (run && run.gone.has(id)) this.tryFinishRecovery(run);
  }

  serverSaysBack(id) { this.serverGone.delete(id); }

  onLeave(from, m) {
    const run = this.run;
    if (!run || m.json.runId !== run.desc.runId) { if (run) run.joiners.delete(from); return; }
    this.suspect(run, from, String(m.json.reason || 'it closed its page').slice(0, 200), true);
  }

  suspect(run, id, why, confirmed = false) {
    if (!run || run.ended || run.finishing || id === this.selfId) return;
    if (confirmed) run.confirmed.add(id);
    run.joiners.delete(id);
    const inRun = run.roster.includes(id) || (run.nextRoster && run.nextRoster.roster.includes(id));
    if (!inRun) return;
    if (run.gone.has(id)) { this.tryFinishRecovery(run); return; }
    run.gone.add(id);
    run.goneWhy.set(id, why);
    this.beginRecovery(run);
  }

  deadline(run) { return run.collective.deadlineMs; }

  beginRecovery(run) {
    const p = this.peer;
    const rec = run.recovery || (run.recovery = { statuses: new Map(), waiters: [], parked: false, roster: null, timer: null, epoch: 0, leader: null });
    // the step in flight and an announced roster change are void: the acting leader decides
    run.collective.fail(new ExchangeError('the roster is changing'));
    if (run.nextRoster) { this.dispose(run.nextRoster.collective); run.nextRoster = null; }
    for (const [, j] of run.joiners) if (j.admitted !== undefined) j.admitted = undefined;
    const leader = actingLeader(run.roster, run.gone);
    rec.leader = leader;
    clearTimeout(rec.timer);
    const names = [...run.gone].map((id) => `${p.nameOf(id)} (${run.goneWhy.get(id) || 'gone'})`).join(', ');
    p.set({ message: `${names} left at step ${run.completed + 1}; the group recomputes that step without ${run.gone.size > 1 ? 'them' : 'it'}…` });
    if (leader === this.selfId) {
      rec.epoch = Math.max(rec.epoch, run.epoch + 1);
      const gone = [...run.gone];
      this.tellAll(run, TYPES.HALT, { runId: run.desc.runId, epoch: rec.epoch, gone }, run.roster.filter((id) => !run.gone.has(id)));
      rec.timer = setTimeout(() => this.statusTimeout(run, rec), this.deadline(run));
      this.tryFinishRecovery(run);
    } else if (rec.parked) {
      this.sendStatus(run);
    }
  }

  // the loop waits here (no step in flight) until the new roster applies or the run ends
  async awaitRecovery(run) {
    const rec = run.recovery;
    if (!rec) return;
    rec.parked = true;
    if (rec.roster) { this.applyRoster(run, rec.roster); return; }
    if (rec.leader === this.selfId) this.tryFinishRecovery(run);
    else this.sendStatus(run);
    if (run.recovery !== rec || run.ended) return;
    await new Promise((resolve) => rec.waiters.push(resolve));
  }

  wakeParked(run) {
    const rec = run.recovery;
    if (!rec) return;
    clearTimeout(rec.timer); clearTimeout(rec.confirmTimer);
    run.recovery = null;
    for (const w of rec.waiters) w();
  }

  sendStatus(run) {
    const rec = run.recovery;
    this.mesh.sendJson(rec.leader, TYPES.STATUS, { runId: run.desc.runId, epoch: run.epoch, completed: run.completed, hash: run.hash, gone: [...run.gone] },
      { runId: run.desc.runId, slot: run.slot }).catch(() => {});
    clearTimeout(rec.timer);
    const leader = rec.leader;
    rec.timer = setTimeout(() => { if (run.recovery === rec && rec.leader === leader) this.suspect(run, leader, 'no new roster from it in time'); }, this.deadline(run));
  }

  statusTimeout(run, rec) {
    if (run.recovery !== rec || rec.leader !== this.selfId) return;
    const missing = run.roster.filter((id) => !run.gone.has(id) && id !== this.selfId && !rec.statuses.has(id));
    for (const id of missing) { run.gone.add(id); run.goneWhy.set(id, 'no answer while the group recovered'); }
    if (missing.length) this.beginRecovery(run);
  }

  onHalt(from, m) {
    const run = this.run, d = m.json;
    if (!run || d.runId !== run.desc.runId || !run.roster.includes(from) || !Array.isArray(d.gone) || !Number.isInteger(d.epoch)) { this.mesh.drop(from, m, 'HALT for no run of ours'); return; }
    if (d.epoch <= run.epoch) return;                   // a recovery that already ended
    const seniors = run.roster.slice(0, run.roster.indexOf(from));
    if (!seniors.every((id) => d.gone.includes(id) || run.gone.has(id))) { this.mesh.drop(from, m, 'HALT from a peer that is not the acting leader'); return; }
    if (d.gone.includes(this.selfId)) { this.end(run, 'stopped', `The group went on without this device (${this.peer.nameOf(from)} lost contact with it).`, 'removed from the run'); return; }
    for (const id of d.gone) if (run.roster.includes(id) && !run.gone.has(id)) { run.gone.add(id); run.goneWhy.set(id, `reported by ${this.peer.nameOf(from)}`); }
    this.beginRecovery(run);
  }

  onStatus(from, m) {
    const run = this.run, d = m.json;
    if (!run || d.runId !== run.desc.runId || !run.roster.includes(from) || !Number.isInteger(d.completed) || !isHash(d.hash) || !Number.isInteger(d.epoch)) { this.mesh.drop(from, m, 'STATUS for no run of ours'); return; }
    if (d.epoch < run.epoch) return;                    // sent before the roster it asked for arrived
    // its evidence is ours too: whom it lost, the group loses (a split is avoided by mayGoOn)
    for (const id of Array.isArray(d.gone) ? d.gone : []) {
      if (id !== this.selfId && run.roster.includes(id) && !run.gone.has(id)) { run.gone.add(id); run.goneWhy.set(id, `lost by ${this.peer.nameOf(from)}`); }
    }
    if (!run.recovery || actingLeader(run.roster, run.gone) !== run.recovery.leader) this.beginRecovery(run);
    run.recovery.statuses.set(from, { completed: d.completed, hash: d.hash });
    this.tryFinishRecovery(run);
  }

  // the acting leader, once every survivor (itself included, parked) told its position
  tryFinishRecovery(run) {
    const rec = run?.recovery;
    if (!rec || rec.leader !== this.selfId || !rec.parked || rec.roster) return;
    const survivors = run.roster.filter((id) => !run.gone.has(id));
    rec.statuses.set(this.selfId, { completed: run.completed, hash: run.hash });
    if (!survivors.every((id) => rec.statuses.has(id))) return;
    const confirmed = new Set([...run.confirmed, ...this.serverGone]);
    if (!mayGoOn(run.roster, run.gone, confirmed)) {
      if (!rec.confirmTimer) {
        const waitingFor = [...run.gone].filter((id) => !confirmed.has(id)).map((id) => this.peer.nameOf(id)).join(', ');
        this.peer.set({ message: `Half the group or more is unreachable: waiting for the server to confirm that ${waitingFor} left (up to ${CONFIRM_WAIT_MS / 1000} s)…` });
        rec.confirmTimer = setTimeout(() => this.giveUp(run, rec, `lost ${[...run.gone].map((id) => this.peer.nameOf(id)).join(', ')}: half of the group or more, and the server did not confirm they left (going on could split the group in two)`), CONFIRM_WAIT_MS);
      }
      return;
    }
    clearTimeout(rec.confirmTimer);
    const at = survivors.map((id) => rec.statuses.get(id));
    const from = Math.min(...at.map((x) => x.completed));
    if (at.some((x) => x.completed > from + 1)) { this.giveUp(run, rec, 'the survivors are more than one step apart'); return; }
    const atFrom = new Set(at.filter((x) => x.completed === from).map((x) => x.hash));
    if (atFrom.size > 1) { this.giveUp(run, rec, `replicas disagree at step ${from}`, true); return; }
    const left = run.roster.filter((id) => run.gone.has(id));
    const msg = { runId: run.desc.runId, epoch: rec.epoch, from, roster: survivors, left, joined: [],
                  history: scheduleWith(run.history, from, survivors.length),
                  reason: left.map((id) => `${this.peer.nameOf(id)}: ${run.goneWhy.get(id) || 'gone'}`).join('; ').slice(0, 400) };
    this.tellAll(run, TYPES.ROSTER, msg, [...survivors, ...run.joiners.keys()]);
    rec.roster = msg;
    this.applyRoster(run, msg);
  }

  // no way on without risking a split: every survivor meets at the last step all completed
  giveUp(run, rec, why, mismatch = false) {
    if (run.recovery !== rec || run.ended) return;
    const at = [...rec.statuses.values()].map((x) => x.completed);
    const stopAfter = Math.min(run.completed, ...at);
    this.tellAll(run, TYPES.STOP, { runId: run.desc.runId, stopAfter, reason: `The run stopped: ${why}`, mismatch }, run.roster.filter((id) => !run.gone.has(id)));
    if (stopAfter < run.completed) this.restoreUndo(run);
    this.end(run, 'stopped', `The run stopped: ${why}. This device keeps the state after step ${run.completed} (generate, download and resume still work).`, why);
  }

  onRoster(from, m) {
    const d = m.json;
    const jn = this.joining;
    if (jn && jn.desc && d.runId === jn.desc.runId && !this.run) { this.onJoinRoster(from, m); return; }
    const run = this.run;
    if (!run || d.runId !== run.desc.runId) { this.mesh.drop(from, m, 'ROSTER for no run of ours'); return; }
    const planned = Array.isArray(d.joined) && d.joined.length > 0;
    const base = run.roster;
    const epochNow = Math.max(run.epoch, run.nextRoster ? run.nextRoster.epoch : 0);
    let why = checkRoster(d, { roster: base, epoch: epochNow, completed: run.completed, selfId: this.selfId }, from);
    if (!why && planned && (d.from < run.completed || d.from > run.completed + 2)) why = `joiners from step ${d.from + 1}, this device is at ${run.completed}`;
    if (!why && !validHistory(d.history, d.from, d.roster.length)) why = 'a malformed P schedule';
    if (why) { this.mesh.drop(from, m, `ROSTER refused: ${why}`); return; }
    if (!d.roster.includes(this.selfId)) {
      this.end(run, 'stopped', `The group went on without this device from step ${d.from + 1}.`, 'removed from the run');
      setTimeout(() => this.maybeJoin(), 1000);
      return;
    }
    if (planned) {
      const collective = this.newCollective(run.desc.runId, d.epoch, d.roster, d.from, run.cfg, run.c, run.collective.deadlineMs);
      run.nextRoster = { ...d, collective };
      return;
    }
    const rec = run.recovery || (run.recovery = { statuses: new Map(), waiters: [], parked: false, roster: null, timer: null, epoch: 0, leader: from });
    rec.roster = d;
    run.collective.fail(new ExchangeError('the roster is changing'));
    if (rec.parked) this.applyRoster(run, d);
  }

  // a planned change takes effect when the loop reaches its first step
  switchRoster(run) {
    const next = run.nextRoster;
    run.nextRoster = null;
    const joined = next.roster.filter((id) => !run.roster.includes(id));
    run.sent.bytes += run.collective.bytesSent; run.sent.waitMs += run.collective.waitMs;
    this.dispose(run.collective);
    run.collective = next.collective;
    this.setRoster(run, next, joined, []);
  }

  // the recovery's roster: undo a step if we are one ahead, then the new epoch
  applyRoster(run, d) {
    const rec = run.recovery;
    if (run.completed === d.from + 1 && !this.restoreUndo(run)) {
      this.end(run, 'stopped', `The run stopped: this device cannot step back to step ${d.from} to meet the group.`, 'cannot meet the group');
      return;
    }
    if (run.completed !== d.from) {
      this.end(run, 'stopped', `The run stopped: the group restarts at step ${d.from + 1}, this device is at ${run.completed + 1}.`, 'cannot meet the group');
      return;
    }
    const left = run.roster.filter((id) => !d.roster.includes(id));
    run.sent.bytes += run.collective.bytesSent; run.sent.waitMs += run.collective.waitMs;
    const deadlineMs = run.collective.deadlineMs;
    this.dispose(run.collective);
    if (run.nextRoster) { this.dispose(run.nextRoster.collective); run.nextRoster = null; }
    run.collective = this.newCollective(run.desc.runId, d.epoch, d.roster, d.from, run.cfg, run.c, deadlineMs);
    run.gone.clear(); run.goneWhy.clear();
    this.setRoster(run, d, [], left);
    if (rec) this.wakeParked(run);
  }

  setRoster(run, d, joined, left) {
    const p = this.peer;
    const wasLeader = run.roster[0];
    run.roster = d.roster.slice();
    run.epoch = d.epoch;
    run.slot = run.roster.indexOf(this.selfId);
    run.history = d.history.map((e) => e.slice());
    for (const id of left) run.peerHashes.delete(id);
    for (const id of joined) run.peerHashes.set(id, run.hash);
    const P = run.roster.length;
    const what = [joined.length ? `${joined.map((id) => p.nameOf(id)).join(', ')} joined` : '',
                  left.length ? `${left.map((id) => p.nameOf(id)).join(', ')} left` : ''].filter(Boolean).join('; ');
    const newLeader = run.roster[0] !== wasLeader ? ` ${p.nameOf(run.roster[0])} leads the run now.` : '';
    p.set({ run: this.runView(run), leader: run.roster[0], peerHashes: Object.fromEntries(run.peerHashes),
            replicas: { count: P, agree: true, agreeing: P, step: run.completed },
            message: `${what}: ${P} device(s) train from step ${d.from + 1}${left.length ? ' (that step recomputed without them)' : ''}.${newLeader}` });
    if (run.roster[0] !== wasLeader) p.announce();
    p.bus.emit('roster-changed', { epoch: run.epoch, from: d.from, roster: run.roster.slice(), joined, left, history: run.history.map((e) => e.slice()) });
  }

  // ---- membership: joining a running group --------------------------------------------------
  // An idle device linked to a training group asks to join (JOIN). The leader answers at its next
  // step boundary with SYNC (the run descriptor, roster, schedule, step, hash) and the state at
  // that boundary (STATE), then forwards the group's reduced gradient of every later step (FWD),
  // so the joiner catches up by Adam steps alone while the group keeps training. The joiner
  // reports its hash (SYNCED); the leader checks it against its own at that step (a wrong one is
  // re-synced) and, once the joiner is current, announces the next roster (ROSTER) with the
  // frames of the step in flight: the joiner contributes from the step after it.

  maybeJoin() {
    const p = this.peer, s = p.s;
    if (this.run || this.proposal || this.accepted || this.joining || !s.peerId || s.role === 'pending' || s.rejected) {
      this.joinWantSince = 0; clearTimeout(this.linkWaitTimer);       // not idle: a later wait starts afresh
      return;
    }
    if (this.testNoJoin || performance.now() < this.joinBackoffUntil) return;
    const others = s.peers.filter((q) => q.id !== s.peerId && /^training/.test(q.state || ''));
    const training = others.filter((q) => this.mesh.isReady(q.id)).map((q) => q.id);
    if (!training.length) { this.joinWantSince = 0; return; }
    // wait for links to the whole group first: the leader's SYNC names the roster, and a joiner not
    // linked to all of it must drop the state it is sent and ask again (a wasted transfer). Bounded:
    // a peer that never links delays each attempt by LINK_WAIT_MS at most, then the SYNC decides
    const now = performance.now();
    this.joinWantSince ||= now;
    if (training.length < others.length && now - this.joinWantSince < LINK_WAIT_MS) {
      clearTimeout(this.linkWaitTimer);
      this.linkWaitTimer = setTimeout(() => this.maybeJoin(), this.joinWantSince + LINK_WAIT_MS - now + 10);
      return;
    }
    this.joinWantSince = 0;
    this.askToJoin(training);
  }

  async askToJoin(ids) {
    const p = this.peer;
    const jn = { asked: ids, from: null, desc: null, timer: null };
    this.joining = jn;
    let dataId;
    try {
      // the compute first: its size bounds must be known before the leader's STATE can arrive
      p.maxStateBytes ||= maxStateBytes(await p.compute());
      dataId = await p.dataId();
    } catch (err) { this.abandonJoin(err.message, 30_000); return; }
    if (this.joining !== jn) return;
    for (const id of ids) this.mesh.sendJson(id, TYPES.JOIN, { protocol: this.mesh.version, dataId }).catch(() => {});
    // quiet until the leader answers: a run that was just ending everywhere never answers
    this.armJoinTimer(jn, 'no answer from the running group');
  }

  armJoinTimer(jn, why) {
    clearTimeout(jn.timer);
    jn.timer = setTimeout(() => { if (this.joining === jn) this.abandonJoin(`${why} within ${JOIN_WAIT_MS / 1000} s; asking again`, 500); }, JOIN_WAIT_MS);
  }

  // give up this attempt; maybeJoin tries again after `backoffMs`
  abandonJoin(why, backoffMs) {
    const jn = this.joining;
    if (!jn) return;
    clearTimeout(jn.timer);
    if (jn.planned) this.dispose(jn.planned.collective);
    jn.batches?.close?.();
    this.joining = null;
    this.mesh.setLimit(TYPES.STATE, null); this.mesh.setLimit(TYPES.FWD, null);
    this.joinBackoffUntil = performance.now() + backoffMs;
    if (jn.desc || jn.refused) {                  // the leader had answered: say what happened
      this.peer.note(`Joining the group's run: ${why}.`);
      if (!this.run) this.peer.set({ runState: 'idle', sync: null });
    }
    if (backoffMs < 60_000) setTimeout(() => this.maybeJoin(), backoffMs + 10);
  }

  // leader: a device asks to join
  onJoin(from, m) {
    const run = this.run, d = m.json;
    if (!run || run.ended || run.roster[0] !== this.selfId) return;      // only the leader answers
    const no = (reason) => this.mesh.sendJson(from, TYPES.REFUSE, { runId: 0, reason }).catch(() => {});
    if (run.roster.includes(from)) { this.mesh.drop(from, m, 'JOIN from a member of the run'); return; }
    if (d.protocol !== this.mesh.version) { no(`protocol v${d.protocol}, the run's v${this.mesh.version}`); return; }
    if (d.dataId !== run.desc.dataId) { no(`different training data: the run's is ${run.desc.dataId}, the device's ${String(d.dataId).slice(0, 120)}`); return; }
    if (run.completed + 3 >= run.cfg.steps) { no('the run is about to end'); return; }
    const j = run.joiners.get(from);
    if (!j && (run.joiners.size >= MAX_JOINERS || run.roster.length + run.joiners.size >= 64)) { no('the group is full'); return; }
    run.joiners.set(from, { stage: 'snapshot', verified: null, admitted: undefined, resyncs: j ? j.resyncs : 0, chain: Promise.resolve(), queued: 0 });
    this.peer.note(`${this.peer.nameOf(from)} asked to join: syncing it in at the next step boundary.`);
  }

  // leader, after step s completed: the state to new joiners, the step's G to those catching up
  forwardToJoiners(run, s, flat) {
    for (const [id, j] of run.joiners) {
      if (!this.mesh.isReady(id) || j.queued > 64) { run.joiners.delete(id); continue; }
      if (j.stage === 'snapshot') { this.sendSync(run, id, j); continue; }
      const payload = new Uint8Array(flat.buffer.slice(flat.byteOffset, flat.byteOffset + flat.byteLength));
      this.queueTo(j, () => this.mesh.send(id, { type: TYPES.FWD, runId: run.desc.runId, step: s, payload }));
      if (j.admitted !== undefined && s + 1 >= j.admitted) run.joiners.delete(id);     // it has all it needs
    }
  }

  queueTo(j, send) {
    j.queued++;
    j.chain = j.chain.then(send).catch(() => {}).finally(() => { j.queued--; });
  }

  sendSync(run, id, j) {
    const c = run.c, r = run.replica;
    j.stage = 'syncing';
    j.snap = run.completed;
    // encodeState copies the weights now: the state of this boundary, whatever the loop does next
    const body = new Uint8Array(encodeState(c.model.paramShapes(run.cfg), {
      config: run.desc.config, step: run.completed, adamT: r.adam.t, params: r.params, m: r.adam.m, v: r.adam.v,
      weightHash: run.hash, extra: run.extra }));
    const sync = { runId: run.desc.runId, desc: run.desc, roster: run.roster, epoch: run.epoch, history: run.history,
                   step: run.completed, hash: run.hash, bytes: body.length };
    this.queueTo(j, () => this.mesh.sendJson(id, TYPES.SYNC, sync, { runId: run.desc.runId }));
    this.queueTo(j, () => this.mesh.send(id, { type: TYPES.STATE, runId: run.desc.runId, step: run.completed, payload: body }));
  }

  onSynced(from, m) {
    const run = this.run, d = m.json;
    const j = run && run.joiners.get(from);
    if (!j || d.runId !== run.desc.runId || !Number.isInteger(d.step) || !isHash(d.hash)) { this.mesh.drop(from, m, 'SYNCED from no joiner of ours'); return; }
    const ours = run.hashLog.get(d.step);
    if (ours === undefined) return;                     // too old to check: a later report will be
    if (ours !== d.hash) {
      j.resyncs++;
      if (j.resyncs > MAX_RESYNCS) {
        run.joiners.delete(from);
        this.mesh.sendJson(from, TYPES.REFUSE, { runId: 0, reason: `its state hashed wrong ${j.resyncs} times after syncing` }).catch(() => {});
        return;
      }
      this.peer.note(`${this.peer.nameOf(from)} reported ${short(d.hash)} after step ${d.step}, the group has ${short(ours)}: refused, re-syncing it.`);
      j.stage = 'snapshot'; j.verified = null; j.admitted = undefined;
      return;
    }
    if (j.verified === null || d.step > j.verified) j.verified = d.step;
  }

  // leader, before its gradient of step s leaves: admit current joiners from step s + 1
  async admitJoiners(run, s) {
    if (run.recovery || run.nextRoster || run.stopAfter !== null || s + 2 >= run.cfg.steps) return;
    const ready = [...run.joiners].filter(([id, j]) => j.stage === 'syncing' && j.verified !== null && j.verified >= s - 1 && this.mesh.isReady(id))
      .map(([id]) => id).slice(0, 64 - run.roster.length);
    if (!ready.length) return;
    const roster = run.roster.concat(ready);
    const msg = { runId: run.desc.runId, epoch: run.epoch + 1, from: s + 1, roster, joined: ready, left: [],
                  history: scheduleWith(run.history, s + 1, roster.length), reason: 'joined' };
    for (const id of ready) run.joiners.get(id).admitted = s + 1;
    // sent (and awaited) before our GRAD of step s: every member has it before it can finish s
    await Promise.all(roster.filter((id) => id !== this.selfId).map((id) => this.mesh.sendJson(id, TYPES.ROSTER, msg, { runId: run.desc.runId, slot: run.slot }).catch(() => {})));
    if (run.recovery || run.ended) return;
    run.nextRoster = { ...msg, collective: this.newCollective(run.desc.runId, msg.epoch, roster, msg.from, run.cfg, run.c, run.collective.deadlineMs) };
  }

  // joiner: the leader's answer
  async onSync(from, m) {
    const jn = this.joining, d = m.json, p = this.peer;
    if (!jn || !jn.asked.includes(from)) { this.mesh.drop(from, m, 'SYNC without a JOIN'); return; }
    if (jn.from && jn.from !== from) { this.mesh.drop(from, m, 'SYNC from a second leader'); return; }
    // the STATE's first chunks may arrive while this handler awaits below: admit the run's STATE
    // and FWD now at the largest allowed sizes, then at the run's exact sizes once SYNC checks out
    const runId = d.runId, most = this.peer.maxStateBytes || 0;
    if (most) {
      this.mesh.setLimit(TYPES.STATE, (h) => (h.runId === runId ? most : 'STATE for another run'));
      this.mesh.setLimit(TYPES.FWD, (h) => (h.runId === runId ? Math.floor(most / 3) : 'FWD for another run'));
    }
    let c, cfg;
    try {
      c = await p.compute();
      const desc = d.desc;
      if (!desc || typeof desc !== 'object' || desc.runId !== d.runId || !Number.isInteger(d.runId) || d.runId <= 0 || d.runId > MAX_RUN_ID) throw new Error('bad run id');
      if (desc.protocol !== this.mesh.version) throw new Error(`protocol v${desc.protocol}`);
      cfg = c.config.makeConfig(desc.config);
      if (desc.dataId !== await p.dataId()) throw new Error('different training data');
      if (!Array.isArray(d.roster) || d.roster[0] !== from || d.roster.includes(this.selfId) || d.roster.length > 64) throw new Error('bad roster');
      if (!Number.isInteger(d.step) || d.step < 0 || d.step >= cfg.steps || !isHash(d.hash) || !Number.isInteger(d.epoch) || d.epoch < 0) throw new Error('bad position');
      if (!validHistory(d.history) || !isHash(desc.initHash) || typeof desc.dataId !== 'string') throw new Error('bad descriptor');
    } catch (err) {
      this.mesh.drop(from, m, `SYNC refused: ${err.message}`);
      this.abandonJoin(`the leader's SYNC was refused (${err.message})`, 30_000);
      return;
    }
    if (this.joining !== jn) return;
    const unlinked = d.roster.filter((id) => !this.mesh.isReady(id));
    if (unlinked.length) { this.abandonJoin(`not linked to ${unlinked.map((id) => p.nameOf(id)).join(', ')} yet`, 2000); return; }
    if (jn.planned) this.dispose(jn.planned.collective);
    Object.assign(jn, { from, desc: d.desc, cfg, c, roster: d.roster, epoch: d.epoch, history: d.history, snap: d.step, hash: d.hash,
                        replica: null, trainer: null, completed: null, fwd: new Map(), planned: null, draining: null });
    const shapes = c.model.paramShapes(cfg);
    const N = shapes.reduce((n, [, sh]) => n + sh.reduce((x, y) => x * y, 1), 0);
    this.mesh.setLimit(TYPES.STATE, (h) => (h.runId === d.runId ? 8 * 3 * N + 64 * 1024 : 'STATE for another run'));
    this.mesh.setLimit(TYPES.FWD, (h) => (h.runId === d.runId ? 8 * N : 'FWD for another run'));
    this.armJoinTimer(jn, 'the state transfer stalled');
    p.set({ runState: 'syncing', sync: { pct: 0, step: d.step }, message: `syncing (0 %): the state at step ${d.step} from ${p.nameOf(from)}…` });
  }

  onProgress(e) {
    const jn = this.joining;
    if (!jn || e.peer !== jn.from || e.type !== TYPES.STATE || jn.replica) return;
    this.armJoinTimer(jn, 'the state transfer stalled');
    const pct = Math.floor((100 * e.bytes) / e.length);
    this.peer.set({ sync: { pct, step: jn.snap }, message: `syncing (${pct} %): the state at step ${jn.snap} from ${this.peer.nameOf(jn.from)}…` });
  }

  // a state that failed its digest in transit: ask again now rather than wait for the timer
  onDropped(e) {
    const jn = this.joining;
    if (jn && e.peer === jn.from && e.type === TYPES.STATE && !jn.replica) this.abandonJoin(`the state transfer failed (${e.reason})`, 200);
  }

  onJoinState(from, m) {
    const jn = this.joining;
    if (!jn.desc || m.runId !== jn.desc.runId || m.step !== jn.snap || jn.replica) { this.mesh.drop(from, m, 'STATE for no sync of ours'); return; }
    try {
      const st = decodeState(m.payload.buffer.slice(m.payload.byteOffset, m.payload.byteOffset + m.payload.byteLength), { makeConfig: jn.c.config.makeConfig, paramShapes: jn.c.model.paramShapes });
      if (!st.m || !st.v) throw new Error('the state has no Adam moments');
      if (JSON.stringify(jn.c.config.configToDict(jn.c.config.makeConfig(st.config))) !== JSON.stringify(jn.c.config.configToDict(jn.cfg))) throw new Error('its settings differ from the run\'s');
      if (st.step !== jn.snap || st.adamT !== st.step) throw new Error(`it is at step ${st.step}, the leader said ${jn.snap}`);
      const hash = jn.c.hashing.weightHash(st.params);
      if (hash !== jn.hash) throw new Error(`its weights hash to ${short(hash)}, the leader said ${short(jn.hash)}`);
      jn.replica = cloneReplica({ params: st.params, adam: { t: st.adamT, m: st.m, v: st.v } });
    } catch (err) {
      this.abandonJoin(`the state was refused: ${err.message}`, 500);
      return;
    }
    if (this.testCorruptSync) {              // test hook: a joiner whose state goes wrong after its checks
      this.testCorruptSync = false;
      const w = jn.replica.params['wte.weight'];
      new BigUint64Array(w.buffer, w.byteOffset, 1)[0] ^= 1n;
    }
    jn.batches = new HttpBatches(jn.cfg, { dataId: jn.desc.dataId });
    jn.trainer = new Trainer(jn.cfg, jn.replica, jn.batches, this.peer.backend());
    jn.completed = jn.snap;
    clearTimeout(jn.timer);
    this.peer.set({ sync: { pct: 100, step: jn.snap }, message: `Synced the state at step ${jn.snap}; catching up with the group…` });
    this.drainFwd(jn);
  }

  onFwd(from, m) {
    const jn = this.joining;
    if (!jn || from !== jn.from || !jn.desc || m.runId !== jn.desc.runId || m.step < jn.snap || jn.fwd.size > 256) { this.mesh.drop(from, m, 'FWD for no sync of ours'); return; }
    const u8 = m.payload;
    jn.fwd.set(m.step, u8.byteOffset % 8 === 0 ? new Float64Array(u8.buffer, u8.byteOffset, u8.length / 8) : new Float64Array(u8.slice().buffer));
    this.drainFwd(jn);
  }

  // apply the forwarded gradients in step order (Adam only: no forward or backward pass)
  drainFwd(jn) {
    if (jn.draining || !jn.trainer) return;
    jn.draining = (async () => {
      const shapes = jn.c.model.paramShapes(jn.cfg);
      while (this.joining === jn && jn.fwd.has(jn.completed)) {
        const G = jn.fwd.get(jn.completed);
        jn.fwd.delete(jn.completed);
        const applied = await jn.trainer.apply(unflatten(G, shapes));
        if (this.joining !== jn) return;
        jn.completed += 1;
        jn.hashNow = applied.hash;
        this.mesh.sendJson(jn.from, TYPES.SYNCED, { runId: jn.desc.runId, step: jn.completed, hash: applied.hash }).catch(() => {});
        this.peer.set({ step: jn.completed, hash: applied.hash, message: `Synced; caught up to step ${jn.completed}…` });
      }
      if (this.joining === jn && jn.planned && jn.completed === jn.planned.from) this.enterRun(jn);
    })().finally(() => { jn.draining = null; if (this.joining === jn && jn.fwd.has(jn.completed)) this.drainFwd(jn); });
  }

  onJoinRoster(from, m) {
    const jn = this.joining, d = m.json;
    if (from !== jn.from && !(jn.roster || []).includes(from)) { this.mesh.drop(from, m, 'ROSTER from outside the run'); return; }
    if (!Array.isArray(d.roster) || !d.roster.includes(this.selfId)) { this.abandonJoin('the group\'s roster changed while this device synced', 500); return; }
    const why = checkRoster(d, { roster: jn.roster, epoch: jn.epoch, completed: d.from, selfId: this.selfId }, from);
    if (why || !validHistory(d.history, d.from, d.roster.length) || !Number.isInteger(d.from) || d.from < jn.snap) {
      this.mesh.drop(from, m, `ROSTER refused: ${why || 'bad schedule'}`);
      return;
    }
    jn.planned = { ...d, collective: this.newCollective(jn.desc.runId, d.epoch, d.roster, d.from, jn.cfg, jn.c) };
    clearTimeout(jn.timer);
    if (jn.completed === d.from) this.enterRun(jn);
  }

  enterRun(jn) {
    if (this.joining !== jn) return;
    this.joining = null;
    clearTimeout(jn.timer);
    this.mesh.setLimit(TYPES.STATE, null); this.mesh.setLimit(TYPES.FWD, null);
    const d = jn.planned;
    this.begin(jn.desc, jn.replica, jn.cfg, jn.c, { collective: d.collective, roster: d.roster, epoch: d.epoch, history: d.history,
      completed: d.from, hash: jn.hashNow || jn.hash, trainer: jn.trainer, batches: jn.batches, joined: true });
  }

  // ---- one step of undo ---------------------------------------------------------------------
  saveUndo(run) {
    const r = run.replica;
    if (!run.undo) run.undo = { params: cloneParams(r.params), m: cloneParams(r.adam.m), v: cloneParams(r.adam.v), t: r.adam.t, hash: run.hash, step: run.completed };
    else {
      for (const k of Object.keys(r.params)) { run.undo.params[k].set(r.params[k]); run.undo.m[k].set(r.adam.m[k]); run.undo.v[k].set(r.adam.v[k]); }
      run.undo.t = r.adam.t; run.undo.hash = run.hash; run.undo.step = run.completed;
    }
  }

  restoreUndo(run) {
    const u = run.undo, r = run.replica;
    if (!u || u.step !== run.completed - 1) return false;
    for (const k of Object.keys(r.params)) { r.params[k].set(u.params[k]); r.adam.m[k].set(u.m[k]); r.adam.v[k].set(u.v[k]); }
    r.adam.t = u.t;
    run.hashLog.delete(run.completed);
    run.completed = u.step; run.hash = u.hash;
    run.lastSent = Math.min(run.lastSent, u.step);
    this.peer.models.step = u.step;
    this.peer.set({ step: u.step, hash: u.hash, curve: this.peer.s.curve.filter(([st]) => st <= u.step) });
    return true;
  }

  end(run, runState, message, error) {
    if (run.ended) return;
    run.ended = true;
    run.collective.fail(new ExchangeError('the run ended'));
    run.sent.bytes += run.collective.bytesSent; run.sent.waitMs += run.collective.waitMs;
    this.dispose(run.collective);
    if (run.nextRoster) this.dispose(run.nextRoster.collective);
    if (run.recovery) this.wakeParked(run);
    if (this.run === run) this.run = null;
    this.lastRun = run;
    this.joinBackoffUntil = performance.now() + 3000;    // peers still finishing this run look 'training' a moment
    this.peer.models.step = run.completed;
    this.peer.models.runEnded(run.replica, runState, error);
    this.peer.set({ running: false, runState, message, error, step: run.completed, hash: run.hash });
    this.peer.announce();
    this.peer.bus.emit('run-ended', { state: runState, step: run.completed, error, hash: run.hash, history: run.history.map((e) => e.slice()) });
    this.peer.storedRun?.afterRun(run, { state: runState, error });   // stored_run.js
  }

  // the page is going away: tell the run's peers now (they would otherwise wait for a deadline)
  goodbye() {
    const run = this.run;
    if (!run) return;
    this.tellAll(run, TYPES.LEAVE, { runId: run.desc.runId, reason: `${this.peer.nameOf(this.peer.s.peerId)} closed its page` });
  }

  // bytes sent and time waited over the whole run (every epoch's collective)
  stats(run) {
    const c = run.collective;
    return { bytesSent: run.sent.bytes + (run.ended ? 0 : c.bytesSent), waitMs: run.sent.waitMs + (run.ended ? 0 : c.waitMs) };
  }

  // test hook: flip the lowest bit of one weight of this replica (the sync guard must catch it)
  corruptWeights() {
    const run = this.run;
    if (!run) throw new Error('no run');
    const w = run.replica.params['wte.weight'];
    const bits = new BigUint64Array(w.buffer, w.byteOffset, 1);
    bits[0] ^= 1n;
    run.hash = run.c.hashing.weightHash(run.replica.params);
    return run.hash;
  }
}

function freshReplica(c, cfg) {
  const params = c.model.initParams(cfg);
  return new Replica(cloneParams(params), c.optim.adamInit(params));
}

export { NO_SLOT };
