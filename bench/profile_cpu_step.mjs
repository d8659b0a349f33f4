// Where one peer's CPU training step goes, phase by phase (issue 12, "Profile first"):
//   node bench/profile_cpu_step.mjs [--config default|largest|JSON] [--threads 0,1,2] [--steps N] [--warmup W] [--json]
// threads 0 = the wasm-simd backend (engines.js bestBackend, one thread, each kernel in its own
// memory); n >= 1 = threads.js's backend on n threads (the same kernels over one shared memory).
// Every backend part is wrapped with a clock: the INT8 unit (qmatmulT), each row piece, Adam, the
// hash; the threaded backend also times each kernel job (GEMM, quantize, epilogue, row kernels,
// and on n threads each job as a whole). What the wrappers do not cover is the model's own JS
// (embedding, head split/merge copies, residual adds, the wpe/wte gradients) and the reduce:
// "glue". The unit's time minus its kernels is staging (copies into and out of wasm memory, padding
// fills). Times are sums over `steps` steps after `warmup` steps, shown per step.
import { makeConfig } from '../frontend_js/config.js';
import { Group } from '../frontend_js/train.js';
import { bestBackend, makeBackend } from '../frontend_js/engines.js';
import { createThreadedBackend } from '../frontend_js/cpu/threads.js';
import { loadStream } from '../frontend_js/cli.mjs';

export const CONFIGS = {
  default: {},
  largest: { width: 128, seq_len: 128, batch: 32, layers: 2 },
};
const ROW_PIECES = ['rmsnorm', 'rmsnormBackward', 'causalSoftmax', 'softmaxBackward', 'relu', 'reluBackward', 'crossEntropy'];
// kernel -> phase
const PHASE = { gemm: 'GEMM', qrows: 'quantize', qcols: 'quantize', qcolsLd: 'quantize', epi: 'epilogue', copy: 'row kernels' };

class Clock {
  constructor() { this.ms = new Map(); }
  add(what, ms) { this.ms.set(what, (this.ms.get(what) || 0) + ms); }
  get(what) { return this.ms.get(what) || 0; }
}

// backend -> the same backend with every part timed into clock
function timed(be, clock) {
  const wrap = (what, f) => (...args) => { const t = performance.now(); try { return f(...args); } finally { clock.add(what, performance.now() - t); } };
  // the CPU parts return their value (not a promise), and model.js's both() starts two units
  // before awaiting either: time the synchronous call alone, so the overlap is not counted twice
  const wrapAsync = (what, f) => (...args) => {
    const t = performance.now(), r = f(...args);
    clock.add(what, performance.now() - t);
    return r;
  };
  const engine = { name: be.engine.name, qmatmulT: wrapAsync('unit', (...a) => be.engine.qmatmulT(...a)) };
  const rows = Object.fromEntries(ROW_PIECES.map((k) => [k, wrap('rows', be[k])]));
  const sha = { name: be.sha.name, hexOf: wrap('hash', (p) => be.sha.hexOf(p)) };
  const shaAsync = { name: be.shaAsync.name, hexOf: wrapAsync('hash', (p) => be.shaAsync.hexOf(p)) };
  return makeBackend({ engine, rows, adam: wrap('adam', be.adamStep), sha, shaAsync, parts: be.parts, notes: be.notes, newArena: be.newArena, threads: be.threads });
}

// -> {label, stepMs, phases: {phase: ms per step}}
export async function profile(settings, threads, { steps = 5, warmup = 3, stream = loadStream(null) } = {}) {
  const cfg = makeConfig(settings);
  const be = threads === 0 ? await bestBackend() : await createThreadedBackend({ threads });
  const clock = new Clock();
  const g = new Group(cfg, 1, stream, timed(be, clock));
  for (let i = 0; i < warmup; i++) await g.step();
  clock.ms.clear();
  if (be.profile) be.profile(clock);
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) await g.step();
  const total = (performance.now() - t0) / steps;
  if (be.close) be.close();
  const per = (x) => x / steps;
  const phases = {};
  let kernelsInUnit = 0, kernelsInRows = 0;
  for (const [what, ms] of clock.ms) {
    if (['unit', 'rows', 'adam', 'hash'].includes(what)) continue;
    const phase = PHASE[what] || (what.endsWith('(all threads)') ? (/^(qrows|qcols)/.test(what) ? 'quantize (all threads)'
      : /^gemm/.test(what) ? 'GEMM + epilogue (all threads)' : 'row kernels') : 'row kernels');
    phases[phase] = (phases[phase] || 0) + per(ms);
    if (/^(gemm|q|epi)/.test(what)) kernelsInUnit += per(ms); else kernelsInRows += per(ms);
  }
  if (threads === 0) {
    phases['INT8 unit (quantize + GEMM + epilogue + its copies)'] = per(clock.get('unit'));
    phases['row pieces (kernels + their copies)'] = per(clock.get('rows'));
  } else {
    phases['unit staging (copies, padding fills)'] = per(clock.get('unit')) - kernelsInUnit;
    phases['row pieces staging + cross-entropy loss'] = per(clock.get('rows')) - kernelsInRows;
  }
  phases.Adam = per(clock.get('adam'));
  phases.hash = per(clock.get('hash'));
  phases['glue (model copies, adds, embedding grads, reduce)'] = total - per(clock.get('unit') + clock.get('rows') + clock.get('adam') + clock.get('hash'));
  return { label: threads === 0 ? 'wasm-simd (1 thread)' : `wasm-simd-threads x${threads}`, stepMs: total, phases };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
  const c = opt('--config', 'default');
  const settings = CONFIGS[c] || JSON.parse(c);
  const out = [];
  for (const n of opt('--threads', '0,1,2').split(',').map(Number)) {
    out.push(await profile(settings, n, { steps: Number(opt('--steps', 5)), warmup: Number(opt('--warmup', 3)) }));
  }
  if (argv.includes('--json')) console.log(JSON.stringify({ config: c, runs: out }));
  else {
    console.log(`config ${c}; ms per step (share of the step)`);
    for (const r of out) {
      console.log(`\n${r.label}: ${r.stepMs.toFixed(1)} ms/step`);
      for (const [k, v] of Object.entries(r.phases)) console.log(`  ${k.padEnd(52)} ${v.toFixed(2).padStart(8)}  ${(100 * v / r.stepMs).toFixed(1).padStart(5)}%`);
    }
  }
}
