// One device call on the lent H200 (Node `webgpu` = Dawn on the NVIDIA Vulkan driver):
//   source .gpu/setup.sh && $NODE bench/h200/run_all.mjs        (carry: .gpu, fixtures_out)
// Sections (each written to $OUT/h200_results.json as soon as it is done):
//   adapter, gates (both kernels, default and H200 tunings), bug corpus + false alarms, B2B chain,
//   units.dsyf GEMM cases, train20.dsyf on the GPU path (hashes vs reference) with ms/step next to
//   the JS CPU engines, larger configs (GPU vs CPU ms/step, hashes equal), and GEMM throughput from GPU timestamps (packed and portable; the model's
//   shapes, 512^3, 8192^3; several tunings). TOPS = 2*M*N*K*batch*reps / (t_end - t_begin).
// Fixtures: `python -m daisy.fixtures fixtures_out` beforehand. DAISY_BENCH_SMALL=1: a quick dry
// run with small sizes (works on SwiftShader: LD_LIBRARY_PATH=/usr/lib/chromium
// VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json).
import { createRequire } from 'node:module';
import { writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);
const gpu = create([]);

const { openDevice, createGpuEngine, GemmKernel, GEMM_KERNELS, packRowsI8, packColsI8, storageBuffer,
  submitChecked, readBack } = await import('../../frontend_js/gpu/gpu.js');
const { runBugCorpus, runFalseAlarmCheck } = await import('../../tests/gpu/gpu_bugs.js');
const { checksumAudit, tileAudit, auditKey, firstMismatch, gateOperands } = await import('../../frontend_js/gpu/gpu_gates.js');
const { checkB2bChain } = await import('../../tests/gpu/b2b.js');
const { cpuEngine } = await import('../../frontend_js/units.js');

const SMALL = process.env.DAISY_BENCH_SMALL === '1';
const OUT = process.env.OUT || 'out';
const FIX = process.env.DAISY_FIXTURES || 'fixtures_out';
mkdirSync(OUT, { recursive: true });
const results = { small: SMALL, started: new Date().toISOString(), sections: {} };
const save = () => writeFileSync(join(OUT, 'h200_results.json'), JSON.stringify(results, null, 1));
const quiet = { log() {} };
const T0 = performance.now();
const elapsed = () => ((performance.now() - T0) / 1000).toFixed(1);

// DAISY_SECTIONS=a,b: only those sections (default: all)
const ONLY = process.env.DAISY_SECTIONS ? new Set(process.env.DAISY_SECTIONS.split(',')) : null;
async function section(name, fn) {
  if (ONLY && !ONLY.has(name)) return;
  const t = performance.now();
  try {
    results.sections[name] = { ok: true, ...(await fn()) };
  } catch (e) {
    results.sections[name] = { ok: false, error: String(e && e.stack || e) };
  }
  results.sections[name].seconds = (performance.now() - t) / 1000;
  save();
  console.log(`[${elapsed()} s] ${name}: ${results.sections[name].ok ? 'done' : results.sections[name].error}`);
}

const { loadFixture: loadFixtureFrom, median } = await import('./steps.mjs');
const loadFixture = (name) => loadFixtureFrom(FIX, name);
const H200_TUNINGS = {
  't32 wg8x8 r4x4 k4 (default)': { WG_X: 8, WG_Y: 8, RM: 4, RN: 4, TK: 4 },
  't64 wg16x16 r4x4 k8': { WG_X: 16, WG_Y: 16, RM: 4, RN: 4, TK: 8 },
  't128 wg16x16 r8x8 k4': { WG_X: 16, WG_Y: 16, RM: 8, RN: 8, TK: 4 },
  't128 wg16x16 r8x8 k8': { WG_X: 16, WG_Y: 16, RM: 8, RN: 8, TK: 8 },
  't64x128 wg16x8 r8x8 k8': { WG_X: 16, WG_Y: 8, RM: 8, RN: 8, TK: 8 },
};

const { device, info } = await openDevice(gpu, { features: ['timestamp-query'] });
device.addEventListener('uncapturederror', (e) => console.error('uncaptured', e.error.message));
results.adapter = info;
results.timestamps = device.features.has('timestamp-query');
save();
console.log('adapter', JSON.stringify(info));

