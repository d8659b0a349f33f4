// The one registry of compute backends (docs/ARCHITECTURE.md "Compute"): the page (peer.js
// detectPath) and the CLI (cli.mjs --threads, --gpu) ask pickBackend, nothing else picks.
// Every backend gives the same bits (docs/VERIFICATION.md "Thread partitions", §9), so the
// choice is speed only, and it is measured on this device, not guessed:
//   CPU    the threaded backend (cpu/threads.js: every part on every core over one shared memory;
//          needs more than one core and SharedArrayBuffer), else the unit workers
//          (cpu/unit_workers.js: the INT8 units on every core with copied buffers), else the
//          one-thread parts (engines.js bestBackend(): wasm-simd, or the JS mirror)
//   GPU    gpu/ (the WebGPU engine, its kernels gated against the CPU mirror at boot) with the CPU
//          backend's other parts; its route 'measure' times each GEMM shape on the GPU and on the
//          CPU backend's engine in the first steps and keeps the faster (gpu/route.js), so the
//          page runs the faster path at the run's own settings and says by how much
// A candidate whose module the server does not have (`has(path)` false: the page imports only
// what exists) or whose start fails is passed over, and the reason says why.
// Modes (the page's ?gpu=, the CLI's --gpu): 'auto' (measured: the GEMM route confirmed by whole
// steps, and on a hardware adapter the resident step timed against the CPU in whole replica steps
// at each run's settings, PickedBackend.prepare), 'all' (every GEMM on the GPU: checking a GPU),
// 'resident' (the whole step on the GPU: gpu/resident.js; the run's trainer is a ResidentTrainer,
// made by PickedBackend.trainer), 'off' (the CPU backend only).
// The run loop and the CLI get their trainer from PickedBackend.trainer(cfg, replica, batches):
// they never know which one they hold.
import { bestBackend, withEngine } from './engines.js';
import { defaultThreads } from './cpu/workers.js';
import { Trainer, Replica } from './train.js';
import { lossAndGrads, NORM_EPS, initParams, paramShapes } from './model.js';
import * as optim from './optim.js';
import { treeSum } from './detmath.js';
import { VOCAB_SIZE } from './tokenizer.js';
import { weightHash } from './hashing.js';

export const GPU_MODES = Object.freeze(['auto', 'all', 'resident', 'off']);

// --- the rule in words: pure -------------------------------------------------------------------

// The CPU backend's short name: 'wasm-simd', 'wasm-simd × 4 threads', 'wasm-simd × 4 workers'
export function cpuName(backend, threads) {
  if (!backend) return 'cpu';
  return backend.threads > 1 ? `wasm-simd × ${backend.threads} ${threads && !threads.shared ? 'workers' : 'threads'}` : backend.name;
}

const times = (x) => `${x >= 10 ? x.toFixed(0) : x.toFixed(1)}×`;

