// The registry's rule (frontend_js/backends.js, frontend_js/gpu/route.js), pure, no GPU: given
// the timings of each GEMM shape on both paths, which path each shape runs on, the summary, and
// what the page's compute line says for every kind of choice.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { MEASURE, measuredSide, measureSummary, newShapeTimes, shapeKey, routeRule, ruleForAdapter, describeRoute, wholeStepSide, WHOLE_STEP_MARGIN,
  wholeStepsClose, WHOLE_STEP_CLOSE, WHOLE_STEP_MORE_REPS } from '../../frontend_js/gpu/route.js';
import { describeChoice, cpuName, pickBackend, GPU_MODES, PickedBackend, timeTrainers, WARMUP_STEPS } from '../../frontend_js/backends.js';
import { makeConfig } from '../../frontend_js/config.js';
import { initParams } from '../../frontend_js/model.js';
import { adamInit } from '../../frontend_js/optim.js';
import { Replica, Trainer } from '../../frontend_js/train.js';

const entry = (cpu, gpu, calls = cpu.length + gpu.length) => ({ ...newShapeTimes(), cpu, gpu, calls });

test('a shape alternates GPU, CPU until both have their samples, then runs on the smaller median', () => {
  const n = MEASURE.samples;
  assert.equal(n, 3);
  assert.deepEqual(measuredSide(entry([], [])), { side: 'gpu', decided: false }, 'the GPU first');
  assert.deepEqual(measuredSide(entry([], [5])), { side: 'cpu', decided: false });
  assert.deepEqual(measuredSide(entry([5], [5])), { side: 'gpu', decided: false });
  assert.deepEqual(measuredSide(entry([5, 5], [5, 5, 5])), { side: 'cpu', decided: false });
  // medians, not means: one slow first call (compiling, allocating) does not decide it
  assert.deepEqual(measuredSide(entry([10, 10, 10], [500, 2, 2])), { side: 'gpu', decided: true });
  assert.deepEqual(measuredSide(entry([10, 10, 10], [11, 11, 1])), { side: 'cpu', decided: true });
  assert.deepEqual(measuredSide(entry([4, 4, 4], [4, 4, 4])), { side: 'cpu', decided: true }, 'a tie stays on the CPU');
  assert.equal(shapeKey(true, false, 2, 3, 4, 5), '2x3x4x5A');
  assert.equal(shapeKey(false, true, 1, 1, 1, 1), '1x1x1x1B');
});

test('the summary weighs each shape by its calls; undecided shapes leave it undecided', () => {
  const shapes = {
    big: entry([30, 30, 30], [10, 10, 10], 8),      // GPU 3x faster, 8 calls
    small: entry([1, 1, 1], [4, 4, 4], 8),          // CPU 4x faster, 8 calls
  };
  const s = measureSummary(shapes);
  assert.equal(s.decided, true);
  assert.deepEqual([s.shapes, s.gpuShapes], [2, 1]);
  assert.equal(s.cpuMs, 8 * 30 + 8 * 1);
  assert.equal(s.gpuMs, 8 * 10 + 8 * 4);
  assert.equal(s.pickedMs, 8 * 10 + 8 * 1);
  assert.equal(s.speedup, 248 / 88);
  assert.equal(s.gpuVsCpu, 248 / 112);
  assert.equal(measureSummary({ ...shapes, new: entry([1], [1]) }).decided, false);
  assert.equal(measureSummary({}).decided, false, 'nothing timed: nothing to say');
});

// the H100 case (TEST_RESULTS "The resident step on the lent H100"): the shapes' medians promised
// 1.08x, whole steps ran at 0.69x; whole steps decide
test('whole steps decide: the route is kept only where whole steps are faster by more than the margin', () => {
  assert.equal(wholeStepSide(511, 741), 'cpu');
  assert.equal(wholeStepSide(511, 511), 'cpu', 'a tie stays on the CPU');
  assert.equal(wholeStepSide(511, 511 / WHOLE_STEP_MARGIN), 'cpu', 'within the margin: the CPU');
  assert.equal(wholeStepSide(511, 400), 'gpu');
  assert.ok(wholeStepsClose(13.3, 12.4) && wholeStepsClose(12.4, 13.3), 'the H200 default settings\' medians are close');
  assert.ok(!wholeStepsClose(202.3, 73.0) && !wholeStepsClose(10, 10 * WHOLE_STEP_CLOSE));
  const shapes = { big: entry([30, 30, 30], [10, 10, 10], 8), small: entry([1, 1, 1], [4, 4, 4], 8) };
  const slow = measureSummary(shapes, MEASURE.samples, { cpuMs: 511, pickedMs: 741, side: 'cpu' });
  assert.deepEqual([slow.decided, slow.shapes, slow.gpuShapes, slow.pickedMs, slow.speedup], [true, 2, 0, 8 * 30 + 8 * 1, 1]);
  assert.equal(slow.gpuVsCpu, 248 / 112, 'the GPU path alone is still reported');
  const fast = measureSummary(shapes, MEASURE.samples, { cpuMs: 500, pickedMs: 250, side: 'gpu' });
  assert.deepEqual([fast.gpuShapes, fast.pickedMs, fast.speedup], [1, 8 * 10 + 8 * 1, 2], 'the whole steps\' speedup, not the shapes\'');
});

