// Where one replica's resident step goes (issue 26; TEST_RESULTS.md "The resident step on the lent
// H100, second pass"): the boot of frontend_js/gpu (createResidentStep, every gate), one
// ResidentTrainer at the given settings (default the largest: width 128, seq 128, batch 32), then
//   wall    localStep and apply (Adam + read-back + hash) of warm steps, medians; the local step
//           split at its last part's submit (the step is submitted in parts as it is encoded: the
//           host's encoding ends there) into encoding and the wait for the read-back. Since apply
//           starts the next local step ahead, localStep takes it and only waits: encode and
//           afterLastPart are then null (the split is host_split.mjs's and audit_cost.mjs's)
//   gpu     per kernel from GPU timestamps (dispatch_timer.mjs): every dispatch of one local step in its own compute pass
//           with timestampWrites (a profile: the passes split, nothing else changes), summed by
//           kernel and by unit call shape (nb x M x K x N, T = transposed operand), and the span
//           from the first dispatch's start to the last one's end
//   check   the gradients of the profiled step equal those of an unprofiled one, bit for bit
//   layout  the same local step with the unit's dispatches laid out as before issue 26's second
//           pass (one workgroup per quantized row, no split-K: unitPlan's { maxSplits: 1,
//           threads: 64 }; the kernels' other changes stay), wall medians and gradients compared
// On the lent machine, from the project root:
//   source .gpu/setup.sh && OUT=... $NODE bench/h200/resident_profile.mjs   -> $OUT/resident_profile.json
// DAISY_PROFILE_SETTINGS='{"width":32}' for other settings. Needs a hardware adapter with
// 'timestamp-query' (without it only the wall times are written).
import { createRequire } from 'node:module';
import { writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);

const { createResidentStep, ResidentTrainer } = await import('../../frontend_js/gpu/gpu.js');
const { pickCpuBackend } = await import('../../frontend_js/backends.js');
const { makeConfig } = await import('../../frontend_js/config.js');
const { Replica } = await import('../../frontend_js/train.js');
const { initParams, lossAndGrads, NORM_EPS, paramShapes } = await import('../../frontend_js/model.js');
const optim = await import('../../frontend_js/optim.js');
const { treeSum } = await import('../../frontend_js/detmath.js');
const { VOCAB_SIZE } = await import('../../frontend_js/tokenizer.js');
const { weightHash } = await import('../../frontend_js/hashing.js');
const { timeDispatches } = await import('./dispatch_timer.mjs');

const OUT = process.env.OUT || 'out';
mkdirSync(OUT, { recursive: true });
const median = (xs) => { const s = [...xs].sort((a, b) => a - b), h = s.length >> 1; return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2; };
const progress = (...w) => process.stderr.write(`${new Date().toISOString().slice(11, 23)} ${w.join(' ')}\n`);
const settings = { width: 128, seq_len: 128, batch: 32, steps: 100, ...JSON.parse(process.env.DAISY_PROFILE_SETTINGS || '{}') };
const result = { settings, started: new Date().toISOString() };
const save = () => writeFileSync(join(OUT, 'resident_profile.json'), JSON.stringify(result, null, 1));

// timestamps unquantized where Dawn allows it (the toggle's name; an unknown one is ignored)
let gpu;
try { gpu = create(['disable-dawn-features=timestamp_quantization']); } catch { gpu = create([]); }
let t0 = performance.now();
const step = await createResidentStep(gpu, { features: ['timestamp-query'] });
result.bootMs = performance.now() - t0;
result.adapter = step.info;
const { device, kernels, unit } = step;
const timestamps = device.features.has('timestamp-query');
result.timestamps = timestamps;
progress('booted in', Math.round(result.bootMs), 'ms; timestamps', timestamps);

const cfg = makeConfig(settings);
const cpu = (await pickCpuBackend({ threads: 'auto' })).backend;
const B = cfg.batch, T = cfg.seq_len;
const x = Int32Array.from({ length: B * T }, (_, i) => (i * 7919) % VOCAB_SIZE);
const y = Int32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % VOCAB_SIZE);
const batches = { get: async () => ({ x, y }) };
const params = initParams(cfg);
const trainer = new ResidentTrainer({ kernels, unit, cfg, replica: new Replica(params, optim.adamInit(params)), batches, cpu,
  lib: { treeSum, NORM_EPS, VOCAB_SIZE, optim, weightHash, lossAndGrads, paramShapes } });