await section('gates', async () => {
  const out = [];
  const tunings = SMALL ? { default: H200_TUNINGS['t32 wg8x8 r4x4 k4 (default)'] } : H200_TUNINGS;
  for (const [tname, tuning] of Object.entries(tunings)) {
    for (const k of GEMM_KERNELS) {
      const e = await createGpuEngine({ device, info, kernels: [k], tuning, log: quiet });
      out.push({ kernel: k.id, tuning: tname, path: e.status.path, reasons: e.status.reasons,
        cases: e.status.gates[0]?.cases.length ?? 0, failed: (e.status.gates[0]?.cases || []).filter((c) => !c.ok).map((c) => c.name) });
      e.destroy();
    }
  }
  return { results: out, allPassed: out.every((r) => r.path === 'gpu') };
});

await section('bugs', async () => {
  const bugs = await runBugCorpus({ device, info, log: quiet });
  const real = await runFalseAlarmCheck({ device, info, log: quiet });
  const strip = (r) => ({ id: r.id, caughtBy: r.caughtBy, calls: r.calls, reason: r.reason });
  return { bugs: bugs.map(strip), real: real.map(strip),
    allRejected: bugs.every((b) => b.caughtBy === 'gate' || b.caughtBy === 'audit'),
    falseAlarms: real.filter((r) => r.caughtBy !== null).length };
});

await section('b2b', async () => {
  const e = await createGpuEngine({ device, info, log: quiet });
  const rows = 256, C = 32;    // the default model's MLP block, twice
  const dims = [[C, 4 * C, 8, true], [4 * C, C, 9, false], [C, 4 * C, 8, true], [4 * C, C, 9, false]];
  const r = await checkB2bChain(e, rows, dims);
  e.destroy();
  return { kernel: r.kernel, accMismatch: r.accMismatch, qMismatch: r.qMismatch, n: r.gpu.q.length };
});

await section('units_fixture', async () => {
  const fx = loadFixture('units.dsyf');
  const e = await createGpuEngine({ device, info, log: quiet });
  const bad = [];
  for (let i = 0; i < fx.header.meta.cases; i++) {
    const t = (n) => fx.tensors[`case${i}.${n}`];
    const [M, K] = t('qa').shape, N = t('qb').shape[1];
    const got = await e.gemm(t('qa').data, t('qb').data, 1, M, K, N);
    const m = firstMismatch(got, t('acc').data);
    if (m) bad.push({ case: i, ...m });
  }
  e.destroy();
  return { cases: fx.header.meta.cases, kernel: e.status.kernel, mismatches: bad };
});

// ms per training step: the GPU path (and its variants) vs the JS CPU engines, same process, same
// fixture, every step's hashes checked; rounds alternate the paths; a path's figure is the median
// over rounds of the median of its warm steps (after node's JIT tier-up, ~10 steps).
await section('train20', async () => {
  const { createBackends } = await import('../../frontend_js/engines.js');
  const { timeSteps, oneByOne, ConcurrentPeersGroup } = await import('./steps.mjs');
  const fx = loadFixture('train20.dsyf'), peers = fx.header.meta.peers;
  const gpuE = await createGpuEngine({ device, info, log: quiet });
  const t64 = await createGpuEngine({ device, info, log: quiet, tuning: H200_TUNINGS['t64 wg16x16 r4x4 k8'] });
  const gemmOnly = { name: 'gemm only', gemm: (...a) => gpuE.gemm(...a) };   // units.js quantizers, int8 API
  const wasm = (await createBackends())[0].engine;
  const auto = await createGpuEngine({ device, info, log: quiet, route: 'auto' });
  const paths = [
    ["gpu: route 'auto' (the page's choice: small GEMMs on the CPU)", auto, {}],
    ['gpu: fused unit, calls of a tick batched (default)', gpuE, {}],
    ['gpu: fused unit, peers issued together (train.js what-if)', gpuE, { GroupClass: ConcurrentPeersGroup }],
    ['gpu: fused unit, t64 tiling', t64, {}],
    ['gpu: fused unit, one submit per call', oneByOne(gpuE, 'qmatmulT'), {}],
    ['gpu: int8 API + JS quantizers, one submit per call (the old path)', oneByOne(gemmOnly, 'gemm'), {}],
    [`cpu: ${wasm.name}`, wasm, {}],
  ];
  const rounds = SMALL ? 1 : 3, warm = SMALL ? 2 : 10, out = {};
  for (let round = 0; round < rounds; round++) {
    for (const [name, engine, opts] of paths) {
      const counted = name.startsWith('gpu') ? (name.includes('t64') ? t64 : name.includes('auto') ? auto : gpuE) : null;
      const r = await timeSteps(fx, engine, { ...opts, counter: counted && (() => counted.stats.submits) });
      const o = (out[name] ||= { rounds: [], submitsPerPeerStep: null, allMatch: true, firstBad: null });
      o.rounds.push(median(r.ms.slice(warm)) / peers);
      if (counted) o.submitsPerPeerStep = median(r.submits) / peers;
      if (r.firstBad) { o.allMatch = false; o.firstBad ||= r.firstBad; }
      console.log(`[${elapsed()} s] round ${round} ${name}: ${o.rounds.at(-1).toFixed(2)} ms/peer step${r.firstBad ? ' HASH MISMATCH' : ''}`);
    }
  }
  const scalar = await timeSteps(fx, cpuEngine, { steps: 4 });
  out['cpu: scalar'] = { rounds: [median(scalar.ms.slice(1)) / peers], allMatch: !scalar.firstBad };
  for (const o of Object.values(out)) o.msPerPeerStep = median(o.rounds);
  const res = { peers, config: fx.header.config, warmSteps: warm, paths: out, gpu: { kernel: gpuE.status.kernel, path: gpuE.status.path, reasons: gpuE.status.reasons, stats: gpuE.stats } };
  res.auto = { stats: auto.stats };
  gpuE.destroy(); t64.destroy(); auto.destroy();
  return res;
});

