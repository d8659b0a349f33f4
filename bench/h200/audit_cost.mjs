// What the unit's self-audit costs the resident step (issue 26; TEST_RESULTS.md "The unit's
// self-audit": +13–29 ms of the largest 2-peer step on an H100, not found on the host's side in
// Chromium). A 2-peer Group through the registry's resident trainers, the audit on
// (UNIT_AUDIT_SAMPLES elements per unit call) and off (trainer.unitAuditSamples = 0), in
// alternating runs in one process, so the host, the GPU's clock and the pools are the same. (Commit
// 6e25954 also timed the check placed at a step's arrival against localStep: no difference.) Per run:
//   stepMs        the Group's step, median of the steady steps (the first WARM left out)
//   encodeMs      forward()'s synchronous part (the host encoding the local step), median
//   resolveMs     from forward()'s return to its result (the GPU's work and the read-back), median
//   checkMs       checkUnitAudits on the run's last result, timed after the run (medians of 15)
//   checkRowsMs   the same check with each element through units.js quantizeRows (what unitDot
//                 replaced), on the same values: the fused element's gain on this host
// (Commits 6e25954 and before timed the check inside each step: that added the check's time again
// to the audited runs' steps, ~2.6 ms per replica at the largest settings.)
//   bindGroups, uniformChunks   bind groups made and uniform buffers held, added during the steady steps
//   readMB        the local step's read-back per replica (what readMany copies)
// Then, with GPU timestamps (a device opened as resident_profile.mjs opens it), one local step
// with the audit and one without, every dispatch in its own timed pass: the gather's GPU time and
// the span. Every run's hashes equal the first run's (the audit changes no bit).
//   source .gpu/setup.sh && OUT=... $NODE bench/h200/audit_cost.mjs       -> $OUT/audit_cost.json
// DAISY_SETTINGS_JSON='{"width":32,"seq_len":32,"batch":8}' for other settings; ROUNDS (4), STEPS (30), WARM (12).
import { createRequire } from 'node:module';
import { writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);

const { pickBackend } = await import('../../frontend_js/backends.js');
const { makeConfig } = await import('../../frontend_js/config.js');
const { Group } = await import('../../frontend_js/train.js');
const { textStream } = await import('../../frontend_js/data.js');
const { checkUnitAudits, UNIT_AUDIT_SAMPLES } = await import('../../frontend_js/gpu/resident.js');
const { quantizeRows } = await import('../../frontend_js/units.js');
const { timeDispatches } = await import('./dispatch_timer.mjs');

// checkUnitAudits with each element through quantizeRows (the code before unitDot) -> the count of differences
function checkViaRows(audits) {
  let bad = 0;
  for (const { kk, samples, values } of audits) {
    for (let s = 0; s < samples.length; s++) {
      const at = s * (2 * kk + 1), qa = quantizeRows(values.subarray(at, at + kk), 1, 1, kk), qb = quantizeRows(values.subarray(at + kk, at + 2 * kk), 1, 1, kk);
      let acc = 0;
      for (let k = 0; k < kk; k++) acc += qa.q[k] * qb.q[k];
      if (!Object.is((acc * qa.s[0]) * qb.s[0], values[at + 2 * kk])) bad++;
    }
  }
  return bad;
}

const OUT = process.env.OUT || 'out';
mkdirSync(OUT, { recursive: true });
const ROUNDS = Number(process.env.ROUNDS || 4), STEPS = Number(process.env.STEPS || 30), WARM = Number(process.env.WARM || 12);
const settings = { width: 128, seq_len: 128, batch: 32, steps: 100, ...JSON.parse(process.env.DAISY_SETTINGS_JSON || '{}') };
const cfg = makeConfig(settings);
const median = (xs) => { if (!xs.length) return null; const s = [...xs].sort((a, b) => a - b), h = s.length >> 1; return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2; };
const progress = (...w) => process.stderr.write(`${new Date().toISOString().slice(11, 23)} ${w.join(' ')}\n`);
const stream = textStream('the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. '.repeat(2000));
const result = { settings, rounds: ROUNDS, steps: STEPS, warm: WARM, unitAuditSamples: UNIT_AUDIT_SAMPLES, started: new Date().toISOString(), runs: [] };
const save = () => writeFileSync(join(OUT, 'audit_cost.json'), JSON.stringify(result, null, 1));