// What the page shows and announces for a choice -> {path, pathLabel, pathReason, engine}.
//   mode     'auto' | 'all' | 'off'
//   cpu      the CPU backend's name (cpuName), threads {count, shared, reason} or null
//   gpu      null (no WebGPU), or {state, reason}: state 'off' (mode off), 'missing' (no engine in
//            this build), 'failed' (the engine threw at start), 'unusable' (no kernel passed its
//            gate), 'software' (a software adapter: nothing routed there), 'fault' (disabled after
//            a fault), 'gpu' (booted; measure: the engine's summary once decided, gpu/route.js),
//            'resident' (the resident step's kernels passed their gates; adapter: its words)
// path is where the GEMMs run: 'gpu' only when some of them run there.
export function describeChoice({ mode, cpu, threads = null, gpu }) {
  const t = threads;
  const threadsWhy = t && t.count > 1 ? `the CPU backend runs on ${t.count} threads${t.reason ? ` (${t.reason})` : ''}`
    : t ? `the CPU backend runs on one thread: ${t.reason}` : '';
  const withThreads = (reason) => (threadsWhy ? `${reason}; ${threadsWhy}` : reason);
  const onCpu = (short, reason) => ({ path: 'cpu', pathLabel: `CPU (${cpu}) — ${short}`, pathReason: withThreads(reason), engine: cpu });
  if (!gpu) return onCpu('no WebGPU', 'WebGPU not available in this browser');
  const { state, reason = '', kernel = 'GPU', routing = '', measure = null } = gpu;
  if (state === 'off') return onCpu('WebGPU off (?gpu=off)', 'WebGPU turned off by ?gpu=off');
  if (state === 'missing') return onCpu('no GPU engine in this build', 'GPU engine not available in this build');
  if (state === 'failed') return onCpu('GPU engine failed to start', `GPU engine failed to start: ${reason}`);
  if (state === 'unusable') return onCpu('GPU unusable', `GPU unusable: ${reason || 'no reason given'}`);
  if (state === 'fault') return onCpu('GPU disabled after a fault', `GPU disabled: ${reason}`);
  if (state === 'resident') {
    return { path: 'gpu', pathLabel: 'GPU (WebGPU, the whole step resident)', pathReason: withThreads(`the resident step on ${gpu.adapter || 'the WebGPU adapter'}: `
      + 'weights, moments and activations on the GPU, every kernel gated against the CPU mirror; the exchange and the checks on the CPU backend'),
    engine: `webgpu resident step (else ${cpu})` };
  }
  const booted = `WebGPU ${kernel} kernel, gates passed; ${routing}`;
  if (state === 'software') return onCpu('WebGPU adapter is software', booted);
  if (mode === 'all') {
    return { path: 'gpu', pathLabel: 'GPU (WebGPU, every GEMM)', pathReason: withThreads(booted), engine: `webgpu (every GEMM; else ${cpu})` };
  }
  if (!measure) {
    return { path: 'gpu', pathLabel: 'GPU (WebGPU) — timing it against the CPU', pathReason: withThreads(booted),
      engine: `webgpu (GEMM shapes being timed against ${cpu})` };
  }
  const m = measure, w = m.wholeSteps;
  const detail = `${booted}: over the calls timed, the CPU path ${m.cpuMs.toFixed(1)} ms, the GPU path ${m.gpuMs.toFixed(1)} ms, `
    + `${m.gpuShapes} of ${m.shapes} GEMM shapes on the GPU`
    + (w ? `; whole steps: the CPU path ${w.cpuMs.toFixed(1)} ms, the measured route ${w.pickedMs.toFixed(1)} ms` : '');
  if (w && w.side === 'cpu') {
    return onCpu(`GPU route ${(w.cpuMs / w.pickedMs).toFixed(2)}× this device's CPU here (whole steps)`, `${detail} (the CPU is faster in whole steps at these settings)`);
  }
  if (m.gpuShapes === 0) return onCpu(`GPU ${m.gpuVsCpu.toFixed(2)}× this device's CPU here`, `${detail} (the CPU is faster at these settings)`);
  return { path: 'gpu', pathLabel: `GPU: ${times(m.speedup)} this device's CPU at these settings`, pathReason: withThreads(detail),
    engine: `webgpu (${m.gpuShapes} of ${m.shapes} GEMM shapes; else ${cpu})` };
}

// The engine's state -> describeChoice's gpu argument
export function gpuState(engine) {
  const s = engine.status;
  if (s.path !== 'gpu') {
    const last = s.reasons.slice(-1)[0] || '';
    return engine.booted ? { state: 'fault', reason: last } : { state: 'unusable', reason: last };
  }
  const software = engine.route && engine.route.minMacs === Infinity;
  return { state: software ? 'software' : 'gpu', kernel: s.kernel, routing: s.routing, measure: s.measure || null };
}

// --- the CPU backend ---------------------------------------------------------------------------