// Larger configs (the starter's sliders up to their maxima): ms per peer step on the GPU path and
// on the wasm CPU engine, same process, rounds alternating; the two paths' weight hashes must be
// equal at every step (both exact engines; the default config is checked against the reference
// above). Where the GEMMs grow as width^2 * tokens and the CPU float work as width * tokens, the
// GPU path overtakes the CPU.
await section('train_sizes', async () => {
  const { createBackends } = await import('../../frontend_js/engines.js');
  const { makeConfig } = await import('../../frontend_js/config.js');
  const { runSteps } = await import('./steps.mjs');
  const fx = loadFixture('train20.dsyf'), peers = fx.header.meta.peers, stream = fx.tensors.stream.data;
  const sizes = [
    ['default (width 32, seq 32, batch 8)', {}],
    ['width 64, seq 64, batch 16', { width: 64, seq_len: 64, batch: 16 }],
    ['width 128, seq 64, batch 16', { width: 128, seq_len: 64, batch: 16 }],
    ['max: width 128, seq 128, batch 32', { width: 128, seq_len: 128, batch: 32 }],
  ].slice(0, SMALL ? 2 : 4);
  const gpuE = await createGpuEngine({ device, info, log: quiet });
  const auto = await createGpuEngine({ device, info, log: quiet, route: 'auto' });
  const wasm = (await createBackends())[0].engine;
  const out = {};
  for (const [name, over] of sizes) {
    const cfg = makeConfig({ ...fx.header.config, ...over });
    const steps = SMALL ? 2 : cfg.width >= 128 ? 5 : 8, warm = SMALL ? 1 : 2, rounds = SMALL ? 1 : 2;
    const o = (out[name] = { config: over, gpu: [], auto: [], cpu: [], hashesEqual: true, firstMismatch: null });
    for (let round = 0; round < rounds; round++) {
      const g = await runSteps(cfg, peers, stream, gpuE, steps);
      const a = await runSteps(cfg, peers, stream, auto, steps);
      const c = await runSteps(cfg, peers, stream, wasm, steps);
      o.gpu.push(median(g.ms.slice(warm)) / peers);
      o.auto.push(median(a.ms.slice(warm)) / peers);
      o.cpu.push(median(c.ms.slice(warm)) / peers);
      for (const [what, r] of [['gpu', g], ['auto', a]]) {
        const bad = r.hashes.findIndex((h, s) => JSON.stringify(h) !== JSON.stringify(c.hashes[s]));
        if (bad >= 0) { o.hashesEqual = false; o.firstMismatch ||= { what, step: bad + 1, got: r.hashes[bad], cpu: c.hashes[bad] }; }
      }
      console.log(`[${elapsed()} s] ${name} round ${round}: gpu ${o.gpu.at(-1).toFixed(1)} ms, auto ${o.auto.at(-1).toFixed(1)} ms, cpu ${o.cpu.at(-1).toFixed(1)} ms per peer step${o.hashesEqual ? '' : ' HASH MISMATCH'}`);
    }
    o.gpuMsPerPeerStep = median(o.gpu); o.autoMsPerPeerStep = median(o.auto); o.cpuMsPerPeerStep = median(o.cpu);
    o.cpuOverGpu = o.cpuMsPerPeerStep / o.gpuMsPerPeerStep; o.cpuOverAuto = o.cpuMsPerPeerStep / o.autoMsPerPeerStep;
    save();
  }
  const res = { peers, paths: out, gpu: { kernel: gpuE.status.kernel, path: gpuE.status.path, reasons: gpuE.status.reasons, stats: gpuE.stats },
    auto: { stats: auto.stats }, cpuEngine: wasm.name };
  gpuE.destroy(); auto.destroy();
  return res;
});

