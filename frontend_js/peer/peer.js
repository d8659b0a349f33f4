// The browser peer: its membership in the signaling group, its links to the other peers, the
// group run, the model it holds, and the automation API `window.daisy` (docs/ARCHITECTURE.md).
//
//   const peer = new Peer(bus, { modules });  peer.boot();
//
// Jobs, one module each: server_connection.js (the /signal socket), this file (membership and
// roster, the links to admitted peers, the compute path), model_store.js (the model:
// generation, files, loading),
// rtc_peer.js (one RTCPeerConnection), mesh.js (the group's links and frames), ../run/ (the group
// run: start, steps, stop, membership; this file is its host, runHost below), state_codec.js (the
// state body).
// State changes are emitted on the bus as `state` (the object state() returns); the UI (ui.js)
// renders from it and nothing else.
import { ServerConnection } from './server_connection.js';
import { Mesh } from './mesh.js';
import { RtcPeer } from './rtc_peer.js';
import { RunController } from '../run/controller.js';
import { HttpBatches } from '../batch_source.js';
import { ModelStore } from './model_store.js';
import { GroupRestore } from './group_state.js';
import { StoredRun } from './stored_run.js';
import { OutageWatch } from './outage.js';

const MAX_NOTES = 6;
// A link not ready (open and HELLO matched) within this long is started over by its offering side:
// an ICE check or a negotiation message can be lost on a busy device; waits grow with each try.
export const LINK_READY_MS = 8000;
const LINK_READY_MAX_MS = 30_000;

