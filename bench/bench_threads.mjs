// One round of bench/bench_threads.py in node: ms per training step (one peer, median of reps
// runs of `steps` steps after `warmup` steps each) of the wasm-simd backend (engines.js) and of
// threads.js's backend on each thread count, every run's final hash checked equal.
//   node bench/bench_threads.mjs --config default|largest --threads 1,2 [--steps S] [--reps R] [--warmup W] [--json]
import { makeConfig } from '../frontend_js/config.js';
import { Group } from '../frontend_js/train.js';
import { bestBackend } from '../frontend_js/engines.js';
import { createThreadedBackend } from '../frontend_js/threads.js';
import { loadStream } from '../frontend_js/cli.mjs';
import { median } from './js_cpu_core.mjs';
import { CONFIGS } from './profile_cpu_step.mjs';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const config = opt('--config', 'default'), cfg = makeConfig(CONFIGS[config]);
const steps = Number(opt('--steps', 10)), reps = Number(opt('--reps', 3)), warmup = Number(opt('--warmup', 10));
const stream = loadStream(null);

// -> {ms (median per step), hash (after warmup + steps)}
async function time(backend) {
  const runs = [];
  let hash = null;
  for (let r = 0; r < reps; r++) {
    const g = new Group(cfg, 1, stream, backend);
    for (let i = 0; i < warmup; i++) await g.step();
    const t = performance.now();
    let out;
    for (let i = 0; i < steps; i++) out = await g.step();
    runs.push((performance.now() - t) / steps);
    if (hash !== null && out.hashes[0] !== hash) throw new Error(`rep ${r} ended on hash ${out.hashes[0]}, rep 0 on ${hash}`);
    hash = out.hashes[0];
  }
  return { ms: median(runs), hash };
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
if (argv.includes('--json')) console.log(JSON.stringify(out));
else for (const [k, v] of Object.entries(out.ms)) console.log(`${k.padEnd(36)} ${v.toFixed(2)} ms/step`);
