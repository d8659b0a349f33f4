// The browser peer: its state, its signaling membership, its training run, and the automation
// API `window.daisy` (documented in docs/ARCHITECTURE.md).
//
//   const peer = new Peer(bus, { modules });  peer.boot();
//
// State changes are emitted on the bus as `state` (the object state() returns); the UI
// (ui.js) renders from it and nothing else. Until the WebRTC mesh lands, start(config) trains
// a one-peer group locally with the JS mirror (train.js), on the data route's batches.
//
// The model: generate() samples in the page (generate.js) from the current weights; the
// download* methods POST the replica as a state body (encodeState; format in daisy/server.py)
// to the model routes and save the file they return; load(file) POSTs a .pt to /api/load and
// hands the state to loadState(), the one way a replica is replaced (the group broadcast will
// call it too). After a load, start() resumes that run from its step with its config.
import { ServerConnection } from './server_connection.js';

const CHUNK_MS = 25;          // train for at most this long before yielding to the page
const RATE_WINDOW = 20;       // steps in the tokens/s moving window
const MAX_CURVE = 2000;       // loss points kept for the plot (older ones are thinned)
const WINDOWS_MAX = 4;        // FineWeb-Edu windows of a one-peer run's stream
const MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024;   // = daisy.server.MAX_CHECKPOINT_BYTES
const NO_MODEL = 'no model yet: train or load one first';

