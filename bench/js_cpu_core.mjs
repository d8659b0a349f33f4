// The JS CPU mirror bench, runnable in node and in a browser page (no node imports): ms per
// training step (default config; one peer = one loss_and_grads + reduce + Adam + hash; after
// warm-up steps) and int8
// GEMM GOPS (2 ops per MAC) at the model's shapes and 512^3, scalar vs wasm-simd. Medians of reps.
import { makeConfig } from '../frontend_js/config.js';
import { Group } from '../frontend_js/train.js';
import { createBackends, withEngine } from '../frontend_js/engines.js';
import { cpuEngine } from '../frontend_js/units.js';

export const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };

// steady state is what most of a run (300 steps by default) sees: the JIT compilers optimize hot
// code after some calls (node 20 needs ~10 steps, Chromium's wasm and JS tiers ~50), so each rep
// warms up first; the scalar path (10x slower) gets 10
const WARMUP_STEPS = 50, WARMUP_STEPS_SCALAR = 10;

export async function stepMs(cfg, stream, backend, peers, steps, reps, warmup = WARMUP_STEPS) {
  const times = [];
  for (let r = 0; r < reps; r++) {
    const g = new Group(cfg, peers, stream, backend);
    for (let i = 0; i < warmup; i++) await g.step();     // JIT tier-up, the arena's first growth
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

function gemmGops(engine, nb, M, K, N, reps) {
  const qa = int8(nb * M * K, 1), qbT = int8(nb * N * K, 2);
  engine.gemmBT(qa, qbT, nb, M, K, N);
  const times = [];
  for (let r = 0; r < reps; r++) {
    let n = 0; const t = performance.now(); let dt = 0;
    do { engine.gemmBT(qa, qbT, nb, M, K, N); n++; dt = performance.now() - t; } while (dt < 100);
    times.push(dt / n);
  }
  return (2 * nb * M * K * N) / (median(times) * 1e6);      // GOPS
}

// the model's GEMM shapes at the default config (B=8, T=32, C=32, H=4): [what, batch, M, K, N]
export const SHAPES = [
  ['qkv  x W^T (256x32x96)', 1, 256, 32, 96], ['q k^T (32 x 32x8x32)', 32, 32, 8, 32],
  ['p v (32 x 32x32x8)', 32, 32, 32, 8], ['fc (256x32x128)', 1, 256, 32, 128],
  ['mlp proj (256x128x32)', 1, 256, 128, 32], ['head (256x32x257)', 1, 256, 32, 257],
  ['dW head (257x256x32)', 1, 257, 256, 32], ['512^3', 1, 512, 512, 512],
];

// stream: Uint16Array tokens -> {steps, reps, step_ms: {path: ms}, gemm_gops: [{what, scalar, wasm}]}
export async function runBench(stream, { steps = 10, reps = 5 } = {}) {
  const wasm = (await createBackends()).find((b) => b.name === 'wasm-simd');
  if (!wasm) throw new Error('the wasm-simd engine is not available here');
  const scalar = withEngine(wasm, cpuEngine);     // the scalar GEMM; the other parts as wasm's
  const cfg = makeConfig({});
  const out = { steps, reps, step_ms: {}, gemm_gops: [] };
  {                       // first: a fresh process/page, so this includes the JIT's warm-up
    const g = new Group(cfg, 1, stream, wasm), t = performance.now();
    for (let i = 0; i < WARMUP_STEPS; i++) await g.step();
    out.step_ms[`wasm-simd P=1, first ${WARMUP_STEPS} steps (cold)`] = (performance.now() - t) / WARMUP_STEPS;
  }
  out.step_ms['wasm-simd P=1'] = await stepMs(cfg, stream, wasm, 1, steps, reps);
  out.step_ms['wasm-simd P=2 (CLI default)'] = await stepMs(cfg, stream, wasm, 2, Math.max(2, steps >> 1), reps);
  out.step_ms['scalar P=1'] = await stepMs(cfg, stream, scalar, 1, Math.max(2, steps >> 2), reps, WARMUP_STEPS_SCALAR);
  for (const [what, nb, M, K, N] of SHAPES) {
    out.gemm_gops.push({ what, scalar: gemmGops(cpuEngine, nb, M, K, N, reps), wasm: gemmGops(wasm.engine, nb, M, K, N, reps) });
  }
  return out;
}