// -> {backend, threads: {count, shared, reason}}: the CPU candidate, best first (see the header).
// threads: a count (the CLI's --threads: the threaded backend on exactly that many), 'auto' (every
// core the device reports), or 1 (the one-thread parts). has(path): whether frontend_js/<path> is
// served (default: everything is)
export async function pickCpuBackend({ threads = 'auto', has = () => true } = {}) {
  const n = threads === 'auto' ? await defaultThreads() : threads;
  if (threads !== 'auto' && n > 1) {          // asked for by count: no fallback, its error stands
    const { createThreadedBackend } = await import('./cpu/threads.js');
    return { backend: await createThreadedBackend({ threads: n }), threads: { count: n, shared: true, reason: null } };
  }
  let reason = n < 2 ? (threads === 'auto' ? 'this device reports one core' : 'one thread asked for') : null;
  if (!reason && !has('cpu/threads.js')) reason = 'cpu/threads.js is missing';
  if (!reason) {
    try {
      const mod = await import('./cpu/threads.js');
      reason = mod.threadsUnavailable();
      if (!reason) return { backend: await mod.createThreadedBackend({ threads: n }), threads: { count: n, shared: true, reason: null } };
    } catch (err) {
      reason = `the threaded backend failed: ${err.message || err}`;
      console.warn('daisy:', reason);
    }
    if (has('cpu/unit_workers.js')) {
      try {
        const backend = await (await import('./cpu/unit_workers.js')).createUnitWorkersBackend({ threads: n });
        return { backend, threads: { count: n, shared: false, reason: `${reason}: the INT8 units run on ${n} threads with copied buffers, the row kernels on one` } };
      } catch (err) {
        reason = `${reason}; the unit workers failed: ${err.message || err}`;
        console.warn('daisy:', reason);
      }
    }
  }
  return { backend: await bestBackend(), threads: { count: 1, shared: false, reason } };
}

// --- the pick ------------------------------------------------------------------------------------

// The choice, live: the GPU engine may fault or finish measuring after the pick. backend is the
// backend of the next step; describe() what the page shows. onChange(description) hears every
// change after the pick (a fault, a measurement): the page sets its state and announces it, so
// the peer table and the compute line agree.
export class PickedBackend {
  constructor({ mode, cpu, threads, gpuModule = null, engine = null, gpuBackend = null, gpu = null, resident = null, residentCandidate = null,
    timeSteps = timeTrainers }) {
    this.mode = mode; this.cpu = cpu; this.threads = threads;
    this.gpuModule = gpuModule; this.engine = engine; this.gpuBackend = gpuBackend;
    this.gpu = gpu;                       // describeChoice's gpu argument when there is no engine
    this.resident = resident;             // gpu/resident.js createResidentStep's parts (mode 'resident'), until a fault
    this.settledFor = new Set();          // the settings (shape keys) whose paths prepare() timed
    this.residentCandidate = residentCandidate;   // mode 'auto' on a hardware adapter: the resident step, timed per settings
    this.residentTimes = new Map();       // settings key -> {residentMs, cpuMs, chosen}: whole steps timed at those settings
    this.timeSteps = timeSteps;           // timeTrainers (the tests script its medians)
    this.prepared = null;                 // the last prepare()'s verdict on the resident step, for describe()
    this.changeCallbacks = [];
  }

  get backend() { return this.gpuBackend && this.engine.status.path === 'gpu' ? this.gpuBackend : this.cpu; }

  // The trainer of a replica (train.js Trainer's interface): a ResidentTrainer in mode
  // 'resident' (not for local steps), else a Trainer on `backend`. concurrent: other trainers of
  // this process step beside it (a train.js Group of several): a ResidentTrainer then leases from
  // kernels of its own (ResidentKernels.own); a page's one trainer shares the registry's
  trainer(cfg, replica, batches, { concurrent = false } = {}) {
    const resident = this.resident || (this.residentTimes.get(settingsKey(cfg))?.chosen ? this.residentCandidate : null);
    if (!resident || cfg.local_steps > 1) return new Trainer(cfg, replica, batches, this.backend);
    return this.residentTrainer(resident, cfg, replica, batches, concurrent);
  }

