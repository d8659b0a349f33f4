// The INT8 unit wholly on the GPU (frontend_js/gpu/f64.js: float64 emulated in WGSL) against the
// CPU (the wasm engine's fused unit), on Node's `webgpu` package (Dawn):
//   H200:        source .gpu/setup.sh && $NODE bench/bench_gpu_unit.mjs       (carry .gpu, fixtures_out)
//   SwiftShader: LD_LIBRARY_PATH=<dir of libvulkan.so.1> VK_DRIVER_FILES=/usr/lib/chromium/vk_swiftshader_icd.json
//                DAISY_BENCH_SMALL=1 node bench/bench_gpu_unit.mjs   (correctness and time only)
// Sections, each written to $OUT/gpu_unit_results.json when done:
//   gate      gateF64 (every emulated operation vs JS float64, the unit vs units.js) per GEMM kernel
//   bugs      the f64 bug corpus (tests/gpu/mutants.js F64_MUTANTS): each must fail the gate
//   calls     the largest settings' unit shapes: ms per call, GPU unit vs wasm CPU, bits compared
//   steps     training steps (train20.dsyf's stream, 2 peers) at the largest settings (width 128,
//             seq 128, batch 32, 2 layers) and the default: ms per 2-peer step on the GPU unit
//             and on the wasm CPU engine, rounds alternating, every step's hashes compared
// Fixtures: `python -m daisy.fixtures fixtures_out` beforehand (DAISY_FIXTURES to move it).
import { createRequire } from 'node:module';
import { writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);
const gpu = create([]);

const { GpuF64Unit, gateF64 } = await import('../frontend_js/gpu/f64.js');
const { createBackends } = await import('../frontend_js/engines.js');
const { makeConfig } = await import('../frontend_js/config.js');
const { F64_MUTANTS, mutantUrl } = await import('../tests/gpu/mutants.js');
const { loadFixture, runSteps, median, onEngine, ConcurrentPeersGroup } = await import('./h200/steps.mjs');

const SMALL = process.env.DAISY_BENCH_SMALL === '1';
const OUT = process.env.OUT || 'out';
const FIX = process.env.DAISY_FIXTURES || 'fixtures_out';
const ONLY = process.env.DAISY_SECTIONS ? new Set(process.env.DAISY_SECTIONS.split(',')) : null;
mkdirSync(OUT, { recursive: true });
const results = { small: SMALL, started: new Date().toISOString(), sections: {} };
const save = () => writeFileSync(join(OUT, 'gpu_unit_results.json'), JSON.stringify(results, null, 1));
const T0 = performance.now();
const elapsed = () => ((performance.now() - T0) / 1000).toFixed(1);
async function section(name, fn) {
  if (ONLY && !ONLY.has(name)) return;
  const t = performance.now();
  try { results.sections[name] = { ok: true, ...(await fn()) }; } catch (e) { results.sections[name] = { ok: false, error: String(e && e.stack || e) }; }
  results.sections[name].seconds = (performance.now() - t) / 1000;
  save();
  console.log(`[${elapsed()} s] ${name}: ${results.sections[name].ok ? 'done' : results.sections[name].error}`);
}

const adapter = await gpu.requestAdapter();
const lim = adapter.limits;
const device = await adapter.requestDevice({ requiredLimits: { maxStorageBufferBindingSize: lim.maxStorageBufferBindingSize, maxBufferSize: lim.maxBufferSize } });
device.addEventListener('uncapturederror', (e) => console.error('uncaptured', e.error.message));
const langs = new Set(gpu.wgslLanguageFeatures || []);
results.adapter = { ...(adapter.info || {}) };
results.adapter = { vendor: results.adapter.vendor, device: results.adapter.device, architecture: results.adapter.architecture, description: results.adapter.description, packed: langs.has('packed_4x8_integer_dot_product') };
console.log('adapter', JSON.stringify(results.adapter));
const GEMM = langs.has('packed_4x8_integer_dot_product') ? 'dot4_packed.wgsl' : 'dot4_portable.wgsl';
const TUNING = SMALL ? {} : { WG_X: 16, WG_Y: 16, RM: 4, RN: 4, TK: 8 };   // the H200's t64 tiling
const unit = await GpuF64Unit.create(device, { gemm: GEMM, tuning: TUNING });
const wasm = (await createBackends())[0].engine;

await section('gate', async () => {
  const out = [];
  for (const gemm of ['dot4_packed.wgsl', 'dot4_portable.wgsl']) {
    if (gemm === 'dot4_packed.wgsl' && !langs.has('packed_4x8_integer_dot_product')) continue;
    const u = await GpuF64Unit.create(device, { gemm, tuning: TUNING });
    const t = performance.now();
    const g = await gateF64(u, { random: SMALL ? 512 : 8192 });
    out.push({ gemm, ok: g.ok, reason: g.reason, cases: g.cases.length, elements: g.cases.reduce((s, c) => s + (c.n || 0), 0), ms: performance.now() - t });
    u.destroy();
  }
  return { results: out, allPassed: out.every((r) => r.ok) };
});