test('route measure is its own rule; a software adapter is not measured unless a rule was given', () => {
  assert.deepEqual(routeRule({ route: 'measure' }), { measure: true });
  assert.equal(ruleForAdapter({ measure: true }, { isFallbackAdapter: true }, undefined).minMacs, Infinity);
  assert.deepEqual(ruleForAdapter({ measure: true }, { isFallbackAdapter: true }, { measure: true }), { measure: true });
  assert.deepEqual(ruleForAdapter({ measure: true }, { isFallbackAdapter: false }, undefined), { measure: true });
  assert.match(describeRoute({ measure: true }), /timed on the GPU and on the CPU/);
});

test('the compute line for every choice: where the GEMMs run, and by how much', () => {
  const cpu = 'wasm-simd × 4 threads', threads = { count: 4, shared: true, reason: null };
  const base = { mode: 'auto', cpu, threads };
  const booted = { state: 'gpu', kernel: 'packed', routing: 'r' };
  const m = (over) => ({ decided: true, shapes: 6, gpuShapes: 4, cpuMs: 320, gpuMs: 110, pickedMs: 100, speedup: 3.2, gpuVsCpu: 320 / 110, ...over });
  const fast = describeChoice({ ...base, gpu: { ...booted, measure: m() } });
  assert.equal(fast.path, 'gpu');
  assert.equal(fast.pathLabel, "GPU: 3.2× this device's CPU at these settings");
  assert.match(fast.pathReason, /CPU path 320\.0 ms, the GPU path 110\.0 ms, 4 of 6 GEMM shapes on the GPU; the CPU backend runs on 4 threads$/);
  const slow = describeChoice({ ...base, gpu: { ...booted, measure: m({ gpuShapes: 0, gpuMs: 900, pickedMs: 320, speedup: 1, gpuVsCpu: 320 / 900 }) } });
  assert.equal(slow.path, 'cpu');
  assert.equal(slow.pathLabel, `CPU (${cpu}) — GPU 0.36× this device's CPU here`);
  assert.equal(slow.engine, cpu);
  const routeSlow = describeChoice({ ...base, gpu: { ...booted, measure: m({ gpuShapes: 0, speedup: 1, wholeSteps: { cpuMs: 511, pickedMs: 741, side: 'cpu' } }) } });
  assert.deepEqual([routeSlow.path, routeSlow.pathLabel], ['cpu', `CPU (${cpu}) — GPU route 0.69× this device's CPU here (whole steps)`]);
  assert.match(routeSlow.pathReason, /whole steps: the CPU path 511\.0 ms, the measured route 741\.0 ms \(the CPU is faster in whole steps at these settings\); the CPU backend/);
  const routeFast = describeChoice({ ...base, gpu: { ...booted, measure: m({ speedup: 2, wholeSteps: { cpuMs: 500, pickedMs: 250, side: 'gpu' } }) } });
  assert.deepEqual([routeFast.path, routeFast.pathLabel], ['gpu', "GPU: 2.0× this device's CPU at these settings"]);
  const timing = describeChoice({ ...base, gpu: booted });
  assert.deepEqual([timing.path, timing.pathLabel], ['gpu', 'GPU (WebGPU) — timing it against the CPU']);
  const all = describeChoice({ ...base, mode: 'all', gpu: booted });
  assert.deepEqual([all.path, all.pathLabel], ['gpu', 'GPU (WebGPU, every GEMM)']);
  assert.match(all.engine, /every GEMM/);
  const cases = [
    [null, 'no WebGPU', 'WebGPU not available in this browser'],
    [{ state: 'off' }, 'WebGPU off (?gpu=off)', 'WebGPU turned off by ?gpu=off'],
    [{ state: 'missing' }, 'no GPU engine in this build', 'GPU engine not available in this build'],
    [{ state: 'failed', reason: 'boom' }, 'GPU engine failed to start', 'GPU engine failed to start: boom'],
    [{ state: 'unusable', reason: 'gate' }, 'GPU unusable', 'GPU unusable: gate'],
    [{ state: 'fault', reason: 'device lost' }, 'GPU disabled after a fault', 'GPU disabled: device lost'],
    [{ ...booted, state: 'software' }, 'WebGPU adapter is software', 'WebGPU packed kernel, gates passed; r'],
  ];
  for (const [gpu, short, reason] of cases) {
    const d = describeChoice({ mode: 'auto', cpu: 'wasm-simd', threads: { count: 1, shared: false, reason: 'one core' }, gpu });
    assert.equal(d.path, 'cpu', short);
    assert.equal(d.pathLabel, `CPU (wasm-simd) — ${short}`);
    assert.equal(d.pathReason, `${reason}; the CPU backend runs on one thread: one core`);
    assert.ok(d.pathLabel.length <= 60, d.pathLabel);
  }
  assert.equal(cpuName({ threads: 4, name: 'x' }, { shared: false }), 'wasm-simd × 4 workers');
  assert.equal(cpuName({ threads: 1, name: 'wasm-simd' }, null), 'wasm-simd');
});