  residentTrainer({ kernels, unit, ResidentTrainer }, cfg, replica, batches, ownKernels = false) {
    return new ResidentTrainer({ kernels, unit, cfg, replica, batches, cpu: this.cpu, ownKernels, onFault: (reason) => this.residentFault(reason),
      lib: { treeSum, NORM_EPS, VOCAB_SIZE, optim, weightHash, lossAndGrads, paramShapes } });
  }

  // Before a run's first step (a page's start, a member's accept; the CLI's pickBackend with
  // settings): a measured GPU route is timed at the run's settings, shapes then whole steps
  // (settle), once per settings. Nothing else to do on the CPU, a fixed route or the resident step.
  // In mode 'auto' on a hardware adapter the resident step is then timed too, whole replica steps
  // against the faster of the CPU and the route (timeTrainers), and runs at these settings only
  // where it wins by more than route.js's margin (a run of local steps keeps a Trainer); medians
  // within route.js's WHOLE_STEP_CLOSE of each other are timed again on more steps first.
  async prepare(cfg) {
    const key = settingsKey(cfg);
    if (this.settledFor.has(key)) { this.prepared = this.residentTimes.get(key) ?? null; this.changed(); return; }
    this.settledFor.add(key);
    if (this.engine?.route?.measure && this.engine.status.path === 'gpu') await settle(this, cfg);
    this.prepared = null;
    if (!this.residentCandidate || cfg.local_steps > 1) return;
    const { wholeStepSide, wholeStepsClose, WHOLE_STEP_MORE_REPS } = await import('./gpu/route.js');
    const candidate = this.residentCandidate;
    try {
      const makers = [(c, r, b) => new Trainer(c, r, b, this.backend), (c, r, b) => this.residentTrainer(candidate, c, r, b)];
      let [cpuMs, residentMs] = await this.timeSteps(makers, cfg);
      // too close to call on three steps each: decided on more
      if (this.residentCandidate && wholeStepsClose(cpuMs, residentMs)) [cpuMs, residentMs] = await this.timeSteps(makers, cfg, WHOLE_STEP_MORE_REPS);
      if (!this.residentCandidate) return;            // it faulted while timed (residentFault said so)
      this.prepared = { residentMs, cpuMs, chosen: wholeStepSide(cpuMs, residentMs) === 'gpu' };
      this.residentTimes.set(key, this.prepared);
    } catch (err) {
      this.residentFault(`the resident step failed while timed: ${err.message || err}`);
      return;
    }
    this.changed();
  }

  // the resident step failed (a GPU error): every trainer made after is the CPU's, the panel says why
  // (mode 'auto': the candidate is dropped, the rest of the GPU path stays as measured)
  residentFault(reason) {
    if (this.resident) {
      this.resident = null;
      this.gpu = { state: 'fault', reason };
    } else if (this.residentCandidate) {
      this.residentCandidate = null;
      this.residentTimes.clear();
      this.prepared = { fault: reason };
    } else return;
    this.changed();
  }

  describe() {
    const d = describeChoice({ mode: this.mode, cpu: cpuName(this.cpu, this.threads), threads: this.threads,
      gpu: this.engine ? gpuState(this.engine) : this.gpu });
    return this.prepared ? withResidentTimed(d, this.prepared) : d;
  }

  onChange(cb) { this.changeCallbacks.push(cb); }

  changed() {
    const d = this.describe();
    for (const cb of this.changeCallbacks) { try { cb(d); } catch (e) { console.error('daisy: onChange callback threw', e); } }
  }
}