await section('bugs', async () => {
  const out = [];
  for (const m of F64_MUTANTS) {
    const u = await GpuF64Unit.create(device, { lib: await mutantUrl(m), gemm: GEMM, tuning: TUNING });
    const g = await gateF64(u, { random: SMALL ? 512 : 2048 });
    out.push({ bug: m.id, rejected: !g.ok, reason: g.reason });
    u.destroy();
  }
  return { results: out, allRejected: out.every((r) => r.rejected) };
});

// [name, batch, M, K, N, transA, transB] of the largest settings (N = B*T = 4096 tokens, C = 128,
// 4 heads of 32, V = 257)
const LARGEST_CALLS = [
  ['qkv forward', 1, 4096, 128, 384, false, true],
  ['scores q k^T (128 heads)', 128, 128, 32, 128, false, true],
  ['p v (128 heads)', 128, 128, 128, 32, false, false],
  ['fc forward', 1, 4096, 128, 512, false, true],
  ['mlp proj forward', 1, 4096, 512, 128, false, true],
  ['head forward', 1, 4096, 128, 257, false, true],
  ['head dX', 1, 4096, 257, 128, false, false],
  ['head dW (K = 4096)', 1, 257, 4096, 128, true, false],
  ['fc dW (K = 4096)', 1, 512, 4096, 128, true, false],
];

await section('calls', async () => {
  const rand = (n, seed) => { let s = seed; const x = new Float64Array(n); for (let i = 0; i < n; i++) { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; x[i] = (s / 2 ** 32 - 0.5) * 2 ** ((s & 15) - 8); } return x; };
  const out = [];
  const calls = SMALL ? LARGEST_CALLS.map(([n, nb, m, k, nn, ta, tb]) => [n, Math.min(nb, 4), Math.min(m, 256), Math.min(k, 256), Math.min(nn, 128), ta, tb]) : LARGEST_CALLS;
  for (const [name, nb, m, kk, n, ta, tb] of calls) {
    const a = rand(nb * m * kk, 1), b = rand(nb * kk * n, 2);
    const reps = SMALL ? 2 : 7, g = [], gw = [], c = [];
    let got, want;
    for (let r = 0; r < reps; r++) {
      unit.upload = 'staging';
      let t = performance.now(); got = await unit.qmatmulT(a, ta, b, tb, nb, m, kk, n); g.push(performance.now() - t);
      unit.upload = 'write';
      t = performance.now(); await unit.qmatmulT(a, ta, b, tb, nb, m, kk, n); gw.push(performance.now() - t);
      t = performance.now(); want = await wasm.qmatmulT(a, ta, b, tb, nb, m, kk, n); c.push(performance.now() - t);
    }
    // the phases apart: upload (until the queue is idle), compute (the four dispatches),
    // readback (copy + mapAsync), host (the copy out of the mapped range); staging upload
    const phaseRuns = {};
    for (const mode of ['staging', 'write']) {
      unit.upload = mode;
      unit.profile = { upload: 0, compute: 0, readback: 0, host: 0 };
      const preps = SMALL ? 1 : 3;
      for (let r = 0; r < preps; r++) await unit.qmatmulT(a, ta, b, tb, nb, m, kk, n);
      phaseRuns[mode] = Object.fromEntries(Object.entries(unit.profile).map(([k, v]) => [k, v / preps]));
    }
    unit.profile = null; unit.upload = 'staging';
    const phases = phaseRuns.staging;
    const gb = new Uint32Array(got.buffer, got.byteOffset, got.length * 2), wb = new Uint32Array(want.buffer, want.byteOffset, want.length * 2);
    let bad = -1;
    for (let i = 0; i < gb.length; i++) if (gb[i] !== wb[i]) { bad = i >> 1; break; }
    out.push({ name, shape: [nb, m, kk, n], gpuMs: median(g), gpuWriteBufferMs: median(gw), cpuMs: median(c), speedup: median(c) / median(g), phases, phasesWriteBuffer: phaseRuns.write, bitsEqual: bad < 0, firstMismatch: bad < 0 ? null : { i: bad, gpu: got[bad], cpu: want[bad] } });
    console.log(`  ${name}: gpu ${median(g).toFixed(2)} ms (writeBuffer upload: ${median(gw).toFixed(2)} ms; staging: ${Object.entries(phases).map(([k, v]) => `${k} ${v.toFixed(2)}`).join(', ')}), cpu ${median(c).toFixed(2)} ms${bad < 0 ? '' : ' MISMATCH'}`);
  }
  return { results: out, allEqual: out.every((r) => r.bitsEqual) };
});