test('pickBackend without a GPU or with the GPU off: the CPU backend, said so; an unknown mode refused', async () => {
  assert.deepEqual(GPU_MODES, ['auto', 'all', 'resident', 'off']);
  const none = await pickBackend({ gpu: null, threads: 1 });
  assert.equal(none.backend, none.cpu);
  assert.equal(none.backend.name, 'wasm-simd');
  assert.deepEqual([none.describe().path, none.describe().pathLabel], ['cpu', 'CPU (wasm-simd) — no WebGPU']);
  const off = await pickBackend({ gpu: {}, mode: 'off', threads: 1 });
  assert.equal(off.describe().pathLabel, 'CPU (wasm-simd) — WebGPU off (?gpu=off)');
  const missing = await pickBackend({ gpu: {}, threads: 1, has: (p) => p !== 'gpu/gpu.js' });
  assert.equal(missing.describe().pathLabel, 'CPU (wasm-simd) — no GPU engine in this build');
  await assert.rejects(pickBackend({ mode: 'resident?' }), /unknown GPU mode/);
});

test("mode 'resident': said so when booted; without an adapter the CPU, saying why; the trainer is the registry's", async () => {
  const d = describeChoice({ mode: 'resident', cpu: 'wasm-simd', gpu: { state: 'resident', adapter: 'nvidia nvidia-h200' } });
  assert.deepEqual([d.path, d.pathLabel], ['gpu', 'GPU (WebGPU, the whole step resident)']);
  assert.match(d.pathReason, /^the resident step on nvidia nvidia-h200: weights, moments and activations on the GPU/);
  assert.equal(d.engine, 'webgpu resident step (else wasm-simd)');
  const noAdapter = await pickBackend({ gpu: { requestAdapter: async () => null }, mode: 'resident', threads: 1 });
  assert.equal(noAdapter.resident, null);
  assert.deepEqual([noAdapter.describe().path, noAdapter.describe().pathLabel], ['cpu', 'CPU (wasm-simd) — GPU unusable']);
  assert.match(noAdapter.describe().pathReason, /the resident step: WebGPU has no adapter/);
  // the trainer of a run: a train.js Trainer on the picked backend when nothing is resident
  const cfg = makeConfig({ width: 16, seq_len: 16, batch: 2, layers: 1, heads: 2, steps: 100 });
  const params = initParams(cfg), replica = new Replica(params, adamInit(params));
  const t = noAdapter.trainer(cfg, replica, null);
  assert.ok(t instanceof Trainer && t.backend === noAdapter.backend && t.replica === replica);
});

