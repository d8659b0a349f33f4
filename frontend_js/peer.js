// The browser peer: its state, its signaling membership, its training run, and the automation
// API `window.daisy` (documented in docs/ARCHITECTURE.md).
//
//   const peer = new Peer(bus, { modules });  peer.boot();
//
// State changes are emitted on the bus as `state` (the object state() returns); the UI
// (ui.js) renders from it and nothing else. Until the WebRTC mesh lands, start(config) trains
// a one-peer group locally with the JS mirror (train.js), on the data route's batches.
import { ServerConnection } from './server_connection.js';

const CHUNK_MS = 25;          // train for at most this long before yielding to the page
const RATE_WINDOW = 20;       // steps in the tokens/s moving window
const MAX_CURVE = 2000;       // loss points kept for the plot (older ones are thinned)
const WINDOWS_MAX = 4;        // FineWeb-Edu windows of a one-peer run's stream

const yieldToPage = () => new Promise((resolve) => setTimeout(resolve, 0));

export class Peer {
  constructor(bus, { modules = [] } = {}) {
    this.bus = bus;
    this.modules = new Set(modules);   // frontend_js files the server has (no 404 probing)
    const params = new URLSearchParams(location.search);
    this.room = params.get('room');
    this.s = {
      peerId: null, name: null, group: null, role: null, signal: 'connecting', rejected: false,
      step: 0, totalSteps: 0, loss: null, hash: null, path: null, pathReason: '',
      peers: [], requests: [], running: false, runState: 'idle', leader: null,
      tokensPerS: null, replicas: null, config: null, curve: [], dataSource: null,
      message: '', error: '',
    };
    this.run = null;           // { group, stop } of the active run
    this.model = null;         // the last trained group (generation, checkpoint)
    this.stepTimes = [];
  }