export const STATE_FORMAT = 'daisychain-state';  // the state body, as daisy/server.py defines it
export const STATE_VERSION = 1;
const PARTS_FULL = ['model', 'optim.m', 'optim.v'];
const LITTLE_ENDIAN = new Uint8Array(new Float64Array([1]).buffer)[7] === 0x3f;

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
    this.model = null;         // the last trained or loaded group (generation, checkpoint)
    this.modelStep = 0;        // the model's step (a checkpoint's `step`)
    this.modelExtra = null;    // what the model was trained on ({data, data_id}), kept in files
    this.resumable = false;    // a loaded model the next start() continues
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
        // route 'auto': only the GEMMs where the GPU is faster go there (gpu.js gpuPays)
        const engine = await gpu.createGpuEngine({
          route: 'auto',
          onFault: ({ reason: why }) => this.set({ path: 'cpu', pathReason: `GPU disabled: ${why}` }),
        });
        this.gpuEngine = engine;
        if (engine.status.path === 'gpu') {
          path = 'gpu';
          reason = `WebGPU ${engine.status.kernel} kernel, gates passed; ${engine.status.routing}`;
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
  loadCompute() {
    this.computeModules ??= this.importCompute();
    return this.computeModules;
  }

  async importCompute() {
    for (const file of ['train.js', 'config.js', 'model.js', 'hashing.js']) {
      if (!this.modules.has(file)) return { error: `compute not available yet: frontend_js/${file} is missing` };
    }
    try {
      const [train, config, model, hashing] = await Promise.all([
        import('./train.js'), import('./config.js'), import('./model.js'), import('./hashing.js')]);
      return { train, config, model, hashing };
    } catch (err) {
      return { error: `compute not available yet: the JS mirror failed to load (${err.message || err})` };
    }
  }

  async compute() {
    const c = await this.loadCompute();
    if (c.error) throw new Error(c.error);
    return c;
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
    // a loaded checkpoint with steps left: continue it (its config, weights, Adam state, step)
    const resume = this.resumable && this.modelStep < this.model.cfg.steps ? this.model : null;
    let cfg, group, stream;
    try {
      cfg = resume ? resume.cfg : compute.config.makeConfig(config);   // validates like daisy.config
      stream = await this.loadStream();
      group = new compute.train.Group(cfg, 1, stream, this.engine(), resume ? resume.replicas : null);
    } catch (err) { this.set({ error: err.message }); throw err; }
    const info = this.s.dataSource || {};
    const extra = { data: info.source === 'builtin' ? 'builtin' : String(info.source), data_id: this.stream.id };
    let message = 'Training on this device (one-peer run).';
    if (resume) {
      const was = this.modelExtra && this.modelExtra.data_id;
      message = `Resuming the loaded checkpoint from step ${this.modelStep} with its settings.` +
        (was && was !== extra.data_id ? ` Note: it was trained on ${was}, this run reads ${extra.data_id}.` : '');
    }
    this.resumable = false;
    const run = { group, cfg, stopped: false, extra };
    this.run = run;
    this.stepTimes = [];
    this.set({ running: true, runState: 'training', leader: this.s.peerId, config: cfg,
               step: resume ? this.modelStep : 0, totalSteps: cfg.steps, loss: null,
               hash: resume ? this.s.hash : null, curve: [], tokensPerS: null,
               replicas: null, error: '', message });
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
      this.modelStep = out.step;
      this.modelExtra = run.extra;
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

  // ---- the model: generation, files, loading ----------------------------------------------

  // Text continuing `prompt`, sampled in this page from the current weights (a copy: a run
  // going on meanwhile does not change them mid-way). Same bits as daisy.generate.generate.
  async generate(prompt, { temperature = 0.8, topK = 40, seed = 0, tokens = 200 } = {}) {
    if (!this.model) throw new Error(NO_MODEL);
    if (!this.modules.has('generate.js')) throw new Error('generation not available: frontend_js/generate.js is missing');
    const gen = await import('./generate.js');
    // the fastest CPU engine whose gate passed (same bits as every engine); else the scalar one
    const engine = this.modules.has('engines.js') ? await (await import('./engines.js')).bestEngine() : undefined;
    const { cfg, replicas } = this.model;
    const params = Object.fromEntries(Object.entries(replicas[0].params).map(([k, v]) => [k, Float64Array.from(v)]));
    const { text } = await gen.generate(params, cfg, String(prompt ?? ''), tokens, { temperature, topK, seed, engine });
    return text;
  }

  // The replica as a state body; synchronous, so it is one consistent step even mid-run.
  snapshotBody(compute, optim) {
    const { cfg, replicas } = this.model;
    const r = replicas[0];
    return encodeState(compute.model.paramShapes(cfg), {
      config: compute.config.configToDict(cfg), step: this.modelStep, adamT: r.adam.t, params: r.params,
      m: optim ? r.adam.m : null, v: optim ? r.adam.v : null,
      weightHash: compute.hashing.weightHash(r.params), extra: this.modelExtra });
  }

  // POST the replica to a model route -> {blob, name, hash, step} of the file it made
  async modelFile(route, optim) {
    if (!this.model) throw new Error(NO_MODEL);
    const compute = await this.compute();
    const body = this.snapshotBody(compute, optim);
    const res = await fetch(route, { method: 'POST', body, headers: { 'Content-Type': 'application/octet-stream' } });
    if (!res.ok) throw new Error(await errorText(res));
    const disposition = res.headers.get('Content-Disposition') || '';
    const name = (/filename="([^"]+)"/.exec(disposition) || [])[1] || route.split('/').pop();
    return { blob: await res.blob(), name, hash: res.headers.get('X-Daisy-Weight-Hash'),
             step: Number(res.headers.get('X-Daisy-Step')) };
  }

  async download(route, optim) {
    const file = await this.modelFile(route, optim);
    saveBlob(file.blob, file.name);
    return `Saved ${file.name} (${formatBytes(file.blob.size)}; step ${file.step}, weights ${file.hash.slice(0, 16)}).`;
  }

  downloadCheckpoint() { return this.download('/api/checkpoint.pt', true); }
  downloadSafetensors() { return this.download('/api/model.safetensors', false); }
  downloadKit() { return this.download('/api/kit.html', false); }

  // A .pt (File, Blob, ArrayBuffer, bytes) -> checked by the server (/api/load) -> loadState;
  // or a state object (below) -> loadState. A refusal names the problem and changes nothing.
  async load(source) {
    try {
      if (this.run) throw new Error('a run is going: stop it before loading a checkpoint');
      let state = source;
      const isFile = source instanceof Blob || source instanceof ArrayBuffer || ArrayBuffer.isView(source);
      if (isFile) {
        const size = source.size ?? source.byteLength;
        if (size > MAX_CHECKPOINT_BYTES) {
          throw new Error(`the file is ${size.toLocaleString('en-US')} bytes, over the limit of ` +
                          `${MAX_CHECKPOINT_BYTES.toLocaleString('en-US')} bytes`);
        }
        const res = await fetch('/api/load', { method: 'POST', body: source, headers: { 'Content-Type': 'application/octet-stream' } });
        if (!res.ok) throw new Error(await errorText(res));
        state = decodeState(await res.arrayBuffer(), await this.compute());
      }
      return await this.loadState(state);
    } catch (err) {
      this.set({ error: `Checkpoint refused: ${err.message || err}` });
      throw err;
    }
  }

  // THE way a replica is replaced (a loaded file now, the group broadcast later).
  // state: {config (the 8 settings), step, adamT, params, m, v: {name: Float64Array} in any
  // key order, weightHash (optional: checked), extra (optional)}. Everything is checked before
  // anything changes; the arrays are copied. -> {step, hash, config}
  async loadState(state) {
    if (this.run) throw new Error('a run is going: stop it before loading a checkpoint');
    const c = await this.compute();
    if (!state || typeof state !== 'object') throw new Error('loadState needs a state object');
    const cfg = c.config.makeConfig(c.config.configToDict(state.config || {}));
    for (const [label, n] of [['step', state.step], ['adamT', state.adamT]]) {
      if (!Number.isInteger(n) || n < 0) throw new Error(`${label} must be a non-negative integer, got ${n}`);
    }
    const shapes = c.model.paramShapes(cfg);
    const group = (label, tensors) => {
      if (!tensors || typeof tensors !== 'object') throw new Error(`${label} is missing`);
      const names = new Set(shapes.map(([name]) => name));
      const unexpected = Object.keys(tensors).filter((k) => !names.has(k));
      if (unexpected.length) throw new Error(`${label} has unexpected tensor(s): ${unexpected.slice(0, 8).join(', ')}`);
      const out = {};
      for (const [name, shape] of shapes) {
        const a = tensors[name], n = shape.reduce((x, y) => x * y, 1);
        if (!(a instanceof Float64Array)) throw new Error(`${label}['${name}'] is missing or not a Float64Array`);
        if (a.length !== n) throw new Error(`${label}['${name}'] has ${a.length} values, the config needs ${n} (shape ${shape.join('x')})`);
        out[name] = Float64Array.from(a);
      }
      return out;
    };
    const params = group('model', state.params), m = group('optim.m', state.m), v = group('optim.v', state.v);
    const hash = c.hashing.weightHash(params);
    if (state.weightHash && state.weightHash !== hash) {
      throw new Error(`weight hash mismatch: the state says ${state.weightHash}, its weights hash to ${hash}`);
    }
    // checked: now replace the model
    this.model = new c.train.Group(cfg, 1, null, undefined, [new c.train.Replica(params, { t: state.adamT, m, v })]);
    this.modelStep = state.step;
    this.modelExtra = state.extra && typeof state.extra === 'object' ? { ...state.extra } : null;
    this.resumable = true;
    const left = cfg.steps - state.step;
    this.set({ config: cfg, step: state.step, totalSteps: cfg.steps, hash, loss: null, curve: [],
               tokensPerS: null, replicas: null, runState: 'loaded', leader: null, error: '',
               message: `Loaded a checkpoint at step ${state.step} of ${cfg.steps} (weights ${hash.slice(0, 16)}). ` +
                        (left > 0 ? `Start training resumes it for the remaining ${left} steps.` : 'Its run is complete.') });
    this.announce();
    this.bus.emit('model-loaded', { step: state.step, hash, config: { ...cfg } });
    return { step: state.step, hash, config: { ...cfg } };
  }
}

