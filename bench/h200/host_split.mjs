// Where the host's time goes in a resident step (issue 26; TEST_RESULTS.md "The resident step on
// the lent H200, after the second pass" left ~43 ms of a 63-ms local step unexplained): the
// trainer's methods and the GPU calls it makes are wrapped with timers (nothing they compute
// changes), and garbage collections are counted from Node's `gc` performance entries, in three
// scenes at the same settings (default the largest):
//   alone   one ResidentTrainer on fixed tokens (what resident_profile.mjs times)
//   group   a 2-peer Group through the registry's resident trainers on the token stream (what
//           pick_and_resident.mjs residentStep times), the exchange timed too
//   after   the lone trainer again, after 3 steps of a 2-peer Group on the CPU backend
// Each scene: medians per phase of a local step (batch, upload, encode, submit, bind groups,
// uniforms, read-back, GC) and of Adam (read-back, hash). The hashes of the group's steps are
// compared with a CPU Group's.
//   source .gpu/setup.sh && OUT=... $NODE [--cpu-prof --cpu-prof-dir=DIR] bench/h200/host_split.mjs
// DAISY_SETTINGS_JSON='{"width":32}' for other settings; STEPS (default 8).
import { createRequire } from 'node:module';
import { writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { PerformanceObserver } from 'node:perf_hooks';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);

const { pickBackend } = await import('../../frontend_js/backends.js');
const { makeConfig } = await import('../../frontend_js/config.js');
const { Group, Replica } = await import('../../frontend_js/train.js');
const { textStream } = await import('../../frontend_js/data.js');
const { initParams } = await import('../../frontend_js/model.js');
const optim = await import('../../frontend_js/optim.js');
const { VOCAB_SIZE } = await import('../../frontend_js/tokenizer.js');

const OUT = process.env.OUT || 'out';
mkdirSync(OUT, { recursive: true });
const STEPS = Number(process.env.STEPS || 8);
const settings = { width: 128, seq_len: 128, batch: 32, steps: 100, ...JSON.parse(process.env.DAISY_SETTINGS_JSON || '{}') };
const cfg = makeConfig(process.env.DAISY_BENCH_DRY === '1' ? { width: 16, seq_len: 16, batch: 2, layers: 1, heads: 2, steps: 100 } : settings);
const median = (xs) => { if (!xs.length) return null; const s = [...xs].sort((a, b) => a - b), h = s.length >> 1; return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2; };
const progress = (...w) => process.stderr.write(`${new Date().toISOString().slice(11, 23)} ${w.join(' ')}\n`);
const stream = textStream('the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. '.repeat(2000));
const result = { settings, steps: STEPS, started: new Date().toISOString(), scenes: {} };
const save = () => writeFileSync(join(OUT, 'host_split.json'), JSON.stringify(result, null, 1));

// --- the meters: a current phase record that the wrappers add to -----------------------------
let rec = null;                                  // the record of the call being timed, or null
const add = (key, ms) => { if (rec) rec[key] = (rec[key] || 0) + ms; };
const count = (key) => { if (rec) rec[key] = (rec[key] || 0) + 1; };
new PerformanceObserver((list) => { for (const e of list.getEntries()) { add('gcMs', e.duration); count('gcs'); } }).observe({ entryTypes: ['gc'] });
const timed = (obj, name, key) => {
  if (typeof obj?.[name] !== 'function') return;   // the dry run's CPU backend may lack it
  const real = obj[name].bind(obj);
  obj[name] = (...a) => {
    const t0 = performance.now(), r = real(...a);
    if (r && typeof r.then === 'function') return r.then((v) => { add(key, performance.now() - t0); return v; });
    add(key, performance.now() - t0); count(`${key}N`);
    return r;
  };
};

// DAISY_BENCH_DRY=1: the CPU trainers (mode 'off'), to check this script where no GPU boots it
const DRY = process.env.DAISY_BENCH_DRY === '1';
// DAISY_PROFILE_DEVICE=1: the device opened as resident_profile.mjs opens it (the instance toggle
// disable-dawn-features=timestamp_quantization, the feature timestamp-query), the trainers the registry's
const PROFILE_DEVICE = process.env.DAISY_PROFILE_DEVICE === '1';
const picked = await pickBackend({ gpu: DRY ? null : create([]), mode: DRY ? 'off' : PROFILE_DEVICE ? 'off' : 'resident', threads: 'auto' });
if (PROFILE_DEVICE) {
  const gpuModule = await import('../../frontend_js/gpu/gpu.js');
  const step = await gpuModule.createResidentStep(create(['disable-dawn-features=timestamp_quantization']), { features: ['timestamp-query'] });
  picked.resident = { ...step, ResidentTrainer: gpuModule.ResidentTrainer };
}
result.profileDevice = PROFILE_DEVICE;
if (!picked.resident && !DRY) throw new Error(`no resident step: ${JSON.stringify(picked.describe())}`);
result.adapter = picked.resident?.info; result.cpuThreads = picked.threads;
const { kernels: k, unit } = picked.resident || { kernels: { readMany: async () => null }, unit: { encodeUnit() {} } }, device = k.device || { queue: { submit() {}, writeBuffer() {} }, createBindGroup() {}, createCommandEncoder() {} };
timed(device.queue, 'submit', 'submitMs');
timed(device.queue, 'writeBuffer', 'writeBufferMs');
timed(device, 'createBindGroup', 'bindGroupMs');
timed(device, 'createCommandEncoder', 'encoderMs');
timed(k, 'uniform', 'uniformMs');
timed(k, 'scratch', 'scratchMs');
timed(unit, 'encodeUnit', 'encodeUnitMs');

