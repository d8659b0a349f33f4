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
import { MeshCollective, ExchangeError } from './collective.js';
import { Trainer, Replica, cloneParams, checkLoss } from './train.js';
import { HttpBatches } from './batch_source.js';
import { StepArena } from './arena.js';
import { encodeState, decodeState } from './state_codec.js';

export const LINK_WAIT_MS = 8_000;       // Start waits this long for links still connecting
export const ACCEPT_WAIT_MS = 15_000;    // the leader's bound on the members' answers
export const GO_WAIT_MS = 20_000;        // a member's bound on the leader's GO
export const FIN_WAIT_MS = 10_000;       // bound on the final hashes
export const DEADLINE_MS = 7_000;        // no frame from a needed peer for this long: it is gone
export const DEADLINE_STEPS = 5;         // ... or for this many of the run's recent step times, if longer
const CHUNK_MS = 25;                     // train at most this long before yielding to the page
const RATE_WINDOW = 20;                  // steps in the tokens/s window
const MAX_CURVE = 2000;                  // loss points kept for the plot (older ones thinned)

const yieldToPage = () => new Promise((resolve) => setTimeout(resolve, 0));
const short = (h) => (h ? h.slice(0, 12) : '(none)');

function newRunId() {
  const a = new Uint32Array(1);
  do crypto.getRandomValues(a); while (a[0] === 0);
  return a[0];
}

export class RunController {
  // peer: the Peer (state, bus, model store); mesh: the Mesh; compute: {config, model, hashing, optim}
  constructor(peer, mesh) {
    this.peer = peer;
    this.mesh = mesh;
    this.proposal = null;     // leader: {runId, desc, answers: Map, resolve}
    this.accepted = null;     // member: {desc, from, timer, state}
    this.run = null;          // the active run
    mesh.on(TYPES.RUN, (from, m) => this.onRun(from, m));
    mesh.on(TYPES.STATE, (from, m) => this.onState(from, m));
    mesh.on(TYPES.ACCEPT, (from, m) => this.onAnswer(from, m, true));
    mesh.on(TYPES.REFUSE, (from, m) => this.onAnswer(from, m, false));
    mesh.on(TYPES.GO, (from, m) => this.onGo(from, m));
    mesh.on(TYPES.STOP, (from, m) => this.onStop(from, m));
    mesh.on(TYPES.FIN, (from, m) => this.onFin(from, m));
    mesh.on('link', ({ peer: id, state, reason }) => { if (state === 'closed') this.peerGone(id, reason || 'its link closed'); });
    // gradient frames are accepted only for the run being prepared or trained, at its sizes
    this.framesFor = null;
    for (const type of [TYPES.GRAD, TYPES.REDUCED]) {
      mesh.setLimit(type, (h) => {
        const c = this.framesFor;
        return c && h.runId === c.runId ? c.maxPayload(type) : `a gradient frame of run ${h.runId}, not a run of this device`;
      });
    }
  }

  get busy() { return Boolean(this.run || this.proposal || this.accepted); }