// ---- the state body (daisy/server.py documents it) ----------------------------------------

// shapes [[name, shape]] (model.paramShapes) and a replica -> ArrayBuffer. m and v null: weights only.
export function encodeState(shapes, { config, step, adamT, params, m = null, v = null, weightHash = null, extra = null }) {
  if (!LITTLE_ENDIAN) throw new Error('the state body is little-endian; this host is not');
  const groups = m ? [params, m, v] : [params];
  const header = { format: STATE_FORMAT, version: STATE_VERSION, config, step, adam_t: adamT,
                   parts: m ? PARTS_FULL : ['model'] };
  if (weightHash) header.weight_hash = weightHash;
  if (extra) header.extra = extra;
  const json = new TextEncoder().encode(JSON.stringify(header));
  const H = json.length + ((8 - (json.length % 8)) % 8);            // data starts 8-byte aligned
  const perPart = shapes.reduce((n, [, shape]) => n + shape.reduce((x, y) => x * y, 1), 0);
  const buf = new ArrayBuffer(8 + H + 8 * perPart * groups.length);
  new DataView(buf).setUint32(0, H, true);                          // u64 LE; the high word stays 0
  const bytes = new Uint8Array(buf);
  bytes.set(json, 8);
  bytes.fill(0x20, 8 + json.length, 8 + H);                         // JSON padded with spaces
  const values = new Float64Array(buf, 8 + H);
  let at = 0;
  for (const g of groups) for (const [name] of shapes) { values.set(g[name], at); at += g[name].length; }
  if (at !== values.length) throw new Error(`the replica holds ${at} values, its config needs ${values.length}`);
  return buf;
}