// the phases of one trainer: its read-backs, upload and batch inside localStep / apply
timed(k, 'readMany', 'readMs');
const metered = new WeakSet();                    // batch sources already wrapped (a Group's trainers share one)
function meter(trainer) {
  if (trainer.sync) timed(trainer, 'sync', 'syncMs');
  // the backend is frozen: the trainer gets a child of it whose weightHashAsync is timed
  const cpu = trainer.backend, hash = cpu.weightHashAsync.bind(cpu);
  trainer.backend = Object.defineProperty(Object.create(cpu), 'weightHashAsync',
    { value: (...a) => { const t0 = performance.now(); return hash(...a).then((v) => { add('hashMs', performance.now() - t0); return v; }); } });
  if (!metered.has(trainer.batches)) { metered.add(trainer.batches); timed(trainer.batches, 'get', 'batchMs'); }
  const realLocal = trainer.localStep.bind(trainer), realApply = trainer.apply.bind(trainer);
  trainer.localStep = async (...a) => wrap('local', () => realLocal(...a));
  trainer.apply = async (...a) => wrap('apply', () => realApply(...a));
  return trainer;
}
let log = null;                                   // the scene's records
async function wrap(kind, fn) {
  const outer = rec; rec = { kind }; const mine = rec;
  const t0 = performance.now();
  try { return await fn(); } finally { mine.wallMs = performance.now() - t0; log?.push(mine); rec = outer; }
}
const summary = (records) => {
  const out = {};
  for (const kind of ['local', 'apply', 'exchange', 'step']) {
    const rs = records.filter((r) => r.kind === kind).slice(kind === 'step' ? 1 : 2);   // compile-free
    if (!rs.length) continue;
    const keys = [...new Set(rs.flatMap((r) => Object.keys(r)))].filter((x) => x !== 'kind');
    out[kind] = Object.fromEntries(keys.map((key) => [key, +median(rs.map((r) => r[key] || 0)).toFixed(3)]));
    out[kind].n = rs.length;
  }
  return out;
};

const fixed = () => {
  const B = cfg.batch, T = cfg.seq_len;
  const x = Int32Array.from({ length: B * T }, (_, i) => (i * 7919) % VOCAB_SIZE);
  const y = Int32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % VOCAB_SIZE);
  return { get: async () => ({ x, y }) };
};
async function alone(name) {
  progress(name);
  log = [];
  const params = initParams(cfg);
  const t = meter(picked.trainer(cfg, new Replica(params, optim.adamInit(params)), fixed()));
  for (let s = 0; s < STEPS; s++) { const r = await t.localStep(s, 0); await t.apply(r.grads); }
  t.destroy?.();
  result.scenes[name] = { ...summary(log), records: log };
  log = null; save();
}

await alone('alone');

{
  progress('group');
  log = [];
  const g = new Group(cfg, 2, stream, picked.cpu, null, (c, r, b, o) => meter(picked.trainer(c, r, b, o)));
  const realExchange = g.collective.exchange.bind(g.collective);
  g.collective.exchange = (...a) => { const r = { kind: 'exchange' }, t0 = performance.now(); const p = realExchange(...a); r.callMs = performance.now() - t0; log.push(r); return p.then((v) => { r.wallMs = performance.now() - t0; return v; }); };
  const hashes = [];
  for (let s = 0; s < STEPS; s++) {
    const r = await wrap('step', () => g.step());
    hashes.push(r.hashes[0]);
    progress('  group step', s, Math.round(log.filter((x) => x.kind === 'step').at(-1).wallMs), 'ms');
  }
  result.scenes.group = { ...summary(log), records: log };
  log = null; save();
  progress('cpu group');
  const cpuG = new Group(cfg, 2, stream, picked.cpu), cpuHashes = [], cpuMs = [];
  for (let s = 0; s < STEPS; s++) { const t0 = performance.now(); cpuHashes.push((await cpuG.step()).hashes[0]); cpuMs.push(performance.now() - t0); }
  const firstBad = hashes.findIndex((h, i) => h !== cpuHashes[i]);
  result.scenes.group.hashesEqual = firstBad < 0; result.scenes.group.firstBad = firstBad;
  result.scenes.group.cpuStepMs = median(cpuMs.slice(1)); result.scenes.group.cpuAll = cpuMs;
  result.scenes.group.stepRatio = result.scenes.group.cpuStepMs / result.scenes.group.step.wallMs;
  save();
}

await alone('after');
result.finished = new Date().toISOString();
save();
const brief = Object.fromEntries(Object.entries(result.scenes).map(([n, s]) => [n, { ...s, records: undefined, cpuAll: undefined }]));
console.log(JSON.stringify(brief, null, 1));
picked.cpu.close?.();
process.exit(0);