// --- the wall: submit times through the queue ---------------------------------------------------
const marks = [];
const realSubmit = device.queue.submit.bind(device.queue);
device.queue.submit = (bufs) => { marks.push(performance.now()); return realSubmit(bufs); };
const wall = { localStep: [], encode: [], afterLastPart: [], apply: [], submits: [] };
for (let s = 0; s < 7; s++) {
  marks.length = 0;
  t0 = performance.now();
  const r = await trainer.localStep(s, 0);
  const t1 = performance.now(), localMarks = marks.slice();
  const t2 = performance.now();
  await trainer.apply(r.grads);
  const t3 = performance.now();
  if (s === 0) continue;                          // compile-free from here
  const last = localMarks.at(-2);                 // the last part's submit (the read-back's copy is the last)
  wall.localStep.push(t1 - t0); wall.apply.push(t3 - t2); wall.submits.push(localMarks.length);
  // a local step taken from the one apply started ahead (ResidentTrainer.startAhead) submitted its
  // parts during apply: it only waits here, and there is no split to record
  if (last !== undefined) { wall.encode.push(last - t0); wall.afterLastPart.push(t1 - last); }
  progress('step', s, 'local', (t1 - t0).toFixed(1), 'encode', (last - t0).toFixed(1), 'apply', (t3 - t2).toFixed(1));
}
result.wallMs = Object.fromEntries(Object.entries(wall).map(([k, v]) => [k, v.length ? median(v) : null]));
result.wallAll = wall;
result.cpuSteps = trainer.cpuSteps;
save();

// --- the GPU: every dispatch in its own timed pass ------------------------------------------------
if (timestamps) {
  const names = new Map();
  for (const [n, p] of Object.entries(kernels.pipes)) names.set(p, n);
  for (const [n, p] of Object.entries(unit.pipes)) names.set(p, `unit.${n}`);
  let ctx = null, quantIndex = 0;
  const realEncodeUnit = unit.encodeUnit.bind(unit);
  unit.encodeUnit = (enc, xa, ta, xb, tb, nb, m, kk, n, ...rest) => {
    ctx = `${nb}x${m}${ta ? 'T' : ''}x${kk}x${n}${tb ? 'T' : ''}`; quantIndex = 0;
    try { return realEncodeUnit(enc, xa, ta, xb, tb, nb, m, kk, n, ...rest); } finally { ctx = null; }
  };
  const timer = timeDispatches(device, (pipe, groups) => {
    let name = names.get(pipe) ?? 'unknown';
    if (name === 'unit.quant') name = quantIndex++ === 0 ? 'unit.quantA' : 'unit.quantB';
    return { name, shape: ctx, groups };
  });
  const runs = [];
  for (let rep = 0; rep < 3; rep++) {
    timer.start();
    const r = await trainer.localStep(100 + rep, 0);
    runs.push({ ...(await timer.read()), grads: r.grads });
  }
  // the median run by its kernels' sum
  const kernelMs = (run) => run.ms.reduce((a, b) => a + b, 0);
  const run = [...runs].sort((a, b) => kernelMs(a) - kernelMs(b))[1];
  const byKernel = {}, byShape = {};
  run.labels.forEach((l, i) => {
    const ms = run.ms[i];
    const k = (byKernel[l.name] ||= { ms: 0, dispatches: 0 }); k.ms += ms; k.dispatches++;
    if (l.shape) { const s = (byShape[`${l.shape} ${l.name}`] ||= { ms: 0, calls: 0, groups: l.groups }); s.ms += ms; s.calls++; }
  });
  const round = (o) => Object.fromEntries(Object.entries(o).sort((a, b) => b[1].ms - a[1].ms).map(([k, v]) => [k, { ...v, ms: +v.ms.toFixed(3) }]));
  result.gpu = {
    dispatches: run.labels.length,
    kernelsMs: +kernelMs(run).toFixed(3),
    spanMs: +run.spanMs.toFixed(3),
    allRunsKernelsMs: runs.map((r) => +kernelMs(r).toFixed(3)),
    byKernel: round(byKernel), byShape: round(byShape),
  };
  // the profiled steps trained nothing (no apply): their gradients equal the unprofiled step's
  timer.restore(); unit.encodeUnit = realEncodeUnit;
  const plain = await trainer.localStep(200, 0);
  const diff = Object.keys(plain.grads).find((k) => runs.some((r) => Buffer.compare(Buffer.from(r.grads[k].buffer), Buffer.from(plain.grads[k].buffer)) !== 0));
  result.check = diff ? `gradient ${diff} differs between the profiled and the plain step` : 'equal';
  save();
}
// the dispatch layout before vs now, whole local steps alternately, gradients compared
{
  const ms = { before: [], now: [] }, grads = {};
  for (let s = 0; s < 7; s++) {
    for (const [name, opts] of [['before', { maxSplits: 1, threads: 64 }], ['now', {}]]) {
      unit.planOpts = opts;
      const t0 = performance.now(), r = await trainer.localStep(300, 0);
      if (s > 0) ms[name].push(performance.now() - t0);
      grads[name] = r.grads;
    }
  }
  unit.planOpts = {};
  const diff = Object.keys(grads.now).find((k) => Buffer.compare(Buffer.from(grads.now[k].buffer), Buffer.from(grads.before[k].buffer)) !== 0);
  result.layout = { beforeMs: median(ms.before), nowMs: median(ms.now), check: diff ? `gradient ${diff} differs` : 'equal', all: ms };
  progress('layout before', result.layout.beforeMs.toFixed(1), 'now', result.layout.nowMs.toFixed(1), result.layout.check);
  save();
}
result.finished = new Date().toISOString();
save();
console.log(JSON.stringify({ wallMs: result.wallMs, gpu: result.gpu && { ...result.gpu, byShape: undefined }, check: result.check, layout: { ...result.layout, all: undefined } }, null, 1));
cpu.close?.();
process.exit(0);