// -> PickedBackend. gpu: navigator.gpu (a page) or the `webgpu` package's GPU (Node), null for
// none; threads: see pickCpuBackend; mode: GPU_MODES; has(path): whether frontend_js/<path> is
// served; onChange: PickedBackend.onChange; engineOpts: more createGpuEngine options (tests:
// now, routeRule, kernelBase). settings: a config (config.js makeConfig) to time the paths at
// now, before any run (settle below); without it they are timed in the run's first steps.
export async function pickBackend({ gpu = null, threads = 'auto', mode = 'auto', has = () => true, onChange = null,
  engineOpts = {}, settings = null } = {}) {
  if (!GPU_MODES.includes(mode)) throw new Error(`unknown GPU mode ${JSON.stringify(mode)}: one of ${GPU_MODES.join(', ')}`);
  const { backend: cpu, threads: t } = await pickCpuBackend({ threads, has });
  const base = { mode, cpu, threads: t };
  let picked;
  if (mode === 'off') picked = new PickedBackend({ ...base, gpu: { state: 'off' } });
  else if (!gpu) picked = new PickedBackend({ ...base, gpu: null });
  else if (!has('gpu/gpu.js')) picked = new PickedBackend({ ...base, gpu: { state: 'missing' } });
  else if (mode === 'resident') {
    try {
      const gpuModule = await import('./gpu/gpu.js');
      const step = await gpuModule.createResidentStep(gpu, { kernelBase: engineOpts.kernelBase });
      const a = step.info;
      const adapter = `${[a.vendor, a.device || a.description].filter(Boolean).join(' ') || 'an adapter'}${a.isFallbackAdapter ? ' (a software adapter)' : ''}`;
      picked = new PickedBackend({ ...base, gpu: { state: 'resident', adapter }, resident: { ...step, ResidentTrainer: gpuModule.ResidentTrainer } });
    } catch (err) {
      picked = new PickedBackend({ ...base, gpu: { state: 'unusable', reason: `the resident step: ${err.message || err}` } });
    }
  } else {
    try {
      const gpuModule = await import('./gpu/gpu.js');
      const engine = await gpuModule.createGpuEngine({ gpu, route: mode === 'all' ? 'all' : 'measure', cpu: cpu.engine, ...engineOpts });
      engine.booted = true;                 // from here on, leaving the GPU is a fault (gpuState)
      // mode 'auto' on a hardware adapter: the resident step too, timed against the others at a
      // run's settings (prepare); a software adapter runs on this CPU and would only lose
      let residentCandidate = null;
      if (mode === 'auto' && engine.status.path === 'gpu' && !engine.status.adapter?.isFallbackAdapter) {
        residentCandidate = await gpuModule.createResidentStep(gpu, { kernelBase: engineOpts.kernelBase })
          .then((step) => ({ ...step, ResidentTrainer: gpuModule.ResidentTrainer }), () => null);
      }
      picked = new PickedBackend({ ...base, gpuModule, engine, gpuBackend: withEngine(cpu, engine), residentCandidate });
      engine.onFault(() => picked.changed());
      engine.onMeasured(() => picked.changed());
    } catch (err) {
      picked = new PickedBackend({ ...base, gpu: { state: 'failed', reason: `${err.message || err}` } });
    }
  }
  if (onChange) picked.onChange(onChange);
  if (settings) await picked.prepare(settings);
  return picked;
}

const settingsKey = (cfg) => JSON.stringify([cfg.width, cfg.seq_len, cfg.batch, cfg.layers, cfg.heads]);

// The compute line once prepare() timed the resident step at a run's settings
function withResidentTimed(d, { residentMs, cpuMs, chosen, fault = null }) {
  if (fault) return { ...d, pathReason: `${d.pathReason}; the resident step is off: ${fault}` };
  const timed = `whole steps at these settings: the resident step ${residentMs.toFixed(1)} ms, the other path ${cpuMs.toFixed(1)} ms`;
  if (!chosen) return { ...d, pathReason: `${d.pathReason}; ${timed} (the resident step is slower here)` };
  return { path: 'gpu', pathLabel: `GPU (WebGPU, the whole step resident): ${times(cpuMs / residentMs)} this device's CPU at these settings`,
    pathReason: `${timed}; ${d.pathReason}`, engine: `webgpu resident step (else ${d.engine})` };
}