export class Peer {
  constructor(bus, { modules = [] } = {}) {
    this.bus = bus;
    this.modules = new Set(modules);   // frontend_js files the server has (no 404 probing)
    const params = new URLSearchParams(location.search);
    this.params = params;
    this.room = params.get('room');
    this.s = {
      peerId: null, name: null, group: null, role: null, signal: 'connecting', rejected: false,
      step: 0, totalSteps: 0, loss: null, hash: null, path: null, pathReason: '', pathLabel: '',
      peers: [], requests: [], running: false, runState: 'idle', leader: null,
      tokensPerS: null, replicas: null, config: null, curve: [], dataSource: null,
      audits: null,          // {rate, through}: the run's gradient audits per step, and the last step audited here
      message: '', error: '', engine: null,
      run: null,             // the run's {id, roster (peer ids in slot order), topology, leader}
      peerHashes: {},        // peer id -> its latest known weight hash in the run
      links: {},             // peer id -> 'connecting' | 'linked' | 'closed: why' | 'refused: why'
      notes: [],             // the last few things worth telling the user
      drops: 0,              // mesh frames dropped (bad, late, foreign); details in mesh.drops
      threads: null,         // {count, shared, reason}: the CPU backend's threads, in shared memory or not, and why not every part on every core (null until decided)
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
    this.runs = new RunController(runHost(this), { faults: { corruptNextSync: Boolean(test.corruptNextSync), noJoin: Boolean(test.noJoin),
      forge, liarAuditor, liarOwner, referenceNonces: Boolean(test.referenceNonces) } });
    this.outage = new OutageWatch(this, bus);   // server outages: the run goes on (outage.js)
    this.rtc = new Map();      // peer id -> RtcPeer
    this.linkTries = new Map(); // peer id -> links offered since it was last ready (the watchdog's backoff)
    this.iceServers = [];
    // tests: the first offer this page sends is lost on the way (the link watchdog must recover)
    this.testLoseOffer = Boolean(globalThis.__daisyTest?.loseFirstOffer);
    this.models = new ModelStore(this);   // the model: generation, files, loading
    this.restore = new GroupRestore(this, this.mesh);   // a loaded checkpoint to the whole group
    this.storedRun = new StoredRun(this); // the group's run kept by the server (stored_run.js)
  }

  // ---- state ------------------------------------------------------------------------------
  state() {
    const s = this.s;
    return { ...s, group: s.group && { ...s.group }, peers: s.peers.map((p) => ({ ...p })),
             requests: s.requests.map((r) => ({ ...r })), curve: s.curve.slice(),
             config: s.config && { ...s.config }, threads: s.threads && { ...s.threads }, resumable: this.models.resumePoint() };
  }

  set(patch) {
    Object.assign(this.s, patch);
    this.bus.emit('state', this.s);
  }

  // ---- boot and signaling -----------------------------------------------------------------
  boot() {
    const on = (type, fn) => this.bus.on('signal:' + type, fn);
    on('open', () => this.set({ signal: 'connected' }));
    on('close', ({ code, reason, final }) => this.set({
      signal: final ? 'closed' : 'reconnecting',
      message: this.s.rejected ? this.s.message            // keep saying why
        : final ? `Disconnected from the server: ${reason || 'code ' + code}.` : this.outage.reconnectText(),
    }));
    on('welcome', (m) => {
      if (m.peerId !== this.s.peerId && !this.runs.busy) this.resetLinks(m.peerId);
      if (Array.isArray(m.iceServers)) this.iceServers = m.iceServers;
      this.set({ peerId: m.peerId, name: m.name, group: m.group, role: m.role, peers: m.peers,
                 requests: [], rejected: false, message: this.welcomeText(m), error: '' });
      this.announce();
      this.bus.emit('roster', this.s.peers);
      this.syncLinks();
    });
    on('peers', (m) => { this.set({ peers: m.peers }); this.bus.emit('roster', this.s.peers); this.syncLinks(); });
    // the server's word on who left: a run left without a quorum may go on only with it (run/recovery.js)
    this.bus.on('roster', (peers) => { for (const q of peers) this.runs.serverSaysBack(q.id); this.runs.maybeJoin(); });
    on('peer-joined', (m) => {
      const peers = this.s.peers.filter((p) => p.id !== m.peer.id).concat([m.peer]);
      this.set({ peers, requests: this.s.requests.filter((r) => r.id !== m.peer.id) });
      this.bus.emit('roster', this.s.peers);
      this.syncLinks();
    });
    on('peer-updated', (m) => {
      this.set({ peers: this.s.peers.map((p) => (p.id === m.peer.id ? m.peer : p)) });
      this.bus.emit('roster', this.s.peers);
    });
    on('peer-left', (m) => {
      this.runs.serverSaysGone(m.peer);
      this.set({ peers: this.s.peers.filter((p) => p.id !== m.peer),
                 requests: this.s.requests.filter((r) => r.id !== m.peer) });
      this.bus.emit('roster', this.s.peers);
      // an explicit goodbye ends the link; a dropped socket may come back (the link may be fine)
      if (m.reason === 'left') this.closeLink(m.peer, 'it left the group');
    });
    on('role', (m) => {
      const peers = this.s.peers.map((p) => (p.id === m.peer ? { ...p, role: m.role } : p));
      const patch = { peers };
      if (m.peer === this.s.peerId) {
        patch.role = m.role;
        if (m.role === 'host') patch.message = 'You are now the host of this room: approve who joins.';
      }
      this.set(patch);
    });
    on('join-request', (m) => {
      const requests = this.s.requests.filter((r) => r.id !== m.peer.id).concat([m.peer]);
      this.set({ requests });
      this.bus.emit('join-request', m.peer);
    });
    on('approved', (m) => {
      this.set({ role: m.role, peers: m.peers, message: 'The host accepted you into the room.' });
      this.announce();
      this.bus.emit('roster', this.s.peers);
      this.syncLinks();
    });
    on('signal', (m) => this.onSignal(m.from, m.data));
    on('relay', (m) => this.onRelay(m.from, m.data));
    on('rejected', (m) => {
      // the server's reason says who declined what (daisy/space/signaling/hub.py); say it once
      const why = typeof m.reason === 'string' && m.reason ? m.reason : 'the host declined the request';
      this.set({ rejected: true, message: `Not admitted to room "${this.room}": ${why}. Reload the page to ask again.` });
      this.bus.emit('rejected', m);
    });
    on('error', (m) => {
      console.warn(`daisy: server error ${m.code}: ${m.message}`);
      this.set({ error: `Server: ${m.message}` });
    });

    this.mesh.on('link', ({ peer, state, reason }) => this.setLink(peer, state === 'ready' ? 'linked' : `closed: ${reason}`));
    this.mesh.on('refused', ({ peer, reason }) => {
      this.setLink(peer, `refused: ${reason}`);
      this.note(`Not linked to ${this.nameOf(peer)}: ${reason}.`);
      this.conn?.send({ type: 'relay', to: peer, data: { kind: 'mesh-refused', protocol: this.mesh.version, reason } });
    });
    this.mesh.on('drop', () => this.set({ drops: this.mesh.drops.count }));
    this.conn = new ServerConnection(this.bus, { room: this.room });
    this.conn.connect();
    // leaving: tell the run's peers and the server now, so nobody waits for a deadline
    globalThis.addEventListener?.('pagehide', () => {
      this.runs.goodbye();
      this.conn.leave();
      for (const link of this.rtc.values()) link.close('the page closed');
    });
    this.pathReady = this.detectPath();     // start() waits for it: a run's engine is fixed at start
    this.loadDataInfo();
  }

  welcomeText(m) {
    const back = this.outage.welcomeText(m);   // after an outage, mid-run
    if (back) return back;
    if (m.group.kind === 'network') return 'Connected: devices on your network land in this group.';
    if (m.role === 'host') return `You host room "${this.room}": approve each device that asks to join.`;
    if (m.role === 'pending') return `Waiting for the host of room "${this.room}" to accept you…`;
    return `Connected to room "${this.room}".`;
  }

  // Tell the server (and through it the group) our path and run state. Only on changes: the
  // server rate-limits chatty sockets.
  announce() {
    const state = this.s.runState + (this.s.leader === this.s.peerId && this.s.running ? ' leader' : '');
    this.conn?.send({ type: 'hello', path: this.s.path || undefined, state });
  }

  approve(peerId) { return this.decide('approve', peerId); }
  reject(peerId) { return this.decide('reject', peerId); }

  decide(type, peerId) {
    if (this.s.role !== 'host') throw new Error(`only the room host can ${type} (you are ${this.s.role})`);
    if (!this.s.requests.some((r) => r.id === peerId)) throw new Error(`no join request from ${peerId}`);
    this.conn.send({ type, peer: peerId });
    this.set({ requests: this.s.requests.filter((r) => r.id !== peerId) });
    return true;
  }

  // ---- links to the other peers (rtc_peer.js, mesh.js) -------------------------------------
  // One link per admitted peer of the group; the smaller id offers. Pending peers (a room that
  // has not approved us) get no signals from the server, so they link to nobody.
  syncLinks() {
    const s = this.s;
    if (!s.peerId || s.role === 'pending' || s.rejected) return;
    for (const p of s.peers) {
      if (p.id === s.peerId || p.role === 'pending') continue;
      const link = this.rtc.get(p.id);
      if (!link || link.state === 'closed') this.openLink(p.id, s.peerId < p.id);
    }
  }

  openLink(id, initiator) {
    this.rtc.get(id)?.close('replaced');
    const link = new RtcPeer({
      remoteId: id, initiator, iceServers: this.iceServers, links: this.rtc.size + 1,
      sendSignal: (data) => {
        if (this.testLoseOffer && data.sdp?.type === 'offer') { this.testLoseOffer = false; return; }
        this.conn.send({ type: 'signal', to: id, data });
      },
      onMessage: (bytes) => this.mesh.receive(id, bytes),
      onState: (state, reason) => {
        if (this.rtc.get(id) !== link) return;
        if (state === 'open') this.mesh.addLink(id, link);
        else if (state === 'closed') { this.mesh.removeLink(id, reason); this.setLink(id, `closed: ${reason}`); }
      },
    });
    this.rtc.set(id, link);
    this.setLink(id, 'connecting');
    if (initiator) this.watchLink(id, link);
    return link;
  }

  // the offering side's watchdog: a link still not ready after its wait is offered again (the
  // answering side replaces its half on the new offer, onSignal)
  watchLink(id, link) {
    const tries = (this.linkTries.get(id) || 0) + 1;
    this.linkTries.set(id, tries);
    const wait = Math.min(LINK_READY_MS * tries, LINK_READY_MAX_MS);
    setTimeout(() => {
      if (this.rtc.get(id) !== link || link.state === 'closed') return;
      if (this.mesh.isReady(id)) { this.linkTries.delete(id); return; }
      if (!this.s.peers.some((p) => p.id === id && p.role !== 'pending')) return;
      console.info(`daisy: link to ${id} not ready within ${wait / 1000} s: offering again`);
      this.openLink(id, true);
    }, wait);
  }

  closeLink(id, reason) {
    const link = this.rtc.get(id);
    if (link) link.close(reason);
  }

  resetLinks(selfId) {
    for (const link of this.rtc.values()) link.close('this page has a new identity');
    this.rtc.clear();
    this.mesh.selfId = selfId;
    this.set({ links: {} });
  }

  setLink(id, state) {
    const was = this.s.links[id] || '';
    if (was === state || (was.startsWith('refused') && state.startsWith('closed'))) return;   // keep saying why
    this.set({ links: { ...this.s.links, [id]: state } });
  }

  // a relayed WebRTC signal: {sdp} or {candidate}; an offer for a link we already have means the
  // other side started over (its page reconnected): start over too
  onSignal(from, data) {
    if (!data || typeof data !== 'object' || typeof from !== 'string') return;
    let link = this.rtc.get(from);
    const isOffer = data.sdp && data.sdp.type === 'offer';
    if (isOffer && from < this.s.peerId && (!link || link.state === 'closed' || link.pc.remoteDescription)) {
      link = this.openLink(from, false);
    }
    if (link) link.signal(data);
  }

  // small app messages through the server: a peer that cannot speak our frames says why
  onRelay(from, data) {
    if (!data || typeof data !== 'object' || data.kind !== 'mesh-refused') return;
    const reason = `peer ${from} speaks mesh protocol v${Number(data.protocol) | 0}, this page v${this.mesh.version}`;
    this.setLink(from, `refused: ${reason}`);
    this.note(`Not linked to ${this.nameOf(from)}: ${reason}.`);
  }

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
      this.picked = await registry.pickBackend({ gpu: mode === 'off' ? null : navigator.gpu || null, mode: registry.GPU_MODES.includes(mode) ? mode : 'auto',
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
      const info = await (await fetch('/data/info')).json();
      this.set({ dataSource: { source: info.source, summary: info.summary, reason: info.reason, dataId: info.data_id } });
    } catch (err) {
      this.set({ dataSource: { source: 'unknown', summary: 'the data route could not be reached', reason: `${err.message || err}` } });
    }
  }

  // ---- compute ----------------------------------------------------------------------------
  loadCompute() {
    this.computeModules ??= this.importCompute();
    return this.computeModules;
  }

  async importCompute() {
    for (const file of ['train.js', 'config.js', 'model.js', 'hashing.js', 'optim.js', 'engines.js']) {
      if (!this.modules.has(file)) return { error: `compute not available yet: frontend_js/${file} is missing` };
    }
    try {
      const [train, config, model, hashing, optim] = await Promise.all([
        import('../train.js'), import('../config.js'), import('../model.js'), import('../hashing.js'), import('../optim.js')]);
      return { train, config, model, hashing, optim };
    } catch (err) {
      return { error: `compute not available yet: the JS mirror failed to load (${err.message || err})` };
    }
  }

  async compute() {
    const c = await this.loadCompute();
    if (c.error) throw new Error(c.error);
    return c;
  }

  // the backend of this device's next step, as the registry picked it (backends.js)
  backend() {
    return this.picked?.backend;
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

// The run controller's host (frontend_js/run/controller.js lists what it needs): everything the
// controller sees of the page, the server and the compute path.
function runHost(peer) {
  return {
    get selfId() { return peer.s.peerId; },
    mesh: peer.mesh,
    members: () => peer.s.peers,
    canRun: () => (peer.s.role === 'pending' ? 'waiting for the room host to accept this device: it cannot start a run yet'
      : peer.s.rejected ? 'the room host declined this device' : null),
    nameOf: (id) => peer.nameOf(id),
    show: (patch) => peer.set(patch),
    note: (text) => peer.note(text),
    emit: (event, payload) => peer.bus.emit(event, payload),
    announce: () => peer.announce(),
    compute: () => peer.compute(),
    ready: () => peer.pathReady,
    backend: () => peer.backend(),
    get gpu() { return peer.gpu || null; },
    dataId: () => peer.dataId(),
    batches: (cfg, dataId) => new HttpBatches(cfg, { dataId }),
    get models() { return peer.models; },
    get stored() { return peer.storedRun || null; },
  };
}

// The automation API on window.daisy (see docs/ARCHITECTURE.md).
export function automationApi(peer, bus) {
  return {
    state: () => peer.state(),
    start: (config) => peer.start(config),
    stop: () => peer.stop(),
    on: (event, cb) => bus.on(event, cb),
    approve: (peerId) => peer.approve(peerId),
    reject: (peerId) => peer.reject(peerId),
    hasModel: () => peer.hasModel(),
    generate: (prompt, opts) => peer.models.generate(prompt, opts),
    downloadCheckpoint: () => peer.models.downloadCheckpoint(),
    downloadSafetensors: () => peer.models.downloadSafetensors(),
    downloadKit: () => peer.models.downloadKit(),
    load: (stateOrFile) => peer.models.load(stateOrFile),
    resumeStored: () => peer.storedRun.resume(),
    // a group restore offered to this page (it holds a model): Load or Ignore, as the panel's buttons
    acceptRestore: () => peer.restore.accept(),
    declineRestore: () => peer.restore.decline(),
    // the mesh, for tests and for anyone curious: recent drops with reasons, the links' states,
    // and raw bytes to a linked peer (a hostile peer can send anything; tests send bad frames)
    mesh: {
      drops: () => ({ count: peer.mesh.drops.count, recent: peer.mesh.drops.recent.slice() }),
      links: () => ({ ...peer.s.links }),
      sendRaw: (peerId, bytes) => peer.rtc.get(peerId)?.send(bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes)),
      frames: () => import('./frames.js'),
      stats: () => { const r = peer.runs.run || peer.runs.lastRun; return r ? { ...peer.runs.stats(r), dataWaitMs: r.batches.waitMs, topology: r.collective.topology, steps: r.completed - r.desc.startStep } : null; },
    },
    // test hooks for the membership tests: a joiner whose state goes wrong after its checks; the
    // next state transfer from this page cut short or tampered with in transit
    testing: {
      corruptNextSync: () => { peer.runs.faults.corruptNextSync = true; },
      faultNextState: (kind) => { peer.mesh.faultNext = { type: 8, kind }; },
      // the GPU engine faults as a lost device or failed audit would (backends.js hears it)
      faultGpu: (reason) => peer.picked?.engine?.fault(reason, 'test'),
      // what the others see of a crashed device: every link and the server socket end at once,
      // no goodbye, and this page's JS stops (CDP's Page.crash never answers under Playwright)
      crash: () => {
        peer.conn.final = true;
        peer.conn.stopPinging();
        try { peer.conn.ws.close(); } catch { /* gone anyway */ }
        for (const link of peer.rtc.values()) { try { link.pc.close(); } catch { /* gone anyway */ } }
        setTimeout(() => { for (;;) { /* frozen */ } }, 0);
      },
    },
    // test hook: flip one bit of this replica's weights mid-run (the sync guard must stop the run)
    corruptWeights: () => peer.runs.corruptWeights(),
  };
}
