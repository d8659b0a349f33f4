// N run controllers (frontend_js/run/controller.js) in one Node process over the in-memory
// transport (memory_links.mjs), each with a real backend (the JS mirror) and tiny settings, so a
// group trains real steps in milliseconds. Not a test file itself (node --test runs *.test.mjs).
//
//   const g = new Group({ seed: 7 });
//   const [a, b, c] = g.add(3);            // nodes, linked to every node present
//   await a.ctl.start(SETTINGS);           // a leads
//   await g.until(() => a.completed >= 5, 'five steps');
//   g.crash(c); g.leave(b); g.cut(a, b); g.freeze(b, 9); g.serverDown = true;
//   a.ctl.stop(); await g.ended([a, b]);
// Node: {id, ctl, mesh, steps (Map step -> hash: the last computation of each), events, notes,
// state (the panel's), histories (each roster change's history)}.
import { MemoryNet } from './memory_links.mjs';
import { Mesh } from '../../frontend_js/mesh/mesh.js';
import { TYPES, jsonPayload } from '../../frontend_js/mesh/frames.js';
import { RunController } from '../../frontend_js/run/controller.js';
import { ExchangeError } from '../../frontend_js/mesh/mesh_collective.js';
import { ModelStore } from '../../frontend_js/peer/model_store.js';
import { StreamBatches } from '../../frontend_js/batch_source.js';
import { Group as RefGroup, Trainer, peersAt, leftAt } from '../../frontend_js/train.js';
import { makeConfig } from '../../frontend_js/config.js';
import { stream } from './group_runs.mjs';
import { bestBackend } from '../../frontend_js/engines.js';
import { quietMeshLogs } from './helpers.mjs';

// the fastest backend whose gates pass here (wasm-simd): every backend gives the same bits
export const BACKEND = await bestBackend();

export const SETTINGS = { width: 16, seq_len: 16, batch: 2, layers: 1, heads: 4, steps: 2000 };   // tests stop it
export const DATA_ID = 'builtin:test';
// timings short enough for tests, long enough for a loaded 2-core machine's event loop
export const TIMING = { linkWaitMs: 300, acceptWaitMs: 10000, goWaitMs: 10000, finWaitMs: 1500, deadlineMs: 3000,
  deadlineSteps: 5, confirmWaitMs: 1000, joinWaitMs: 3000, syncDeadlineMs: 5000, resyncIntervalMs: 200, firstAckMs: 1500, ackMs: 1000, chunkMs: 25 };

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// the mesh logs every drop with console.info; tests read mesh.drops instead
quietMeshLogs();
const consoleWarn = console.warn;
console.warn = (...args) => { if (!(typeof args[0] === 'string' && args[0].startsWith('daisy: a run handler failed'))) consoleWarn(...args); };

export class Node {
  constructor(group, id, joinedAt, { timing, faults }) {
    this.group = group; this.id = id; this.joinedAt = joinedAt;
    this.alive = true;
    this.crashed = false;        // crashed or closed: its JS stopped
    this.state = { runState: 'idle', notes: [] };
    this.steps = new Map();
    this.events = [];
    this.notes = [];
    this.frozenFrom = Infinity;  // its steps from this 0-based step on never finish computing (Group.freeze)
    this.mesh = new Mesh({ selfId: id });
    group.net.add(this.mesh);
    const node = this;
    this.host = {
      get selfId() { return id; },
      mesh: this.mesh,
      members: () => group.members(),
      canRun: () => null,
      nameOf: (x) => x,
      show: (patch) => Object.assign(node.state, patch),
      note: (text) => { node.notes.push(text); node.state.message = text; },
      emit: (event, payload) => node.onEvent(event, payload),
      announce() {},
      ready: async () => {},
      prepare: async () => {},
      backend: () => BACKEND,
      trainer: (cfg, replica, batches) => node.freezable(new Trainer(cfg, replica, batches, BACKEND)),
      gpu: null,
      dataId: async () => DATA_ID,
      batches: (cfg) => new StreamBatches(stream, cfg),
      models: null,
      stored: null,
    };
    this.host.models = new ModelStore({ runs: null });
    this.ctl = new RunController(this.host, { timing: timing || TIMING, faults });
  }

  // its run's steps from 0-based step `s` on never finish computing (freeze): a page that hangs
  freezable(trainer) {
    const localStep = trainer.localStep.bind(trainer);
    trainer.localStep = async (s, ...rest) => {
      if (s >= this.frozenFrom) await new Promise(() => {});
      return localStep(s, ...rest);
    };
    return trainer;
  }

  onEvent(event, payload) {
    this.events.push([event, payload]);
    if (event === 'step') this.steps.set(payload.step, payload.hash);
    if (event === 'step-undone') for (const s of [...this.steps.keys()]) if (s > payload.step) this.steps.delete(s);
  }

  get run() { return this.ctl.run || this.ctl.lastRun; }
  get completed() { return this.run ? this.run.completed : 0; }
  get ended() { return this.events.find(([e]) => e === 'run-ended')?.[1] || null; }
  get history() { return this.run ? this.run.history : null; }

  // a raw JSON message from this node to `to` (a forged one, when the test says so)
  sendJson(to, type, obj, fields = {}) { return this.mesh.sendJson(to, type, obj, fields).catch(() => {}); }
}

