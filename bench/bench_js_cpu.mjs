// JS CPU mirror speed in node (bench/js_cpu_core.mjs): `node bench/bench_js_cpu.mjs [--json] [--steps N] [--reps R]`
// bench/bench_js_cpu.py runs this and the same bench in headless Chromium next to the PyTorch
// float32 baseline in the same run.
import { loadStream } from '../frontend_js/cli.mjs';
import { runBench } from './js_cpu_core.mjs';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? Number(argv[i + 1]) : d; };
const out = await runBench(loadStream(null), { steps: opt('--steps', 10), reps: opt('--reps', 5) });
if (argv.includes('--json')) console.log(JSON.stringify(out));
else {
  console.log(`ms per training step (median of ${out.reps} runs):`);
  for (const [k, v] of Object.entries(out.step_ms)) console.log(`  ${k.padEnd(30)} ${v.toFixed(2)}`);
  console.log('int8 GEMM GOPS (scalar / wasm-simd):');
  for (const g of out.gemm_gops) console.log(`  ${g.what.padEnd(30)} ${g.scalar.toFixed(2)} / ${g.wasm.toFixed(2)}`);
}