await section('steps', async () => {
  const fx = loadFixture(FIX, 'train20.dsyf'), peers = fx.header.meta.peers, stream = fx.tensors.stream.data;
  // each engine's unit time: the wall time during which at least one of its calls is in flight
  // (the dX/dW pair of a backward overlaps); the rest of a step is the CPU's row kernels,
  // copies, reduce, Adam and hash
  const timed = (name, fn) => {
    let inFlight = 0, since = 0;
    const e = { name, ms: 0, calls: 0, async qmatmulT(...args) {
      if (inFlight++ === 0) since = performance.now();
      try { return await fn(...args); } finally { e.calls++; if (--inFlight === 0) e.ms += performance.now() - since; }
    } };
    return e;
  };
  // the GPU engine (frontend_js/gpu/gpu.js, route 'all') with the f64 unit (its gate, spot
  // audits, staging upload), the same with writeBuffer uploads, and without the f64 unit
  // (today's path: the GEMM on the GPU, quantizers and epilogue in wasm)
  const { createGpuEngine } = await import('../frontend_js/gpu/gpu.js');
  const info = { isFallbackAdapter: false, wgslLanguageFeatures: [...langs] }, quiet = { log() {} };
  const withUnit = await createGpuEngine({ device, info, log: quiet, tuning: TUNING, f64Unit: true });
  const withUnitWrite = await createGpuEngine({ device, info, log: quiet, tuning: TUNING, f64Unit: true, gate: false });
  if (withUnitWrite.f64) withUnitWrite.f64.upload = 'write';
  const today = await createGpuEngine({ device, info, log: quiet, tuning: TUNING, f64Unit: false });
  const engines = [['gpu f64 unit', withUnit], ['cpu', wasm], ['gpu f64 unit, writeBuffer upload', withUnitWrite], ['gpu gemm only (today)', today],
    ['gpu f64 unit, peers issued together (train.js what-if)', withUnit]]
    .map(([w, e]) => [w, timed(e.name, (...args) => e.qmatmulT(...args))]);
  // the what-if: both peers' steps issued together (bench/h200/steps.mjs ConcurrentPeersGroup,
  // the same bits as Group), so one peer's CPU row work overlaps the other's GPU calls
  const concurrentSteps = async (cfg, engine, steps) => {
    const g = new ConcurrentPeersGroup(cfg, peers, stream, onEngine(engine)), ms = [], hashes = [];
    for (let i = 0; i < steps; i++) { const t = performance.now(); hashes.push((await g.step()).hashes); ms.push(performance.now() - t); }
    return { ms, hashes };
  };
  const status = { unit: withUnit.status.unit, reasons: withUnit.status.reasons };
  const sizes = [['default (width 32, seq 32, batch 8)', {}], ['max: width 128, seq 128, batch 32', { width: 128, seq_len: 128, batch: 32 }]];
  const out = {};
  for (const [name, over] of SMALL ? sizes.slice(0, 1) : sizes) {
    const cfg = makeConfig({ ...fx.header.config, ...over });
    const steps = SMALL ? 2 : 5, warm = SMALL ? 1 : 2, rounds = SMALL ? 1 : 2;
    const o = (out[name] = { hashesEqual: true, firstMismatch: null, ms: {}, unitMs: {} });
    for (let round = 0; round < rounds; round++) {
      let ref = null;
      for (const [what, e] of engines) {
        e.ms = 0; e.calls = 0;
        const r = what.includes('what-if') ? await concurrentSteps(cfg, e, steps) : await runSteps(cfg, peers, stream, e, steps);
        (o.ms[what] ||= []).push(median(r.ms.slice(warm)));
        (o.unitMs[what] ||= []).push(e.ms / steps);          // per step, all steps
        if (!ref) ref = r;
        const bad = r.hashes.findIndex((h, s) => JSON.stringify(h) !== JSON.stringify(ref.hashes[s]));
        if (bad >= 0) { o.hashesEqual = false; o.firstMismatch ||= { what, step: bad + 1, got: r.hashes[bad], ref: ref.hashes[bad] }; }
      }
      console.log(`  ${name} round ${round}: ${engines.map(([w]) => `${w} ${o.ms[w].at(-1).toFixed(0)} ms (unit ${o.unitMs[w].at(-1).toFixed(0)})`).join(', ')} per ${peers}-peer step${o.hashesEqual ? '' : ' HASH MISMATCH'}`);
    }
    o.msPerStep = Object.fromEntries(Object.entries(o.ms).map(([w, v]) => [w, median(v)]));
    o.unitMsPerStep = Object.fromEntries(Object.entries(o.unitMs).map(([w, v]) => [w, median(v)]));
    o.speedupVsCpu = o.msPerStep.cpu / o.msPerStep['gpu unit'];
  }
  return { peers, results: out, engine: status, stats: withUnit.stats };
});

results.seconds = (performance.now() - T0) / 1000;
save();
console.log(`done in ${elapsed()} s`);
process.exit(0);
