// The model a page holds: the last trained, training or loaded replica, and what can be done
// with it: generate text in the page (generate.js), turn it into files through the model routes
// (the state body, state_codec.js, POSTed to /api/checkpoint.pt, /api/model.safetensors,
// /api/kit.html), and load a checkpoint (/api/load checks the .pt; loadState is THE way a
// replica is replaced). A loaded checkpoint or a stopped run can be continued from its step with
// its config (resumePoint; run/start.js start({resume: true})).
//   const models = new ModelStore(peer);   models.adopt(cfg, replica, step, extra)
import { encodeState, decodeState } from '../state_codec.js';
import { short, weightHash } from '../hashing.js';
import { makeConfig, configToDict } from '../config.js';
import { paramShapes } from '../model.js';
import { Replica } from '../train.js';

const MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024;   // = daisy.space.model_routes.MAX_CHECKPOINT_BYTES
export const NO_MODEL = 'no model yet: train or load one first';

export class ModelStore {
  constructor(peer) {
    this.peer = peer;
    this.model = null;         // {cfg, replicas: [Replica]}: generation and files read it
    this.step = 0;             // the model's step (a checkpoint's `step`)
    this.extra = null;         // what the model was trained on ({data, data_id}), kept in files
    this.resumable = false;    // a loaded model: start() without `resume` continues it (as it always did)
    this.stopped = false;      // a stopped run's state, whole (its Adam count at its step): start({resume: true}) continues it
  }

  // the model a run trains (generation and files read it mid-run too)
  adopt(cfg, replica, step, extra) {
    this.model = { cfg, replicas: [replica] };
    this.step = step;
    this.extra = extra;
    this.resumable = false;
    this.stopped = false;
  }

  has() { return this.model !== null; }

  // What Continue would do: {step, steps, from: 'loaded' | 'stopped'} while this tab holds a
  // loaded checkpoint or a stopped run short of its last step; else null (state().resumable).
  resumePoint() {
    if (!this.model || !(this.resumable || this.stopped)) return null;
    const steps = this.model.cfg.steps;
    if (this.step >= steps) return null;
    return { step: this.step, steps, from: this.resumable ? 'loaded' : 'stopped' };
  }

  // a run ended: its state can be continued when it stopped cleanly between steps (not after a
  // replica mismatch or a failure: those states are not the group's)
  runEnded(replica, runState, error) {
    this.stopped = runState === 'stopped' && error !== 'replica mismatch' && replica.adam.t === this.step;
  }

  // Text continuing `prompt`, sampled in this page from the current weights (a copy: a run
  // going on meanwhile does not change them mid-way). Same bits as daisy.generate.generate.
  async generate(prompt, { temperature = 0.8, topK = 40, seed = 0, tokens = 200 } = {}) {
    if (!this.model) throw new Error(NO_MODEL);
    if (!this.peer.modules.has('generate.js')) throw new Error('generation not available: frontend_js/generate.js is missing');
    const gen = await import('../generate.js');
    // the fastest CPU backend whose gates passed (same bits as every backend)
    const backend = await this.peer.loadCpuBackend();
    const { cfg, replicas } = this.model;
    const params = Object.fromEntries(Object.entries(replicas[0].params).map(([k, v]) => [k, Float64Array.from(v)]));
    const { text } = await gen.generate(params, cfg, String(prompt ?? ''), tokens, { temperature, topK, seed, backend });
    return text;
  }

  // The replica as a state body; synchronous, so it is one consistent step even mid-run.
  snapshotBody(optim) {
    const { cfg, replicas } = this.model;
    const r = replicas[0];
    return encodeState(paramShapes(cfg), {
      config: configToDict(cfg), step: this.step, adamT: r.adam.t, params: r.params,
      m: optim ? r.adam.m : null, v: optim ? r.adam.v : null,
      weightHash: weightHash(r.params), extra: this.extra });
  }