  // ---- leader -------------------------------------------------------------------------------
  async start(config) {
    const p = this.peer, s = p.s;
    if (s.role === 'pending') throw new Error('waiting for the room host to accept this device: it cannot start a run yet');
    if (s.rejected) throw new Error('the room host declined this device');
    if (this.run) throw new Error('a run is already going: stop it first');
    if (this.proposal || this.accepted) throw new Error('a run is being set up in this group: wait a moment');
    const other = s.peers.find((q) => q.id !== s.peerId && /^training/.test(q.state || ''));
    if (other) throw new Error(`a run is already going in this group (${other.name} is training): one run per group`);
    const c = await p.compute();
    await p.pathReady;
    const dataId = await p.dataId();
    const m = p.models;
    const resume = m.resumable && m.model && m.step < m.model.cfg.steps ? m.model : null;
    const cfg = resume ? resume.cfg : c.config.makeConfig(config);
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
    const t0 = performance.now();
    while (!ids.every((id) => this.mesh.isReady(id)) && performance.now() - t0 < LINK_WAIT_MS) {
      await new Promise((r) => setTimeout(r, 100));
    }
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
    const acc = this.accepted;
    if (!acc || acc.from !== from || m.runId !== acc.desc.runId || acc.replica) { this.mesh.drop(from, m, 'STATE for no accepted run'); return; }
    this.mesh.setLimit(TYPES.STATE, null);
    try {
      const st = decodeState(m.payload.buffer.slice(m.payload.byteOffset, m.payload.byteOffset + m.payload.byteLength), { makeConfig: acc.c.config.makeConfig, paramShapes: acc.c.model.paramShapes });
      if (!st.m || !st.v) throw new Error('the state has no Adam moments');
      if (JSON.stringify(acc.c.config.configToDict(acc.c.config.makeConfig(st.config))) !== JSON.stringify(acc.desc.config)) throw new Error('the state\'s settings differ from the run\'s');
      if (st.step !== acc.desc.startStep || st.adamT !== st.step) throw new Error(`the state is at step ${st.step}, the run starts at ${acc.desc.startStep}`);
      acc.replica = new Replica(cloneParams(st.params), { t: st.adamT, m: cloneParams(st.m), v: cloneParams(st.v) });
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
  // The run's collective exists before anyone may send a gradient (the leader: before RUN; a
  // member: when it accepts), so a fast peer's first frames are kept, not dropped.
  prepare(desc, cfg, c) {
    const collective = new MeshCollective(this.mesh, { runId: desc.runId, roster: desc.roster, selfId: this.peer.s.peerId,
      shapes: c.model.paramShapes(cfg), startStep: desc.startStep, deadlineMs: DEADLINE_MS });
    this.framesFor = collective;
    return collective;
  }

  dispose(collective) {
    if (!collective) return;
    collective.close();
    if (this.framesFor === collective) this.framesFor = null;
  }

  begin(desc, replica, cfg, c, { leader, resumed, collective }) {
    const p = this.peer, s = p.s;
    const batches = new HttpBatches(cfg, { dataId: desc.dataId });
    const backend = p.backend();
    const run = {
      desc, cfg, c, collective, batches, leader, slot: desc.roster.indexOf(s.peerId), roster: desc.roster,
      trainer: new Trainer(cfg, replica, batches, backend), replica, arena: new StepArena(),
      completed: desc.startStep, lastSent: desc.startStep - 1, stopAfter: null, stopReason: '',
      hash: desc.initHash, peerHashes: new Map(desc.roster.map((id) => [id, desc.initHash])),
      fins: new Map(), undo: null, ended: false, extra: desc.extra && typeof desc.extra === 'object' ? desc.extra : { data: desc.dataId.startsWith('builtin') ? 'builtin' : 'fineweb-edu', data_id: desc.dataId },
    };
    this.run = run;
    p.models.adopt(cfg, replica, desc.startStep, run.extra);
    const others = desc.roster.length - 1;
    p.stepTimes = [];
    p.set({ running: true, runState: 'training', leader: desc.leader, config: cfg, step: desc.startStep,
            totalSteps: cfg.steps, loss: null, hash: desc.initHash, curve: [], tokensPerS: null,
            replicas: { count: desc.roster.length, agree: true, step: desc.startStep },
            run: { id: desc.runId, roster: desc.roster.slice(), topology: collective.topology, leader: desc.leader },
            peerHashes: Object.fromEntries(run.peerHashes), error: '',
            message: (resumed ? `Resuming from step ${desc.startStep}` : 'Training')
              + (others ? ` with ${others} other device(s) (${collective.topology === 'allgather' ? 'all-gather' : 'reduce-scatter + all-gather'}).` : ' on this device alone.') });
    p.announce();
    p.bus.emit('run-started', { config: { ...cfg }, roster: desc.roster.slice(), runId: desc.runId, leader: desc.leader });
    this.loop(run).catch((err) => {
      console.warn('daisy: the run failed:', err);
      this.end(run, 'failed', `The run stopped: ${err.message || err}`, err.message || String(err));
    });
  }

  async loop(run) {
    const p = this.peer, { cfg } = run;
    const tokensPerStep = cfg.batch * cfg.seq_len * run.roster.length;
    let chunkStart = performance.now();
    const gpu = p.gpu;
    for (let s = run.desc.startStep; s < cfg.steps; s++) {
      if (run.ended) return;
      if (run.stopAfter !== null && s >= run.stopAfter) break;
      run.arena.reset();
      // a GPU result that failed its audit: the engine is on the CPU by then; redo the local step
      const local = gpu ? await gpu.withGpuFallback(run.trainer.backend.engine, () => run.trainer.localStep(s, run.slot, run.arena))
        : await run.trainer.localStep(s, run.slot, run.arena);
      if (run.ended) return;
      if (run.stopAfter !== null && s >= run.stopAfter) break;
      run.lastSent = s;
      let out;
      try {
        out = await run.collective.exchange(s, run.roster, run.slot, local.loss, local.grads, run.hash);
      } catch (err) {
        if (!(err instanceof ExchangeError)) throw err;
        if (run.stopAfter !== null && s >= run.stopAfter) break;      // stopped by a peer mid-exchange
        await this.lost(run, err);
        return;
      }
      // the sync guard: every peer's hash after step s (0-based s-1 done) must equal ours
      const bad = out.hashes.map((h, slot) => [run.roster[slot], h]).filter(([, h]) => h !== run.hash);
      for (const [slot, h] of out.hashes.entries()) run.peerHashes.set(run.roster[slot], h);
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
      run.peerHashes.set(p.s.peerId, applied.hash);
      this.report(run, s + 1, out.loss, tokensPerStep);
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
    p.bus.emit('step', { step, loss, hash: run.hash });
  }

  // after the last step: FIN with our hash to everyone; every final hash must agree
  async finishRun(run) {
    const p = this.peer;
    const others = run.roster.filter((id) => id !== p.s.peerId);
    run.fins.set(p.s.peerId, run.hash);
    await Promise.all(others.map((id) => this.mesh.sendJson(id, TYPES.FIN, { runId: run.desc.runId, step: run.completed, hash: run.hash }, { runId: run.desc.runId, slot: run.slot }).catch(() => {})));
    const t0 = performance.now();
    while (others.some((id) => !run.fins.has(id)) && performance.now() - t0 < FIN_WAIT_MS && !run.ended) {
      await new Promise((r) => setTimeout(r, 50));
    }
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
      return false;
    }
    const stopAfter = run.lastSent + 1;
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
  }

  // a JSON message to every other peer of the run (best effort: a closed link is a departure)
  tellAll(run, type, obj) {
    for (const id of run.roster) {
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
    if (d.stopAfter < run.completed) this.restoreUndo(run);        // a survivor behind us: meet it
    run.stopReason = reason || `stopped by ${this.peer.nameOf(from)}`;
    this.setStop(run, d.stopAfter);
  }

  // a roster peer is gone (link closed, goodbye): every survivor stops at the last step all of
  // them completed (ours, or one less: then the undo copy restores it)
  peerGone(id, why) {
    if (this.proposal && this.proposal.desc.roster.includes(id)) this.proposal.reject(new Error(`${this.peer.nameOf(id)} left (${why})`));
    if (this.accepted && this.accepted.from === id) { this.dropAccepted(); this.peer.note(`The run's leader ${this.peer.nameOf(id)} left before it started.`); }
    const run = this.run;
    if (!run || run.ended || !run.roster.includes(id) || id === this.peer.s.peerId) return;
    run.collective.fail(new ExchangeError(`peer ${this.peer.nameOf(id)} left at step ${run.completed + 1} (${why})`, { peer: id, step: run.completed }));
  }

  async lost(run, err) {
    const p = this.peer;
    const survivors = run.roster.filter((id) => id !== p.s.peerId && id !== err.peer && this.mesh.isReady(id));
    // tell the survivors where we are: whoever is one step ahead rolls back to meet us
    const stopAfter = run.completed;
    run.stopReason = err.message;
    run.stopAfter = run.stopAfter === null ? stopAfter : Math.min(run.stopAfter, stopAfter);
    await Promise.all(survivors.map((id) => this.mesh.sendJson(id, TYPES.STOP, { runId: run.desc.runId, stopAfter, reason: err.message }, { runId: run.desc.runId, slot: run.slot }).catch(() => {})));
    // a survivor behind us may still be telling us so: give its STOP a moment to arrive
    await new Promise((r) => setTimeout(r, 500));
    if (run.stopAfter < run.completed) this.restoreUndo(run);
    this.end(run, 'stopped', `${err.message}. The run stopped; this device keeps the state after step ${run.completed} (generate, download and resume still work).`, err.message);
  }

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
    run.completed = u.step; run.hash = u.hash;
    this.peer.models.step = u.step;
    this.peer.set({ step: u.step, hash: u.hash });
    return true;
  }

  end(run, runState, message, error) {
    if (run.ended) return;
    run.ended = true;
    run.collective.fail(new ExchangeError('the run ended'));
    this.dispose(run.collective);
    if (this.run === run) this.run = null;
    this.lastRun = run;
    this.peer.models.step = run.completed;
    this.peer.set({ running: false, runState, message, error, step: run.completed, hash: run.hash });
    this.peer.announce();
    this.peer.bus.emit('run-ended', { state: runState, step: run.completed, error, hash: run.hash });
  }

  // the page is going away: tell the run's peers now (they would otherwise wait for a deadline)
  goodbye() {
    const run = this.run;
    if (!run) return;
    this.tellAll(run, TYPES.STOP, { runId: run.desc.runId, stopAfter: run.completed, reason: `${this.peer.nameOf(this.peer.s.peerId)} closed its page` });
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

function cloneReplica(r) {
  return new Replica(cloneParams(r.params), { t: r.adam.t, m: cloneParams(r.adam.m), v: cloneParams(r.adam.v) });
}

export { NO_SLOT };