// mode 'auto' on a hardware adapter times the resident step against the CPU in whole replica steps
// at a run's settings (PickedBackend.prepare); here the timing on two real CPU trainers, and the
// compute line for each verdict
test('whole replica steps are timed for each candidate trainer; the compute line says what they chose', async () => {
  const { Trainer } = await import('../../frontend_js/train.js');
  const { makeConfig } = await import('../../frontend_js/config.js');
  const { bestBackend, referenceBackend } = await import('../../frontend_js/engines.js');
  const cfg = makeConfig({ width: 16, seq_len: 16, batch: 2, layers: 1, heads: 2, steps: 100 });
  const made = [];
  const maker = (backend) => (c, r, b) => { const t = new Trainer(c, r, b, backend); made.push(t); return t; };
  const ms = await timeTrainers([maker(referenceBackend), maker(await bestBackend())], cfg, 2, { warmupMs: 0 });
  assert.equal(ms.length, 2);
  for (const x of ms) assert.ok(Number.isFinite(x) && x > 0, `ms ${ms}`);
  assert.deepEqual(made.map((t) => t.replica.step), [3, 3], 'a warm-up and 2 timed steps each');
  // warmed up for a time: more steps than one, at most WARMUP_STEPS + the timed ones
  made.length = 0;
  await timeTrainers([maker(referenceBackend)], cfg, 2, { warmupMs: 40 });
  assert.ok(made[0].replica.step > 3 && made[0].replica.step <= WARMUP_STEPS + 2, `steps ${made[0].replica.step}`);
  const cpu = await bestBackend();
  const picked = new PickedBackend({ mode: 'auto', cpu, threads: { count: 1, shared: false, reason: 'one thread asked for' }, gpu: { state: 'off' } });
  picked.prepared = { residentMs: 195, cpuMs: 515, chosen: true };
  const on = picked.describe();
  assert.deepEqual([on.path, on.pathLabel], ['gpu', "GPU (WebGPU, the whole step resident): 2.6× this device's CPU at these settings"]);
  assert.match(on.pathReason, /^whole steps at these settings: the resident step 195\.0 ms, the other path 515\.0 ms; /);
  picked.prepared = { residentMs: 59, cpuMs: 30, chosen: false };
  const off = picked.describe();
  assert.equal(off.path, 'cpu');
  assert.match(off.pathReason, /the resident step 59\.0 ms, the other path 30\.0 ms \(the resident step is slower here\)$/);
  picked.prepared = { fault: 'device lost' };
  assert.match(picked.describe().pathReason, /; the resident step is off: device lost$/);
  // without a resident candidate, prepare() at settings with nothing to time says nothing new
  picked.prepared = null;
  await picked.prepare(cfg);
  assert.equal(picked.prepared, null);
  assert.ok(picked.trainer(cfg, made[0].replica, null) instanceof Trainer);
});

// prepare()'s verdict on a resident candidate from the medians timeSteps gives (scripted here): far
// apart, three steps each decide; close, the verdict is the one of more steps (the first is dropped)
test('medians too close to call are timed again on more steps, and that verdict is kept', async () => {
  const { makeConfig } = await import('../../frontend_js/config.js');
  const { bestBackend } = await import('../../frontend_js/engines.js');
  const cfg = makeConfig({ width: 16, seq_len: 16, batch: 2, layers: 1, heads: 2, steps: 100 });
  const cpu = await bestBackend();
  const prepared = async (script) => {
    const calls = [];
    const timeSteps = async (makers, c, reps = 3) => { calls.push(reps); assert.equal(makers.length, 2); return script[calls.length - 1]; };
    const picked = new PickedBackend({ mode: 'auto', cpu, threads: { count: 1, shared: false, reason: null }, gpu: { state: 'off' },
      residentCandidate: { kernels: null, unit: null, ResidentTrainer: class {} }, timeSteps });
    await picked.prepare(cfg);
    return { calls, prepared: picked.prepared };
  };
  let r = await prepared([[202.3, 73.0]]);
  assert.deepEqual(r.calls, [3], 'far apart: decided on three steps each');
  assert.deepEqual(r.prepared, { residentMs: 73.0, cpuMs: 202.3, chosen: true });
  r = await prepared([[13.3, 12.4], [13.1, 12.9]]);
  assert.deepEqual(r.calls, [3, WHOLE_STEP_MORE_REPS], 'close: timed again');
  assert.deepEqual(r.prepared, { residentMs: 12.9, cpuMs: 13.1, chosen: false }, 'the second verdict: within the margin, the CPU');
  r = await prepared([[13.3, 12.4], [14.0, 11.0]]);
  assert.deepEqual(r.prepared, { residentMs: 11.0, cpuMs: 14.0, chosen: true });
});
