// One round of bench/bench_threads.py in node: ms per training step (one peer; after `warmup`
// steps, the median of reps segments of `steps` steps) of the wasm-simd backend (engines.js) and
// of threads.js's backend on each thread count, and of unit_workers.js's (the unisolated page's:
// INT8 units on workers with copied buffers) on each --workers count, every run's final hash
// checked equal.
//   node bench/bench_threads.mjs --config default|largest --threads 1,2 [--workers 2] [--steps S] [--reps R] [--warmup W] [--json]
import { makeConfig } from '../frontend_js/config.js';
import { Group } from '../frontend_js/train.js';
import { bestBackend } from '../frontend_js/engines.js';
import { createThreadedBackend } from '../frontend_js/cpu/threads.js';
import { createUnitWorkersBackend } from '../frontend_js/cpu/unit_workers.js';
import { loadStream } from '../frontend_js/cli.mjs';
import { median } from './js_cpu_core.mjs';
import { CONFIGS } from './profile_cpu_step.mjs';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const config = opt('--config', 'default'), cfg = makeConfig(CONFIGS[config]);
const steps = Number(opt('--steps', 10)), reps = Number(opt('--reps', 3)), warmup = Number(opt('--warmup', 10));
const stream = loadStream(null);

// -> {ms (median over reps segments of `steps` steps, per step), hash (after warmup + reps*steps)}.
// One Group per backend: a largest-settings arena is ~0.5 GB, and the threaded backend's arenas
// live in its shared memory, which a collected Group gives back only when the GC runs.
async function time(backend) {
  const runs = [];
  const g = new Group(cfg, 1, stream, backend);
  for (let i = 0; i < warmup; i++) await g.step();
  let out;
  for (let r = 0; r < reps; r++) {
    const t = performance.now();
    for (let i = 0; i < steps; i++) out = await g.step();
    runs.push((performance.now() - t) / steps);
  }
  return { ms: median(runs), hash: out.hashes[0] };
}

const out = { config, steps, reps, warmup, ms: {} };
const ref = await time(await bestBackend());
out.ms['wasm-simd (engines.js, 1 thread)'] = ref.ms;
for (const n of opt('--threads', '1,2').split(',').map(Number)) {
  const be = await createThreadedBackend({ threads: n });
  const r = await time(be);
  be.close();
  if (r.hash !== ref.hash) throw new Error(`threads=${n} ended on hash ${r.hash}, wasm-simd on ${ref.hash}`);
  out.ms[`wasm-simd-threads x${n}`] = r.ms;
}
for (const n of opt('--workers', '').split(',').filter(Boolean).map(Number)) {
  const be = await createUnitWorkersBackend({ threads: n });
  const r = await time(be);
  be.close();
  if (r.hash !== ref.hash) throw new Error(`unit workers=${n} ended on hash ${r.hash}, wasm-simd on ${ref.hash}`);
  out.ms[`wasm-simd-workers x${n}`] = r.ms;
}
if (argv.includes('--json')) console.log(JSON.stringify(out));
else for (const [k, v] of Object.entries(out.ms)) console.log(`${k.padEnd(36)} ${v.toFixed(2)} ms/step`);