  // ---- state ------------------------------------------------------------------------------
  state() {
    const s = this.s;
    return { ...s, group: s.group && { ...s.group }, peers: s.peers.map((p) => ({ ...p })),
             requests: s.requests.map((r) => ({ ...r })), curve: s.curve.slice(),
             config: s.config && { ...s.config } };
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
        : final ? `Disconnected from the server: ${reason || 'code ' + code}.` : 'Reconnecting to the server…',
    }));
    on('welcome', (m) => {
      this.set({ peerId: m.peerId, name: m.name, group: m.group, role: m.role, peers: m.peers,
                 requests: [], rejected: false, message: this.welcomeText(m), error: '' });
      this.announce();
      this.bus.emit('roster', this.s.peers);
    });
    on('peers', (m) => { this.set({ peers: m.peers }); this.bus.emit('roster', this.s.peers); });
    on('peer-joined', (m) => {
      const peers = this.s.peers.filter((p) => p.id !== m.peer.id).concat([m.peer]);
      this.set({ peers, requests: this.s.requests.filter((r) => r.id !== m.peer.id) });
      this.bus.emit('roster', this.s.peers);
    });
    on('peer-updated', (m) => {
      this.set({ peers: this.s.peers.map((p) => (p.id === m.peer.id ? m.peer : p)) });
      this.bus.emit('roster', this.s.peers);
    });
    on('peer-left', (m) => {
      this.set({ peers: this.s.peers.filter((p) => p.id !== m.peer),
                 requests: this.s.requests.filter((r) => r.id !== m.peer) });
      this.bus.emit('roster', this.s.peers);
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
    });
    on('rejected', (m) => {
      this.set({ rejected: true, message: `The room host declined your request (${m.reason}).` });
      this.bus.emit('rejected', m);
    });
    on('error', (m) => {
      console.warn(`daisy: server error ${m.code}: ${m.message}`);
      this.set({ error: `Server: ${m.message}` });
    });

    this.conn = new ServerConnection(this.bus, { room: this.room });
    this.conn.connect();
    this.pathReady = this.detectPath();     // start() waits for it: a run's engine is fixed at start
    this.loadDataInfo();
  }

  welcomeText(m) {
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

  // GPU when the WebGPU engine exists and its kernels pass their gates, else the CPU mirror.
  // The engine drops to the CPU by itself on any later fault; we show its reason.
  async detectPath() {
    let path = 'cpu';
    let reason = 'WebGPU not available in this browser';
    if (navigator.gpu && this.modules.has('gpu.js')) {
      try {
        const gpu = await import('./gpu.js');
        this.gpu = gpu;
        const engine = await gpu.createGpuEngine({
          onFault: ({ reason: why }) => this.set({ path: 'cpu', pathReason: `GPU disabled: ${why}` }),
        });
        this.gpuEngine = engine;
        if (engine.status.path === 'gpu') {
          path = 'gpu';
          reason = `WebGPU ${engine.status.kernel} kernel, gates passed`;
        } else {
          reason = `GPU unusable: ${engine.status.reasons.slice(-1)[0] || 'no reason given'}`;
        }
      } catch (err) {
        reason = `GPU engine failed to start: ${err.message || err}`;
      }
    } else if (navigator.gpu) {
      reason = 'GPU engine not available in this build';
    }
    this.set({ path, pathReason: reason });
    this.announce();
  }

  async loadDataInfo() {
    try {
      const info = await (await fetch('/data/info')).json();
      this.set({ dataSource: { source: info.source, reason: info.reason, dataId: info.data_id } });
    } catch (err) {
      this.set({ dataSource: { source: 'unknown', reason: `data route unreachable: ${err.message || err}` } });
    }
  }

  // ---- training ---------------------------------------------------------------------------
  async loadCompute() {
    for (const file of ['train.js', 'config.js']) {
      if (!this.modules.has(file)) return { error: `compute not available yet: frontend_js/${file} is missing` };
    }
    try {
      const [train, config] = await Promise.all([import('./train.js'), import('./config.js')]);
      return { train, config };
    } catch (err) {
      return { error: `compute not available yet: the JS mirror failed to load (${err.message || err})` };
    }
  }

  // Starts a run and resolves once it is running (not when it ends); rejects on bad config or
  // missing compute. Progress: `step` events and state().
  async start(config = {}) {
    if (this.run) {
      const msg = 'a run is already going: stop it first';
      this.set({ error: msg });
      throw new Error(msg);
    }
    const compute = await this.loadCompute();
    await this.pathReady;
    if (compute.error) { this.set({ error: compute.error }); throw new Error(compute.error); }
    let cfg, group;
    try {
      cfg = compute.config.makeConfig(config);     // validates: same ranges and messages as daisy.config
      group = new compute.train.Group(cfg, 1, await this.loadStream(), this.engine());
    } catch (err) { this.set({ error: err.message }); throw err; }
    const run = { group, cfg, stopped: false };
    this.run = run;
    this.stepTimes = [];
    this.set({ running: true, runState: 'training', leader: this.s.peerId, config: cfg, step: 0,
               totalSteps: cfg.steps, loss: null, hash: null, curve: [], tokensPerS: null,
               replicas: null, error: '', message: 'Training on this device (one-peer run).' });
    this.announce();
    this.bus.emit('run-started', { config: { ...cfg } });
    this.loop(run).catch((err) => {
      console.warn('daisy: the run failed:', err);
      this.finish(run, 'failed', `The run stopped: ${err.message || err}`, err.message || String(err));
    });
    return { config: { ...cfg } };
  }

  engine() {
    return this.gpuEngine && this.gpuEngine.status.path === 'gpu' ? this.gpuEngine : undefined;
  }

  // The token stream of a one-peer run (until the mesh lands and peers fetch keyed batches
  // from /data/batch): the built-in corpus whole, or the first WINDOWS_MAX windows of
  // FineWeb-Edu's shard 0 row group 0, read through /data/window.
  async loadStream() {
    const info = await this.fetchJson('/data/info');
    const id = info.data_id;
    if (this.stream && this.stream.id === id) return this.stream.tokens;
    this.set({ dataSource: { source: info.source, reason: info.reason, dataId: id } });
    const total = info.source === 'builtin' ? info.total_tokens : info.max_tokens * WINDOWS_MAX;
    const parts = [];
    let have = 0;
    while (have < total) {
      const length = Math.min(info.max_tokens, total - have);
      const q = new URLSearchParams({ shard: 0, rg: 0, offset: have, length });
      const res = await fetch(`/data/window?${q}`);
      if (!res.ok) {
        if (parts.length) break;        // a short FineWeb row group: train on what we have
        throw new Error(`data route: ${(await res.json().catch(() => ({}))).error || 'HTTP ' + res.status}`);
      }
      const part = new Uint16Array(await res.arrayBuffer());
      parts.push(part);
      have += part.length;
    }
    const tokens = new Uint16Array(have);
    let at = 0;
    for (const part of parts) { tokens.set(part, at); at += part.length; }
    this.stream = { id, tokens };
    return tokens;
  }

  async fetchJson(url) {
    const res = await fetch(url);
    const body = await res.json();
    if (!res.ok) throw new Error(`${url}: ${body.error || 'HTTP ' + res.status}`);
    return body;
  }

  async loop(run) {
    const { cfg, group } = run;
    const tokensPerStep = cfg.batch * cfg.seq_len;
    let chunkStart = performance.now();
    while (!run.stopped && this.s.step < cfg.steps) {
      // a GPU result that failed its audit: the engine is on the CPU by then; redo the step
      const out = this.gpu ? await this.gpu.withGpuFallback(group.engine, () => group.step()) : await group.step();
      const now = performance.now();
      this.stepTimes.push(now);
      if (this.stepTimes.length > RATE_WINDOW) this.stepTimes.shift();
      const n = this.stepTimes.length;
      const rate = n > 1 ? (tokensPerStep * (n - 1) * 1000) / (this.stepTimes[n - 1] - this.stepTimes[0]) : null;
      const hashes = out.hashes;
      const curve = this.s.curve;
      curve.push([out.step, out.loss]);
      if (curve.length > MAX_CURVE) this.s.curve = curve.filter((_, i) => i % 2 === 0 || i === curve.length - 1);
      this.model = group;
      const agree = hashes.every((h) => h === hashes[0]);
      this.set({ step: out.step, loss: out.loss, hash: hashes[0], tokensPerS: rate,
                 replicas: { count: hashes.length, agree, step: out.step } });
      this.bus.emit('step', { step: out.step, loss: out.loss, hash: hashes[0] });
      if (!agree) {
        this.finish(run, 'stopped', `Replicas disagree at step ${out.step}: stopped (never fork).`, 'replica mismatch');
        return;
      }
      if (now - chunkStart > CHUNK_MS) { await yieldToPage(); chunkStart = performance.now(); }
    }
    if (run.stopped) this.finish(run, 'stopped', `Stopped at step ${this.s.step}.`, '');
    else this.finish(run, 'done', `Run finished: ${this.s.step} steps, loss ${this.s.loss.toFixed(4)}.`, '');
  }

  finish(run, runState, message, error) {
    if (this.run !== run) return;
    this.run = null;
    this.set({ running: false, runState, message, error });
    this.announce();
    this.bus.emit('run-ended', { state: runState, step: this.s.step, error });
  }

  // The step in flight completes (its update is already applied to the weights), then the run
  // ends: state().running turns false at that point.
  stop() {
    const run = this.run;
    if (!run || run.stopped) return false;
    run.stopped = true;
    this.set({ message: 'Stopping after the current step…' });
    return true;
  }

  hasModel() { return this.model !== null; }
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
  };
}
