// Validate, then benchmark, int8 GEMM kernel variants against the mainline kernel (llm.c's dev/
// style): node dev/gemm/gemm_bench.mjs [--variants a,b] [--rounds R] [--quick]
// 1. every variant's C (int32) must equal the mainline kernel's bit for bit (and the scalar
//    engine's on the logical part) on random and edge shapes: ragged M/N/K, K not a multiple of
//    4/16, batch > 1, +-127 extremes, |acc| at the int32 bound (K = MAX_K). A mismatch prints the
//    first differing index with both values and stops.
// 2. then each kernel runs every GEMM shape of one training step at the largest settings (width
//    128, seq 128, batch 32, 2 layers: the shapes bench/profile_cpu_step.mjs's step calls, with
//    their counts), interleaved round by round; per shape the median over rounds, the ratio to the
//    mainline kernel of the same run, and the step's GEMM total (sum of count x median).
//    --shapes '[[batch, M, K, N, calls], ...]' replaces the step's shapes.
// Results and what was tried: TEST_RESULTS.md, "Threads", "GEMM kernel".
import { GEMM_WASM } from '../../frontend_js/wasm_gemm.js';
import { cpuEngine, MAX_K } from '../../frontend_js/units.js';
import { median } from '../../bench/js_cpu_core.mjs';
import { tiled, specialised, wide, tall } from './variants.mjs';

// Kp (K rounded up to 8) of the step's GEMMs, and small ones: the specialised kernels' list
const KPS = [8, 16, 32, 128, 264, 384, 512, 4096];
// name -> module bytes. rows x 4 tiles; kN: k loop unrolled N times; rbN: rows walked in blocks
// of N per column quad; static: Kp specialised (static load offsets, see variants.mjs)
export const VARIANTS = {
  mainline: () => GEMM_WASM,
  '2x4': () => tiled({ rows: 2 }),                                    // the mainline tiling, top-tested loops
  '2x4 k2': () => tiled({ rows: 2, unroll: 2 }),
  '2x4 rb32': () => tiled({ rows: 2, rowBlock: 32 }),
  '4x4': () => tiled({ rows: 4 }),
  '4x4 k2': () => tiled({ rows: 4, unroll: 2 }),
  '4x4 rb32': () => tiled({ rows: 4, rowBlock: 32 }),
  '4x4 rb64': () => tiled({ rows: 4, rowBlock: 64 }),
  'static u4': () => specialised({ kps: KPS }),
  'static u2': () => specialised({ kps: KPS, unrollMax: 2 }),
  'static 2x6': () => wide({ kps: KPS }),
  'static 3x4': () => tall({ kps: KPS, rows: 3 }),
  'static 4x4': () => tall({ kps: KPS, rows: 4 }),
  'static fold': () => specialised({ kps: KPS, unrollMax: 1, fold: true }),
  'static u1': () => specialised({ kps: KPS, unrollMax: 1 }),
};
// (batch, M, K, N) x calls per step at the largest settings
export const STEP_SHAPES = [[1, 4096, 128, 384, 2], [128, 128, 32, 128, 4], [128, 128, 128, 32, 8], [1, 4096, 128, 128, 4],
  [1, 4096, 128, 512, 4], [1, 4096, 512, 128, 4], [1, 4096, 128, 257, 1], [1, 257, 4096, 128, 1], [1, 4096, 257, 128, 1],
  [1, 128, 4096, 512, 2], [1, 512, 4096, 128, 2], [1, 128, 4096, 128, 2], [1, 384, 4096, 128, 2], [1, 4096, 384, 128, 2]];

// a kernel in its own instance: run(qa, qbT, nb, m, kk, n) -> Int32Array (nb, m, n) over the
// engine's padding (K to a multiple of 8 with zeros, M even, N a multiple of 4)
function load(bytes) {
  const { mem, gemm } = new WebAssembly.Instance(new WebAssembly.Module(bytes), {}).exports;
  const stage = (qa, qbT, nb, m, kk, n) => {
    const kp = (kk + 7) & ~7, mp = m + (m & 1), np = (n + 3) & ~3, al = (x) => (x + 15) & ~15;
    const oB = al(nb * mp * kp * 2), oC = oB + al(nb * np * kp * 2), end = oC + nb * mp * np * 4;
    const need = Math.ceil((end - mem.buffer.byteLength) / 65536);
    if (need > 0) mem.grow(need);
    const A = new Int16Array(mem.buffer, 0, nb * mp * kp).fill(0), B = new Int16Array(mem.buffer, oB, nb * np * kp).fill(0);
    for (let b = 0; b < nb; b++) {
      for (let r = 0; r < m; r++) for (let k = 0; k < kk; k++) A[(b * mp + r) * kp + k] = qa[(b * m + r) * kk + k];
      for (let r = 0; r < n; r++) for (let k = 0; k < kk; k++) B[(b * np + r) * kp + k] = qbT[(b * n + r) * kk + k];
    }
    new Int32Array(mem.buffer, oC, nb * mp * np).fill(0x5a5a5a5a);       // stale values must be overwritten
    return { call: () => gemm(0, oB, oC, nb, mp, np, kp), C: () => new Int32Array(mem.buffer, oC, nb * mp * np), mp, np };
  };
  return { stage };
}