// the floor of one round trip: a 1x1x1 GEMM through kernel.run (write, dispatch, copy, mapAsync)
await section('roundtrip', async () => {
  const k = await GemmKernel.create(device, GEMM_KERNELS[0]);
  const one = new Int8Array([3]), ms = [];
  for (let i = 0; i < 60; i++) { const t = performance.now(); await k.gemm(one, one, 1, 1, 1, 1); ms.push(performance.now() - t); }
  const t = performance.now(); await device.queue.onSubmittedWorkDone(); const idle = performance.now() - t;
  k.destroy();
  return { msPerRoundTrip: median(ms.slice(10)), min: Math.min(...ms), onSubmittedWorkDoneIdleMs: idle };
});

// --- throughput -----------------------------------------------------------------------------
function fillI8(n, seed) {            // deterministic, fast: -127..127 from an LCG
  const q = new Int8Array(n);
  let x = seed >>> 0;
  for (let i = 0; i < n; i++) { x = (Math.imul(x, 1664525) + 1013904223) >>> 0; q[i] = ((x >>> 24) % 255) - 127; }
  return q;
}

// GPU time of `reps` dispatches in one pass (timestamps), plus a correctness check of the result.
async function timeGemm(kernel, batch, M, K, N, reps, check) {
  const qa = fillI8(batch * M * K, 1), qb = fillI8(batch * K * N, 2);
  const K4 = Math.ceil(K / 4);
  const a = packRowsI8(qa, batch * M, K), bt = packColsI8(qb, batch, K, N);
  const aBuf = storageBuffer(device, a.byteLength, a), bBuf = storageBuffer(device, bt.byteLength, bt);
  const cBuf = storageBuffer(device, batch * M * N * 4);
  const prep = kernel.prepare(aBuf, bBuf, cBuf, batch, M, K4, N);
  const qs = results.timestamps ? device.createQuerySet({ type: 'timestamp', count: 2 }) : null;
  const resolve = qs ? device.createBuffer({ size: 16, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC }) : null;
  const runs = [];
  try {
    await submitChecked(device, (enc) => { const p = enc.beginComputePass(); kernel.encode(p, prep); p.end(); });   // warm-up
    await device.queue.onSubmittedWorkDone();
    for (let trial = 0; trial < 5; trial++) {
      const t = performance.now();
      await submitChecked(device, (enc) => {
        const p = enc.beginComputePass(qs ? { timestampWrites: { querySet: qs, beginningOfPassWriteIndex: 0, endOfPassWriteIndex: 1 } } : {});
        for (let r = 0; r < reps; r++) kernel.encode(p, prep);
        p.end();
        if (qs) enc.resolveQuerySet(qs, 0, 2, resolve, 0);
      });
      await device.queue.onSubmittedWorkDone();
      const wallMs = performance.now() - t;
      let gpuMs = null;
      if (qs) { const ts = new BigInt64Array(await readBack(device, resolve, 16)); gpuMs = Number(ts[1] - ts[0]) / 1e6; }
      runs.push(gpuMs && gpuMs > 0 ? gpuMs : wallMs);
    }
    const ms = median(runs) / reps;
    const c = new Int32Array(await readBack(device, cBuf, batch * M * N * 4));
    let verdict;
    if (check === 'full') verdict = firstMismatch(c, cpuEngine.gemm(qa, qb, batch, M, K, N)) ? 'MISMATCH (full compare)' : 'exact (full compare)';
    else {
      const k = auditKey(7);
      const bad = checksumAudit(qa, qb, c, batch, M, K, N, k, 1) || tileAudit(qa, qb, c, batch, M, K, N, k, 1, 16);
      verdict = bad ? `MISMATCH: ${bad}` : 'exact (Freivalds + 16x16 tile)';
    }
    return { batch, M, K, N, reps, msPerGemm: ms, tops: (2 * batch * M * N * K) / (ms * 1e9), gopsPerRun: runs.map((r) => (2 * batch * M * N * K * reps) / (r * 1e6)), verdict };
  } finally {
    for (const b of [aBuf, bBuf, cBuf, prep.params]) b.destroy();
    if (qs) { qs.destroy(); resolve.destroy(); }
  }
}