const picked = await pickBackend({ gpu: create([]), mode: 'resident', threads: 'auto' });
if (!picked.resident) throw new Error(`no resident step: ${JSON.stringify(picked.describe())}`);
result.adapter = picked.resident.info;
// bind groups made and uniform buffers held by a Group's trainers (each trainer's own kernels,
// ResidentKernels.own; DAISY_SHARED_KERNELS=1: the trainers share the registry's, as before)
const SHARED = process.env.DAISY_SHARED_KERNELS === '1';
const made = (g) => SHARED ? picked.resident.kernels.groups.made : g.trainers.reduce((n, t) => n + t.k.groups.made, 0);
const chunks = (g) => SHARED ? picked.resident.kernels.uniformChunks.length : g.trainers.reduce((n, t) => n + t.k.uniformChunks.length, 0);
result.sharedKernels = SHARED;

// a trainer whose forward() is timed: its synchronous part (encoding) and the rest (GPU + read-back)
function metered(trainer, samples, meter) {
  trainer.unitAuditSamples = samples;
  if (SHARED) { trainer.k = picked.resident.kernels; trainer.ownsKernels = false; }
  const real = trainer.forward.bind(trainer);
  trainer.forward = (...a) => {
    const t0 = performance.now(), p = real(...a), t1 = performance.now();
    return p.then((r) => {
      const t2 = performance.now();
      if (meter.on) {
        meter.encodeMs.push(t1 - t0); meter.resolveMs.push(t2 - t1); meter.audits = r.audits;
        meter.readMB = (Object.values(r.grads).reduce((n, g) => n + g.length, 0) + r.audits.reduce((n, x) => n + x.values.length, 0)) * 8 / 2 ** 20;
        meter.auditMB = r.audits.reduce((n, x) => n + x.values.length, 0) * 8 / 2 ** 20;
      }
      return r;
    });
  };
  return trainer;
}

async function run(samples, label) {
  const meter = { on: false, encodeMs: [], resolveMs: [], audits: [], readMB: 0, auditMB: 0 };
  const g = new Group(cfg, 2, stream, picked.cpu, null, (c, r, b, o) => metered(picked.trainer(c, r, b, o), samples, meter));
  const ms = [], hashes = [];
  let made0 = 0, chunks0 = 0;
  for (let s = 0; s < STEPS; s++) {
    if (s === WARM) { meter.on = true; made0 = made(g); chunks0 = chunks(g); }
    const t0 = performance.now(); const r = await g.step(); ms.push(performance.now() - t0); hashes.push(r.hashes[0]);
  }
  // the last step's check timed after the run (inside it, the timing would be the step's too)
  const checkMs = [], checkRowsMs = [];
  let rowsBad = 0;
  for (let i = 0; i < 15; i++) {
    const c0 = performance.now(); checkUnitAudits(meter.audits); const c1 = performance.now(); rowsBad += checkViaRows(meter.audits);
    checkMs.push(c1 - c0); checkRowsMs.push(performance.now() - c1);
  }
  const out = { label, samples, stepMs: median(ms.slice(WARM)), encodeMs: median(meter.encodeMs), resolveMs: median(meter.resolveMs), checkMs: median(checkMs), checkRowsMs: median(checkRowsMs), rowsBad,
    bindGroups: made(g) - made0, uniformChunks: chunks(g) - chunks0, readMB: +meter.readMB.toFixed(3), auditMB: +meter.auditMB.toFixed(3),
    unitAudits: g.trainers.map((t) => t.unitAudits), cpuSteps: g.trainers.map((t) => t.cpuSteps), aheadUsed: g.trainers.map((t) => t.aheadUsed), all: ms, hashes };
  progress(label, 'step', out.stepMs.toFixed(1), 'encode', out.encodeMs.toFixed(2), 'resolve', out.resolveMs.toFixed(2), 'check', out.checkMs.toFixed(2), 'bind groups', out.bindGroups);
  return out;
}

