// The browser peer: its membership in the signaling group, its links to the other peers, the
// group run, the model it holds (docs/ARCHITECTURE.md "The browser peer's modules").
//
//   const peer = new Peer(bus, { modules, params, server });  peer.boot();
//
// Two hosts build it (docs/ARCHITECTURE.md "Two hosts of one peer"): the page (ui.js: the page's
// URL parameters, its own origin) and the headless peer (../headless.mjs: a server's URL, its
// command line's parameters). It reads no browser globals: what differs comes in as options.
//
// Jobs, one module each: this file (the Peer's state, boot, the backend choice), membership.js
// (the signaling server's messages, one handler per type; keep-out and join decisions), links.js
// (one RtcPeer per admitted peer, the mesh's links), server_connection.js (the /signal socket),
// run_host.js (what the group run, ../run/, sees of this page), model_store.js (the model:
// generation, files, loading), group_state.js, stored_run.js, outage.js, automation.js (window.daisy).
// State changes are emitted on the bus as `state` (the object state() returns); the UI (ui.js)
// renders from it and nothing else.
import { ServerConnection } from './server_connection.js';
import { Mesh } from '../mesh/mesh.js';
import { RunController } from '../run/controller.js';
import { TIMING } from '../run/record.js';
import { ModelStore } from './model_store.js';
import { GroupRestore } from './group_state.js';
import { StoredRun } from './stored_run.js';
import { OutageWatch } from './outage.js';
import { SIGNAL_HANDLERS, keepOut, decide } from './membership.js';
import { Links } from './links.js';
import { runHost } from './run_host.js';
import { Trainer } from '../train.js';

const MAX_NOTES = 6;

export class Peer {
  // modules: the frontend_js files the server has (no 404 probing); params: the page's URL
  // parameters (URLSearchParams: room, gpu, storeEvery, meshProtocol); server: the server's base
  // URL ('' in the page: its own origin); connection: more options of the server connection
  // (ServerConnection: name, token)
  constructor(bus, { modules = [], params = new URLSearchParams(), server = '', connection = {} } = {}) {
    this.bus = bus;
    this.modules = new Set(modules);
    this.params = params;
    this.server = server;
    this.connection = connection;
    this.room = params.get('room');
    this.s = {
      peerId: null, name: null, group: null, role: null, signal: 'connecting', rejected: false,
      step: 0, totalSteps: 0, loss: null, hash: null, path: null, pathReason: '', pathLabel: '',
      peers: [], requests: [], running: false, runState: 'idle', leader: null,
      tokensPerS: null, replicas: null, config: null, curve: [], dataSource: null,
      speed: null,           // {tokensPerS, aloneTokensPerS, ratio}: the group against this device alone (run/speed.js)
      audits: null,          // {rate, through}: the run's gradient audits per step, and the last step audited here
      message: '', error: '', engine: null,
      run: null,             // the run's {id, roster (peer ids in slot order), topology, leader}
      peerHashes: {},        // peer id -> its latest known weight hash in the run
      links: {},             // peer id -> 'connecting' | 'linked' | 'closed: why' | 'refused: why'
      notes: [],             // the last few things worth telling the user
      drops: 0,              // mesh frames dropped (bad, late, foreign); details in mesh.drops
      threads: null,         // {count, shared, reason}: the CPU backend's threads, in shared memory or not, and why not every part on every core (null until decided)
      keptOut: {},           // peer id -> why this page never trains with it (its user's "don't train with this device", or the room host's removal)
    };
    // ?meshProtocol=N: speak another mesh protocol version (tests of the refusal path)
    const protocol = Number(params.get('meshProtocol'));
    this.mesh = new Mesh({ selfId: null, ...(Number.isInteger(protocol) && protocol > 0 && protocol < 256 ? { version: protocol } : {}) });
    // test hooks set before the page loads (tests/test_membership.py, test_mesh.py) become the
    // run controller's injected fault plan: the controller reads no globals
    const test = globalThis.__daisyTest || {};
    // (tests/test_audits_pages.py: a forger {from, kind, factor}, a lying auditor {from}, a lying shard owner {from}, the reference's nonces)
    const forge = test.forge && typeof test.forge === 'object' ? { from: Number(test.forge.from) || 0, kind: String(test.forge.kind), factor: Number(test.forge.factor ?? 1) } : null;
    const liarAuditor = test.liarAuditor && typeof test.liarAuditor === 'object' ? { from: Number(test.liarAuditor.from) || 0 } : null;
    const liarOwner = test.liarOwner && typeof test.liarOwner === 'object' ? { from: Number(test.liarOwner.from) || 0 } : null;
    // (tests/test_membership.py: shorter controller waits {name: ms}, only TIMING's names)
    const timing = Object.fromEntries(Object.entries(test.timing && typeof test.timing === 'object' ? test.timing : {})
      .filter(([k, v]) => Object.hasOwn(TIMING, k) && Number.isFinite(v) && v > 0));
    this.runs = new RunController(runHost(this), { timing, faults: { corruptNextSync: Boolean(test.corruptNextSync), noJoin: Boolean(test.noJoin),
      forge, liarAuditor, liarOwner, referenceNonces: Boolean(test.referenceNonces) } });
    this.outage = new OutageWatch(this, bus);   // server outages: the run goes on (outage.js)
    this.links = new Links(this);          // the links to the other peers (links.js)
    this.conn = null;                      // the ServerConnection, from boot()
    this.models = new ModelStore(this);   // the model: generation, files, loading
    this.restore = new GroupRestore(this, this.mesh);   // a loaded checkpoint to the whole group
    this.storedRun = new StoredRun(this); // the group's run kept by the server (stored_run.js)
  }