// the GEMM shapes of one default training step (recorded from the JS model on the CPU engine)
async function modelShapes() {
  const { lossAndGrads } = await import('../../frontend_js/model.js');
  const { makeConfig } = await import('../../frontend_js/config.js');
  const { initParams } = await import('../../frontend_js/model.js');
  const fx = loadFixture('train20.dsyf');
  const cfg = makeConfig(fx.header.config);
  const seen = new Map();
  const recorder = { name: 'recorder', gemm(qa, qb, b, M, K, N) { const k = `${b}x${M}x${K}x${N}`; seen.set(k, (seen.get(k) || 0) + 1); return cpuEngine.gemm(qa, qb, b, M, K, N); } };
  const x = Int32Array.from({ length: cfg.batch * cfg.seq_len }, (_, i) => i % 200), y = x.map((v) => (v + 1) % 200);
  const { referenceBackend, withEngine } = await import('../../frontend_js/engines.js');
  await lossAndGrads(initParams(cfg), cfg, x, y, cfg.batch, cfg.seq_len, withEngine(referenceBackend, recorder));
  return [...seen].map(([k, count]) => ({ shape: k.split('x').map(Number), count }));
}

await section('throughput', async () => {
  const big = SMALL ? 128 : 8192;
  const rows = [];
  const packedTunings = SMALL ? { 't32 wg8x8 r4x4 k4 (default)': H200_TUNINGS['t32 wg8x8 r4x4 k4 (default)'] } : H200_TUNINGS;
  const kernels = {};
  for (const [tname, tuning] of Object.entries(packedTunings)) {
    for (const spec of GEMM_KERNELS) kernels[`${spec.id} ${tname}`] = await GemmKernel.create(device, spec, { tuning });
  }
  // 8192^3 for every tuning of both kernels (that is the headline), 512^3 too
  for (const [name, kernel] of Object.entries(kernels)) {
    for (const n of SMALL ? [64, 128] : [512, big]) {
      const r = await timeGemm(kernel, 1, n, n, n, SMALL ? 1 : n >= 4096 ? 5 : 20, n <= 512 ? 'full' : 'freivalds');
      rows.push({ kernel: name, ...r });
      console.log(`[${elapsed()} s] ${name} ${n}^3: ${r.tops.toFixed(2)} TOPS, ${r.verdict}`);
      save();
      results.sections.throughput_partial = rows;
    }
  }
  // the model's shapes with the best packed tuning at 8192^3 and the default one
  const best = rows.filter((r) => r.kernel.startsWith('packed') && r.M === big && r.verdict.startsWith('exact')).sort((a, b) => b.tops - a.tops)[0];
  const shapes = await modelShapes();
  const modelRows = [];
  for (const name of new Set([best?.kernel, 'packed t32 wg8x8 r4x4 k4 (default)', 'portable t32 wg8x8 r4x4 k4 (default)'].filter(Boolean))) {
    for (const { shape: [b, M, K, N], count } of shapes) {
      const r = await timeGemm(kernels[name], b, M, K, N, SMALL ? 1 : 50, 'full');
      modelRows.push({ kernel: name, count, ...r });
    }
  }
  // per-call latency through engine.gemm (pack, upload, dispatch, readback, audits) at a model shape
  const e = await createGpuEngine({ device, info, log: quiet });
  const { qa, qb } = gateOperands('random', 1, 256, 32, 128, 3);
  const lat = [];
  for (let i = 0; i < 30; i++) { const t = performance.now(); await e.gemm(qa, qb, 1, 256, 32, 128); lat.push(performance.now() - t); }
  e.destroy();
  return { rows, best: best ? { kernel: best.kernel, tops: best.tops } : null, modelShapes: shapes, modelRows, engineCallMs_256x32x128: median(lat) };
});

results.finished = new Date().toISOString();
results.seconds = (performance.now() - T0) / 1000;
save();
console.log(`done in ${elapsed()} s`);
process.exit(0);