function int8s(n, seed, lo = -127, hi = 127) {
  const q = new Int8Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; q[i] = lo + ((s >>> 8) % (hi - lo + 1)); }
  return q;
}

const EDGE_SHAPES = [[1, 1, 1, 1], [1, 2, 3, 4], [1, 3, 5, 7], [2, 2, 9, 5], [1, 7, 17, 13], [3, 5, 8, 4], [1, 33, 31, 9],
  [4, 32, 8, 32], [1, 64, 257, 33], [2, 31, 16, 30], [1, 6, 24, 12], [2, 10, 40, 8], [1, 66, 130, 36], [5, 34, 33, 17],
  [1, 130, 100, 70], [3, 4, 4, 4], [1, 70, 1000, 20], [2, 128, 32, 128]];

// -> null or the first mismatch in words
export function validate(name, bytes) {
  const ref = load(VARIANTS.mainline()), got = load(bytes);
  const cases = [];
  EDGE_SHAPES.forEach(([nb, m, kk, n], s) => {
    cases.push([nb, m, kk, n, int8s(nb * m * kk, 11 + s), int8s(nb * n * kk, 97 + s)]);
    cases.push([nb, m, kk, n, int8s(nb * m * kk, 5 + s, 127, 127), int8s(nb * n * kk, 7 + s, -127, -127)]);
  });
  cases.push([1, 2, MAX_K, 3, new Int8Array(2 * MAX_K).fill(127), new Int8Array(3 * MAX_K).fill(127)]);
  cases.push([1, 4, MAX_K, 4, new Int8Array(4 * MAX_K).fill(-127), new Int8Array(4 * MAX_K).fill(127)]);
  for (const [nb, m, kk, n, qa, qbT] of cases) {
    const r = ref.stage(qa, qbT, nb, m, kk, n); r.call();
    const g = got.stage(qa, qbT, nb, m, kk, n); g.call();
    const want = r.C(), have = g.C();
    for (let x = 0; x < want.length; x++) {
      if (have[x] !== want[x]) return `${name}: shape (${nb}, ${m}, ${kk}, ${n}) padded index ${x}: ${have[x]} vs mainline ${want[x]}`;
    }
    const scalar = cpuEngine.gemmBT(qa, qbT, nb, m, kk, n);
    for (let b = 0; b < nb; b++) for (let i = 0; i < m; i++) for (let j = 0; j < n; j++) {
      const x = (b * m + i) * n + j, y = (b * g.mp + i) * g.np + j;
      if (have[y] !== scalar[x]) return `${name}: shape (${nb}, ${m}, ${kk}, ${n}) index ${x}: ${have[y]} vs scalar ${scalar[x]}`;
    }
  }
  return null;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const argv = process.argv.slice(2);
  const opt = (k, d) => { const i = argv.indexOf(k); return i >= 0 ? argv[i + 1] : d; };
  const names = ['mainline', ...opt('--variants', Object.keys(VARIANTS).join(',')).split(',').filter((v) => v !== 'mainline')];
  const rounds = Number(opt('--rounds', 5));
  if (opt("--shapes")) STEP_SHAPES.splice(0, STEP_SHAPES.length, ...JSON.parse(opt("--shapes")));
  const shapes = argv.includes('--quick') ? STEP_SHAPES.slice(0, 6) : STEP_SHAPES;
  for (const v of names) {
    if (!VARIANTS[v]) throw new Error(`no variant ${v} (have ${Object.keys(VARIANTS).join(', ')})`);
    const err = validate(v, VARIANTS[v]());
    if (err) { console.error(`MISMATCH ${err}`); process.exit(1); }
  }
  console.log(`validated: ${names.join(', ')} equal the mainline kernel and the scalar engine on ${EDGE_SHAPES.length * 2 + 2} cases`);
  const staged = names.map((v) => load(VARIANTS[v]()));
  const totals = names.map(() => 0);
  console.log(`shape (batch, M, K, N) x calls: median ms over ${rounds} interleaved rounds, ratio mainline/variant`);
  for (const [nb, m, kk, n, calls] of shapes) {
    const qa = int8s(nb * m * kk, 1), qbT = int8s(nb * n * kk, 2);
    const runs = staged.map((k) => k.stage(qa, qbT, nb, m, kk, n));
    runs.forEach((r) => r.call());                                        // warm-up
    const times = names.map(() => []);
    for (let r = 0; r < rounds; r++) {
      runs.forEach((run, v) => { const t = performance.now(); run.call(); times[v].push(performance.now() - t); });
    }
    const med = times.map(median);
    med.forEach((t, v) => { totals[v] += calls * t; });
    const gmac = (nb * m * kk * n) / 1e9;
    console.log(`(${nb}, ${m}, ${kk}, ${n}) x${calls}: ` + names.map((v, i) =>
      `${v} ${med[i].toFixed(2)} ms (${(gmac / med[i] * 1e3).toFixed(1)} GMAC/s, ${(med[0] / med[i]).toFixed(2)}x)`).join(' | '));
  }
  console.log('step GEMM total (ms, one thread): ' + names.map((v, i) => `${v} ${totals[i].toFixed(1)} (${(totals[0] / totals[i]).toFixed(2)}x)`).join(' | '));
}