  // ---- state ------------------------------------------------------------------------------
  state() {
    const s = this.s;
    return { ...s, group: s.group && { ...s.group }, peers: s.peers.map((p) => ({ ...p })),
             requests: s.requests.map((r) => ({ ...r })), curve: s.curve.slice(),
             config: s.config && { ...s.config }, threads: s.threads && { ...s.threads }, keptOut: { ...s.keptOut }, resumable: this.models.resumePoint() };
  }

  set(patch) {
    Object.assign(this.s, patch);
    this.bus.emit('state', this.s);
  }

  // ---- boot and signaling -----------------------------------------------------------------
  boot() {
    this.listen();
    this.conn = new ServerConnection(this.bus, { ...this.connection, room: this.room,
      url: this.server ? `${this.server.replace(/^http/, 'ws')}/signal` : null });
    this.conn.connect();
    globalThis.addEventListener?.('pagehide', () => this.goodbye('the page closed'));
    this.pathReady = this.detectPath();     // start() waits for it: a run's engine is fixed at start
    this.loadDataInfo();
  }

  // the server's messages (membership.js, one handler per type) and the mesh's events
  listen() {
    for (const [type, fn] of Object.entries(SIGNAL_HANDLERS)) this.bus.on(`signal:${type}`, (m) => fn(this, m));
    // the server's word on who left: a run left without a quorum may go on only with it (run/recovery.js)
    this.bus.on('roster', (peers) => { for (const q of peers) this.runs.serverSaysBack(q.id); this.runs.maybeJoin(); });
    this.links.listen();
    this.mesh.on('drop', () => this.set({ drops: this.mesh.drops.count }));
  }

  // leaving: tell the run's peers and the server now, so nobody waits for a deadline (the page's
  // pagehide; the headless peer's SIGINT/SIGTERM)
  goodbye(reason) {
    this.runs.goodbye();
    this.conn?.leave();
    this.links.closeAll(reason);
  }

  // a server route's URL: relative in the page, absolute in the headless peer
  serverUrl(path) { return `${this.server}${path}`; }

  // Tell the server (and through it the group) our path and run state. Only on changes: the
  // server rate-limits chatty sockets.
  announce() {
    const state = this.s.runState + (this.s.leader === this.s.peerId && this.s.running ? ' leader' : '');
    this.conn?.send({ type: 'hello', path: this.s.path || undefined, state });
  }

