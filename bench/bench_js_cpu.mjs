// JS CPU mirror speed: ms per training step (default config, one peer = one loss_and_grads + Adam
// + hash) and int8 GEMM GOPS (2 ops per MAC) at the model's shapes and 512^3, scalar vs wasm-simd.
// Median of REPS runs. `node bench/bench_js_cpu.mjs [--json] [--steps N] [--reps R]`
// bench/bench_js_cpu.py runs this next to the PyTorch float32 baseline in the same run.
import { makeConfig } from '../frontend_js/config.js';
import { Group } from '../frontend_js/train.js';
import { loadStream } from '../frontend_js/cli.mjs';
import { engines } from '../frontend_js/engines.js';
import { cpuEngine } from '../frontend_js/units.js';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? Number(argv[i + 1]) : d; };
const STEPS = opt('--steps', 10), REPS = opt('--reps', 5);
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };

const wasm = engines().find((e) => e.name === 'wasm-simd');
const cfg = makeConfig({});
const stream = loadStream(null);

async function stepMs(engine, peers, steps) {
  const times = [];
  for (let r = 0; r < REPS; r++) {
    const g = new Group(cfg, peers, stream, engine);
    await g.step();                                             // warm-up
    const t = performance.now();
    for (let i = 0; i < steps; i++) await g.step();
    times.push((performance.now() - t) / steps);
  }
  return median(times);
}

function int8(n, seed) {
  const q = new Int8Array(n); let s = seed;
  for (let i = 0; i < n; i++) { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; q[i] = (s >>> 24) % 255 - 127; }
  return q;
}

function gemmGops(engine, nb, M, K, N) {
  const qa = int8(nb * M * K, 1), qbT = int8(nb * N * K, 2);
  engine.gemmBT(qa, qbT, nb, M, K, N);
  const times = [];
  for (let r = 0; r < REPS; r++) {
    let reps = 0; const t = performance.now(); let dt = 0;
    do { engine.gemmBT(qa, qbT, nb, M, K, N); reps++; dt = performance.now() - t; } while (dt < 100);
    times.push(dt / reps);
  }
  return (2 * nb * M * K * N) / (median(times) * 1e6);      // GOPS
}

// the model's GEMM shapes at the default config (B=8, T=32, C=32, H=4): [what, batch, M, K, N]
const SHAPES = [
  ['qkv  x W^T (256x32x96)', 1, 256, 32, 96], ['q k^T (32 x 32x8x32)', 32, 32, 8, 32],
  ['p v (32 x 32x32x8)', 32, 32, 32, 8], ['fc (256x32x128)', 1, 256, 32, 128],
  ['mlp proj (256x128x32)', 1, 256, 128, 32], ['head (256x32x257)', 1, 256, 32, 257],
  ['dW head (257x256x32)', 1, 257, 256, 32], ['512^3', 1, 512, 512, 512],
];

const out = { steps: STEPS, reps: REPS, step_ms: {}, gemm_gops: [] };
out.step_ms['wasm-simd P=1'] = await stepMs(wasm, 1, STEPS);
out.step_ms['wasm-simd P=2 (CLI default)'] = await stepMs(wasm, 2, Math.max(2, STEPS >> 1));
out.step_ms['scalar P=1'] = await stepMs(cpuEngine, 1, Math.max(2, STEPS >> 2));
for (const [what, nb, M, K, N] of SHAPES) {
  out.gemm_gops.push({ what, scalar: gemmGops(cpuEngine, nb, M, K, N), wasm: gemmGops(wasm, nb, M, K, N) });
}
if (argv.includes('--json')) console.log(JSON.stringify(out));
else {
  console.log(`ms per training step (median of ${REPS} runs):`);
  for (const [k, v] of Object.entries(out.step_ms)) console.log(`  ${k.padEnd(30)} ${v.toFixed(2)}`);
  console.log('int8 GEMM GOPS (scalar / wasm-simd):');
  for (const g of out.gemm_gops) console.log(`  ${g.what.padEnd(30)} ${g.scalar.toFixed(2)} / ${g.wasm.toFixed(2)}`);
}