// Whole replica steps (a local step, then Adam with its own gradient) of each candidate trainer
// at `cfg`, made by makers[i](cfg, replica, batches), on fixed tokens: each candidate in its own
// block, warmed up for at least `warmupMs` (at least one step, at most WARMUP_STEPS), then `reps`
// steps -> the medians (ms). The replicas are thrown away. Blocks, not alternation: a GPU left idle
// while the CPU trainer ran its step was slow again after it (likely clocked down): a resident
// step timed right after took ~3x its steady time for its first 4-6 steps (TEST_RESULTS.md
// "Where the resident step's host time went").
export const WARMUP_MS = 300, WARMUP_STEPS = 16;
export async function timeTrainers(makers, cfg, reps = 3, { warmupMs = WARMUP_MS } = {}) {
  const B = cfg.batch, T = cfg.seq_len;
  const x = Int32Array.from({ length: B * T }, (_, i) => (i * 7919) % VOCAB_SIZE);
  const y = Int32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % VOCAB_SIZE);
  const batches = { get: async () => ({ x, y }) };
  const trainers = makers.map((make) => {
    const params = initParams(cfg);
    return make(cfg, new Replica(params, optim.adamInit(params)), batches);
  });
  const wholeStep = async (t, r) => {
    const arena = t.backend?.newArena?.();
    const t0 = performance.now();
    const { grads } = await t.localStep(r, 0, arena);
    await t.apply(grads);
    return performance.now() - t0;
  };
  const ms = makers.map(() => []);
  try {
    for (const [i, t] of trainers.entries()) {
      let r = 0;
      for (const start = performance.now(); r === 0 || (r < WARMUP_STEPS && performance.now() - start < warmupMs); r++) await wholeStep(t, r);
      for (let k = 0; k < reps; k++, r++) ms[i].push(await wholeStep(t, r));
    }
  } finally {
    for (const t of trainers) t.destroy?.();
  }
  return ms.map(median);
}

// Times the paths at `settings` now: local steps of a seeded model on fixed tokens through the
// picked backend until every GEMM shape is decided (gpu/route.js MEASURE; at most maxSteps); then,
// when the shapes put any call on the GPU, whole local steps on the measured route and on the CPU
// backend, alternately (`wholeSteps` each after a warm-up of each; engine.wholeStepsTimed keeps the
// route only where whole steps are faster). The weights are thrown away; nothing a run computes
// depends on it.
export async function settle(picked, settings, maxSteps = 8, wholeSteps = 3) {
  const [{ initParams, lossAndGrads }, { VOCAB_SIZE }, { measureSummary }] = await Promise.all([import('./model.js'), import('./tokenizer.js'), import('./gpu/route.js')]);
  const cfg = settings, B = cfg.batch, T = cfg.seq_len, params = initParams(cfg), engine = picked.engine;
  const idx = Int32Array.from({ length: B * T }, (_, i) => (i * 7919) % VOCAB_SIZE);
  const targets = Int32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % VOCAB_SIZE);
  const onGpu = () => engine.status.path === 'gpu';
  const step = (backend) => picked.gpuModule.withGpuFallback(engine, () => lossAndGrads(params, cfg, idx, targets, B, T, backend));
  const shapes = () => measureSummary(engine.shapeTimes);        // the shapes' verdict alone (no whole steps)
  for (let s = 0; s < maxSteps && onGpu(); s++) {
    await step(picked.backend);
    if (shapes().decided) break;                                  // every shape of these settings decided
  }
  if (!onGpu() || !shapes().decided || shapes().gpuShapes === 0) return;
  engine.wholeSteps = null;                                       // the route as the shapes chose it, timed
  const cpu = [], route = [];
  for (let r = 0; r <= wholeSteps && onGpu(); r++) {
    for (const [backend, into] of [[picked.backend, route], [picked.cpu, cpu]]) {
      const t0 = performance.now();
      await step(backend);
      if (r > 0) into.push(performance.now() - t0);           // r = 0: the warm-up of each
    }
  }
  if (onGpu() && cpu.length === wholeSteps && route.length === wholeSteps) engine.wholeStepsTimed({ cpuMs: median(cpu), pickedMs: median(route) });
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b), h = s.length >> 1; return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2; };