  // the room host's and the user's decisions (membership.js)
  keepOut(peerId, why) { return keepOut(this, peerId, why); }
  approve(peerId) { return decide(this, 'approve', peerId); }
  reject(peerId) { return decide(this, 'reject', peerId); }

  // the CPU backend, made once: the registry (backends.js) picks it and says why (this.s.threads
  // = {count, shared, reason}); undefined without the registry (the trainer's and the
  // generator's default then: the JS mirror). All give the same bits.
  loadCpuBackend() {
    this.cpuBackendMade ??= this.pathReady.then(() => this.picked?.cpu);
    return this.cpuBackendMade;
  }

  // The registry (backends.js pickBackend) picks this device's backend: the GPU where its kernels
  // passed their gates and, timed against this device's CPU at the run's settings, it is faster
  // (?gpu=all: every GEMM there; ?gpu=off: the CPU only). A later fault or measurement changes
  // the choice: the panel shows it and the group hears it (announce), so both agree.
  async detectPath() {
    const mode = this.params.get('gpu') || 'auto';
    const show = (d) => { this.set(d); this.announce(); };
    if (!this.modules.has('backends.js')) { show({ path: 'cpu', pathReason: 'frontend_js/backends.js is missing', pathLabel: 'CPU (JS mirror)', engine: 'cpu' }); return; }
    try {
      const registry = await import('../backends.js');
      this.picked = await registry.pickBackend({ gpu: mode === 'off' ? null : globalThis.navigator?.gpu || null, mode: registry.GPU_MODES.includes(mode) ? mode : 'auto',
        has: (path) => this.modules.has(path), onChange: show });
      this.gpu = this.picked.gpuModule;
      this.set({ threads: this.picked.threads });
      show(this.picked.describe());
    } catch (err) {
      console.warn('daisy: no backend:', err);
      show({ path: 'cpu', pathReason: `no backend: ${err.message || err}`, pathLabel: 'CPU (JS mirror)', engine: 'cpu' });
    }
  }

  async loadDataInfo() {
    try {
      const info = await (await fetch(this.serverUrl('/data/info'))).json();
      this.set({ dataSource: { source: info.source, summary: info.summary, reason: info.reason, dataId: info.data_id } });
    } catch (err) {
      this.set({ dataSource: { source: 'unknown', summary: 'the data route could not be reached', reason: `${err.message || err}` } });
    }
  }

  // the backend of this device's next step, as the registry picked it (backends.js)
  backend() {
    return this.picked?.backend;
  }

  // the trainer of this device's replica in a run (the registry's: the resident step's with
  // ?gpu=resident; the run loop never knows which)
  trainer(cfg, replica, batches) {
    return this.picked ? this.picked.trainer(cfg, replica, batches) : new Trainer(cfg, replica, batches);
  }

  // the training data the Space serves (runs compare it: one data id per run)
  async dataId() {
    if (!this.s.dataSource || !this.s.dataSource.dataId) await this.loadDataInfo();
    const id = this.s.dataSource && this.s.dataSource.dataId;
    if (!id) throw new Error(`no training data: ${(this.s.dataSource && this.s.dataSource.reason) || 'the data route did not answer'}`);
    return id;
  }

  // ---- the group run (../run/controller.js) ------------------------------------------------
  // Starts a run for the whole group and resolves once it is running (not when it ends);
  // rejects with the reason when it cannot start. Progress: `step` events and state().
  async start(config = {}) {
    try {
      return await this.runs.start(config);
    } catch (err) {
      this.set({ error: err.message || String(err) });
      throw err;
    }
  }

  // Every peer of the run ends after the step in flight (its update is applied everywhere).
  stop() { return this.runs.stop(); }

  note(text) {
    const notes = this.s.notes.concat([text]).slice(-MAX_NOTES);
    this.set({ notes, message: text });
  }

  nameOf(id) {
    const p = this.s.peers.find((q) => q.id === id);
    return p ? `${p.name} (${id})` : id;
  }

  hasModel() { return this.models.has(); }
}