// ArrayBuffer -> {config, step, adamT, params, m, v, weightHash, extra} (loadState's form)
export function decodeState(buf, compute) {
  if (!LITTLE_ENDIAN) throw new Error('the state body is little-endian; this host is not');
  const view = new DataView(buf);
  if (buf.byteLength < 8) throw new Error(`the state body is ${buf.byteLength} bytes, too short`);
  const H = view.getUint32(0, true);
  if (view.getUint32(4, true) !== 0 || H % 8 || 8 + H > buf.byteLength) throw new Error('the state body has a bad header length');
  let header;
  try { header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, H))); } catch (e) {
    throw new Error(`the state header is not JSON (${e.message})`);
  }
  if (!header || header.format !== STATE_FORMAT || header.version !== STATE_VERSION) {
    throw new Error(`not a ${STATE_FORMAT} v${STATE_VERSION} body`);
  }
  const cfg = compute.config.makeConfig(header.config);
  const shapes = compute.model.paramShapes(cfg);
  const parts = header.parts || [];
  const perPart = shapes.reduce((n, [, shape]) => n + shape.reduce((x, y) => x * y, 1), 0);
  if (buf.byteLength - 8 - H !== 8 * perPart * parts.length) {
    throw new Error(`the state body holds ${buf.byteLength - 8 - H} bytes of tensors; its config needs ${8 * perPart * parts.length}`);
  }
  let at = 8 + H;
  const groups = parts.map(() => {
    const g = {};
    for (const [name, shape] of shapes) {
      const n = shape.reduce((x, y) => x * y, 1);
      g[name] = new Float64Array(buf, at, n);
      at += 8 * n;
    }
    return g;
  });
  return { config: header.config, step: header.step, adamT: header.adam_t, params: groups[0],
           m: groups[1] || null, v: groups[2] || null, weightHash: header.weight_hash || null,
           extra: header.extra || null };
}

// a refused request -> the server's message
async function errorText(res) {
  const body = await res.json().catch(() => null);
  return (body && body.error) || `HTTP ${res.status} ${res.statusText}`.trim();
}

function formatBytes(n) {
  return n < 1024 * 1024 ? `${(n / 1024).toFixed(1)} kB` : `${(n / 1024 / 1024).toFixed(1)} MB`;
}

// save a Blob as a download named `name` (the browser's download bar / folder)
function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  a.style.display = 'none';
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);     // the download has read it by then
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
    generate: (prompt, opts) => peer.generate(prompt, opts),
    downloadCheckpoint: () => peer.downloadCheckpoint(),
    downloadSafetensors: () => peer.downloadSafetensors(),
    downloadKit: () => peer.downloadKit(),
    load: (stateOrFile) => peer.load(stateOrFile),
  };
}