for (let round = 0; round < ROUNDS; round++) {
  for (const [samples, label] of round % 2 ? [[0, 'off'], [UNIT_AUDIT_SAMPLES, 'on']] : [[UNIT_AUDIT_SAMPLES, 'on'], [0, 'off']]) {
    result.runs.push(await run(samples, label));
    save();
  }
}
const first = result.runs[0].hashes;
result.hashesEqual = result.runs.every((r) => JSON.stringify(r.hashes) === JSON.stringify(first));
for (const r of result.runs) delete r.hashes;
const by = (label, key) => median(result.runs.filter((r) => r.label === label).map((r) => r[key]));
result.summary = Object.fromEntries(['stepMs', 'encodeMs', 'resolveMs', 'checkMs', 'checkRowsMs'].map((key) => [key, { on: by('on', key), off: by('off', key), diff: by('on', key) - by('off', key) }]));
save();

// the GPU's side: one local step's dispatches timed, with the audit and without
if (process.env.DAISY_TIMESTAMPS !== '0') {
  const gpuModule = await import('../../frontend_js/gpu/gpu.js');
  let step;
  try { step = await gpuModule.createResidentStep(create(['disable-dawn-features=timestamp_quantization']), { features: ['timestamp-query'] }); } catch (e) { result.gpu = { error: `${e}` }; }
  if (step && step.device.features.has('timestamp-query')) {
    const { device, kernels, unit } = step, names = new Map();
    for (const [n, p] of Object.entries(kernels.pipes)) names.set(p, n);
    for (const [n, p] of Object.entries(unit.pipes)) names.set(p, `unit.${n}`);
    const timer = timeDispatches(device, (pipe) => names.get(pipe) ?? 'unknown');
    result.gpu = {};
    const { Replica } = await import('../../frontend_js/train.js');
    const { initParams } = await import('../../frontend_js/model.js');
    const { adamInit } = await import('../../frontend_js/optim.js');
    const { VOCAB_SIZE } = await import('../../frontend_js/tokenizer.js');
    const B = cfg.batch, T = cfg.seq_len;
    const x = Int32Array.from({ length: B * T }, (_, i) => (i * 7919) % VOCAB_SIZE), y = Int32Array.from({ length: B * T }, (_, i) => (i * 104729 + 1) % VOCAB_SIZE);
    const params = initParams(cfg);
    // the registry's own maker, on this timestamped device's kernels
    const t = picked.residentTrainer({ kernels, unit, ResidentTrainer: gpuModule.ResidentTrainer }, cfg, new Replica(params, adamInit(params)), { get: async () => ({ x, y }) });
    for (const [samples, label] of [[UNIT_AUDIT_SAMPLES, 'on'], [0, 'off'], [UNIT_AUDIT_SAMPLES, 'on2'], [0, 'off2']]) {
      t.unitAuditSamples = samples;
      await t.localStep(0, 0);                       // pipelines and bind groups warm
      timer.start();
      await t.localStep(1, 0);
      const { labels, ms, spanMs } = await timer.read();
      const byKernel = {};
      labels.forEach((name, i) => { byKernel[name] = +((byKernel[name] || 0) + ms[i]).toFixed(4); });
      result.gpu[label] = { dispatches: labels.length, kernelsMs: +ms.reduce((a, b) => a + b, 0).toFixed(3),
        spanMs: +spanMs.toFixed(3), gatherMs: byKernel.auditGather ?? 0, byKernel };
      progress('gpu', label, JSON.stringify({ ...result.gpu[label], byKernel: undefined }));
      save();
    }
  }
}
result.finished = new Date().toISOString();
save();
console.log(JSON.stringify({ summary: result.summary, hashesEqual: result.hashesEqual, gpu: result.gpu && Object.fromEntries(Object.entries(result.gpu).map(([l, v]) => [l, { ...v, byKernel: undefined }])) }, null, 1));
picked.cpu.close?.();
process.exit(0);