export class Group {
  // latencyMs / bytesPerMs: every link's one-way delay and rate (memory_links.mjs; benches)
  constructor({ seed = 1, timing = TIMING, dup = 0.02, delay = 0.05, latencyMs = 0, bytesPerMs = Infinity } = {}) {
    this.net = new MemoryNet({ seed, dup, delay, maxFrame: 16 * 1024, latencyMs, bytesPerMs });
    this.timing = timing;
    this.nodes = [];
    this.serverDown = false;     // the signaling server is away: no word on departures
    this.clock = 0;
  }

  members() {
    return this.nodes.filter((n) => n.alive).map((n) => ({ id: n.id, name: n.id, role: 'member', joinedAt: n.joinedAt,
      state: n.ctl.phase === 'running' ? 'training' : n.ctl.phase }));
  }

  add(count = 1, { faults = {} } = {}) {
    const made = [];
    for (let i = 0; i < count; i++) {
      const id = `p${this.nodes.length}`;
      const node = new Node(this, id, ++this.clock, { timing: this.timing, faults });
      for (const other of this.nodes) if (other.alive) this.net.connect(other.id, id);
      this.nodes.push(node);
      made.push(node);
    }
    return made;
  }

  async linked() { await this.net.ready(); for (const n of this.nodes) if (n.alive) n.ctl.maybeJoin(); }

  // the server's word that `node` left (peer-left), unless it is down
  tellServerGone(node) {
    if (this.serverDown) return;
    for (const n of this.nodes) if (n.alive && n !== node) n.ctl.serverSaysGone(node.id);
  }

  // no goodbye: every link and the server socket end at once; the node's JS stops
  crash(node) {
    node.alive = false;
    node.crashed = true;
    const run = node.ctl.run;
    if (run) { run.ended = true; run.collective.fail(new ExchangeError('crashed')); }
    node.mesh.receive = () => {};
    for (const id of [...node.mesh.links.keys()]) node.mesh.removeLink(id, 'crashed');
    this.tellServerGone(node);
  }

  // the page closes: goodbye first, then the same
  leave(node) {
    node.crashed = true;         // its page is closing: its last steps are no one's
    node.ctl.goodbye();
    setTimeout(() => this.crash(node), 5);
  }

  // the node computes no step from 0-based step `s` on (its links and frames go on): a test holds a
  // page still, e.g. until the others have completed the step before, then makes it leave
  freeze(node, s) { node.frozenFrom = s; }

  // the link between a and b ends; both keep every other link (a partial partition)
  cut(a, b) { a.mesh.removeLink(b.id, 'cut'); }

  async until(cond, what, ms = 30_000) {
    const t0 = Date.now();
    while (!cond()) {
      if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}: ${this.describe()}`);
      await sleep(2);
    }
  }

  async ended(nodes, ms = 30_000) {
    await this.until(() => nodes.every((n) => n.ended), `${nodes.map((n) => n.id).join(', ')} to end`, ms);
    return nodes.map((n) => n.ended);
  }

  describe() {
    return this.nodes.map((n) => `${n.id}${n.alive ? '' : '(dead)'} ${n.ctl.phase} step ${n.ended?.step ?? n.completed} ${n.ended ? `ended ${n.ended.state}: ${n.ended.message}` : n.state.message || ''}`
      + (n.notes.length ? ` [notes: ${n.notes.slice(-4).join(' / ')}]` : '')
      + (n.mesh.drops.count ? ` [${n.mesh.drops.count} frames dropped, the last: ${n.mesh.drops.recent.slice(-3).join(' / ')}]` : '')).join(' | ');
  }

  // stop timers of everything still running (end of a test)
  async close() {
    for (const n of this.nodes) {
      if (n.ctl.phase === 'running') n.ctl.run.ended = true;
      if (n.ctl.phase === 'running') n.ctl.run.collective.fail(new ExchangeError('test over'));
      n.alive = false;
      n.ctl.faults.noJoin = true;
    }
    await sleep(5);
  }
}

// The JS Group (frontend_js/train.js, itself tested equal to python -m daisy.train) run on a P
// schedule: hashes[s - 1] = the hash after step s. Cached per schedule. settings: what SETTINGS
// lacks (local_steps, steps); a schedule entry of local steps names the slots that left.
const refCache = new Map();
export async function referenceHashes(history, steps, settings = {}) {
  const key = JSON.stringify([history, settings]);
  let ref = refCache.get(key);
  if (!ref) { ref = { hashes: [], group: null }; refCache.set(key, ref); }
  if (!ref.group) ref.group = new RefGroup(makeConfig({ ...SETTINGS, ...settings }), peersAt(history, 0), stream, BACKEND);
  while (ref.hashes.length < steps) {
    const s = ref.hashes.length;
    ref.group.resize(peersAt(history, s), leftAt(history, s));
    ref.hashes.push((await ref.group.step()).hashes[0]);
  }
  return ref.hashes;
}

// -> null, or the first step of `node` whose hash is not the reference of its own history
export async function firstOffReference(node) {
  const h = node.history;
  if (!h || !node.steps.size) return null;
  const last = Math.max(...node.steps.keys());
  const cfg = node.run.cfg;
  const want = await referenceHashes(h, last, cfg.local_steps > 1 ? { local_steps: cfg.local_steps, steps: cfg.steps } : {});
  for (const [s, x] of [...node.steps].sort((a, b) => a[0] - b[0])) {
    if (x !== want[s - 1]) return `${node.id}: step ${s} hash ${x.slice(0, 12)}, the reference of history ${JSON.stringify(h)} has ${want[s - 1].slice(0, 12)}`;
  }
  return null;
}

export { TYPES, jsonPayload, sleep };