  // POST the replica to a model route -> {blob, name, hash, step} of the file it made
  async file(route, optim) {
    if (!this.model) throw new Error(NO_MODEL);
    const body = this.snapshotBody(optim);
    const res = await fetch(this.peer.serverUrl(route), { method: 'POST', body, headers: { 'Content-Type': 'application/octet-stream' } });
    if (!res.ok) throw new Error(await errorText(res));
    const disposition = res.headers.get('Content-Disposition') || '';
    const name = (/filename="([^"]+)"/.exec(disposition) || [])[1] || route.split('/').pop();
    return { blob: await res.blob(), name, hash: res.headers.get('X-Daisy-Weight-Hash'),
             step: Number(res.headers.get('X-Daisy-Step')) };
  }

  async download(route, optim) {
    const file = await this.file(route, optim);
    saveBlob(file.blob, file.name);
    return `Saved ${file.name} (${formatBytes(file.blob.size)}; step ${file.step}, weights ${short(file.hash)}).`;
  }

  downloadCheckpoint() { return this.download('/api/checkpoint.pt', true); }
  downloadSafetensors() { return this.download('/api/model.safetensors', false); }
  downloadKit() { return this.download('/api/kit.html', false); }

  // A .pt (File, Blob, ArrayBuffer, bytes) -> checked by the server (/api/load) -> loadState;
  // or a state object (below) -> loadState. A refusal names the problem and changes nothing.
  async load(source) {
    try {
      if (this.peer.runs.busy) throw new Error('a run is going: stop it before loading a checkpoint');
      let state = source;
      const isFile = source instanceof Blob || source instanceof ArrayBuffer || ArrayBuffer.isView(source);
      if (isFile) {
        const size = source.size ?? source.byteLength;
        if (size > MAX_CHECKPOINT_BYTES) {
          throw new Error(`the file is ${size.toLocaleString('en-US')} bytes, over the limit of ` +
                          `${MAX_CHECKPOINT_BYTES.toLocaleString('en-US')} bytes`);
        }
        const res = await fetch(this.peer.serverUrl('/api/load'), { method: 'POST', body: source, headers: { 'Content-Type': 'application/octet-stream' } });
        if (!res.ok) throw new Error(await errorText(res));
        state = decodeState(await res.arrayBuffer());
      }
      const loaded = await this.loadState(state);
      // the whole idle group takes the file too (group_state.js), so Start anywhere resumes it
      this.peer.restore?.share().catch((err) => this.peer.note(`The checkpoint was not sent to the group: ${err.message || err}`));
      return loaded;
    } catch (err) {
      this.peer.set({ error: `Checkpoint refused: ${err.message || err}` });
      throw err;
    }
  }

  // THE way a replica is replaced (a loaded file, or a peer's through GROUP_STATE).
  // state: {config (the 8 settings), step, adamT, params, m, v: {name: Float64Array} in any
  // key order, weightHash (optional: checked), extra (optional)}. Everything is checked before
  // anything changes; the arrays are copied. hashed: the weight hash this device already computed
  // over state.params (readPeerState's), so a group restore hashes the weights once; else null and
  // they are hashed here. -> {step, hash, config}
  async loadState(state, hashed = null) {
    if (this.peer.runs.busy) throw new Error('a run is going: stop it before loading a checkpoint');
    if (!state || typeof state !== 'object') throw new Error('loadState needs a state object');
    const cfg = makeConfig(configToDict(state.config || {}));
    for (const [label, n] of [['step', state.step], ['adamT', state.adamT]]) {
      if (!Number.isInteger(n) || n < 0) throw new Error(`${label} must be a non-negative integer, got ${n}`);
    }
    const shapes = paramShapes(cfg);
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
    const hash = hashed ?? weightHash(params);
    if (state.weightHash && state.weightHash !== hash) {
      throw new Error(`weight hash mismatch: the state says ${state.weightHash}, its weights hash to ${hash}`);
    }
    // checked: now replace the model
    this.model = { cfg, replicas: [new Replica(params, { t: state.adamT, m, v })] };
    this.step = state.step;
    this.extra = state.extra && typeof state.extra === 'object' ? { ...state.extra } : null;
    this.resumable = true;
    this.stopped = false;
    const left = cfg.steps - state.step;
    this.peer.set({ config: cfg, step: state.step, totalSteps: cfg.steps, hash, loss: null, curve: [],
               tokensPerS: null, speed: null, replicas: null, runState: 'loaded', leader: null, error: '',
               message: `Loaded a checkpoint at step ${state.step} of ${cfg.steps} (weights ${short(hash)}). ` +
                        (left > 0 ? `Continue from step ${state.step} trains its remaining ${left} steps; Start a new run begins again from step 0.`
                                  : 'Its run is complete: Start a new run trains a new model from step 0 with the settings on the left.') });
    this.peer.announce();
    this.peer.bus.emit('model-loaded', { step: state.step, hash, config: { ...cfg } });
    return { step: state.step, hash, config: { ...cfg } };
  }
}

// a refused request -> the server's message
export async function errorText(res) {
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

