// The registry on a real WebGPU adapter (SwiftShader, under Node): pickBackend times the GPU and
// the CPU path on the run's settings (measured even on a software adapter here: the rule is
// given), reports the pick through onChange, trains with the bits of the CPU backend, and a GPU
// fault moves it to the CPU with one more onChange (the page announces it: peer.js detectPath).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { nodeGpu } from './node_gpu.mjs';
import { pickBackend, settle } from '../../frontend_js/backends.js';
import { makeConfig } from '../../frontend_js/config.js';
import { Group } from '../../frontend_js/train.js';
import { textStream } from '../../frontend_js/data.js';

const TINY = { width: 16, seq_len: 16, batch: 2, layers: 1, heads: 2, steps: 100, seed: 7 };
const stream = textStream('the quick brown fox jumps over the lazy dog. '.repeat(200));

test('the pick is measured at the run settings, reported, bit-identical, and a fault falls back and is reported', async () => {
  const cfg = makeConfig(TINY), heard = [];
  const picked = await pickBackend({ gpu: nodeGpu(), mode: 'auto', threads: 1, settings: cfg, onChange: (d) => heard.push(d),
    engineOpts: { routeRule: { measure: true }, log: { log: () => {} } } });
  const e = picked.engine;
  assert.equal(e.status.path, 'gpu', e.status.reasons.join('; '));
  const m = e.status.measure;
  assert.ok(m && m.decided && m.shapes >= 4, `the settle steps measured no shapes: ${JSON.stringify(m)}`);
  for (const [key, t] of Object.entries(e.shapeTimes)) assert.ok(t.cpu.length >= 3 && t.gpu.length >= 3, `${key} undecided: ${JSON.stringify(t)}`);
  const d = picked.describe();
  assert.ok(heard.length >= 1 && heard.at(-1).pathLabel === d.pathLabel, 'the measurement was not reported through onChange');
  // shapes that went to the GPU were confirmed by whole steps on both paths (on SwiftShader the CPU wins them)
  const w = m.wholeSteps;
  if (w) {
    assert.ok(w.cpuMs > 0 && w.pickedMs > 0 && ['cpu', 'gpu'].includes(w.side), JSON.stringify(w));
    if (w.side === 'cpu') {
      assert.equal(m.gpuShapes, 0);
      assert.match(d.pathLabel, /^CPU \(wasm-simd\) — GPU route [\d.]+× this device's CPU here \(whole steps\)$/);
      const before = e.stats.gpuCalls;
      await new Group(cfg, 1, stream, picked.backend).step();
      assert.equal(e.stats.gpuCalls, before, 'a shape decided for the GPU still went there after whole steps chose the CPU');
    }
  } else {
    assert.equal(m.gpuShapes, 0, 'shapes on the GPU without whole steps timed');
    assert.match(d.pathLabel, /^CPU \(wasm-simd\) — GPU [\d.]+× this device's CPU here$/);
  }
  assert.equal(d.path, m.gpuShapes > 0 ? 'gpu' : 'cpu');
  // the measured backend trains with the CPU backend's bits
  const onPick = new Group(cfg, 2, stream, picked.backend), onCpu = new Group(cfg, 2, stream, picked.cpu);
  for (let s = 0; s < 3; s++) {
    const [a, b] = [await onPick.step(), await onCpu.step()];
    assert.deepEqual(a.hashes, b.hashes, `step ${s + 1}`);
  }
  // a fault: the backend is the CPU's and the change is heard, saying so
  const before = heard.length;
  e.fault('a test fault', 'test');
  assert.equal(heard.length, before + 1, 'the fault was not reported through onChange');
  assert.deepEqual([heard.at(-1).path, heard.at(-1).pathLabel], ['cpu', 'CPU (wasm-simd) — GPU disabled after a fault']);
  assert.match(heard.at(-1).pathReason, /^GPU disabled: a test fault/);
  assert.equal(picked.backend, picked.cpu);
  e.destroy();
});

// The shapes' medians can promise what whole steps do not give (on the H100: 1.08x by the shapes,
// 0.69x in whole steps, TEST_RESULTS "The resident step on the lent H100"). Here the shapes are
// told the GPU won every one of them; settle then times whole steps on both real paths, SwiftShader
// loses them, and every shape stays on the CPU, said so on the compute line.
test('whole steps overrule the shapes: a route slower in whole steps is not kept', async () => {
  const cfg = makeConfig(TINY), heard = [];
  const picked = await pickBackend({ gpu: nodeGpu(), mode: 'auto', threads: 1, settings: cfg, onChange: (d) => heard.push(d),
    engineOpts: { routeRule: { measure: true }, log: { log: () => {} } } });
  const e = picked.engine;
  for (const t of Object.values(e.shapeTimes)) t.gpu = t.cpu.map((ms) => ms / 100);   // "the GPU won every shape"
  e.measured();
  assert.equal(e.status.measure.gpuShapes, e.status.measure.shapes);
  await settle(picked, cfg);
  const w = e.status.measure.wholeSteps;
  assert.ok(w && w.cpuMs > 0 && w.pickedMs > 0, `no whole steps timed: ${JSON.stringify(e.status.measure)}`);
  assert.equal(w.side, 'cpu', `SwiftShader won whole steps: ${JSON.stringify(w)}`);
  assert.equal(e.status.measure.gpuShapes, 0);
  const d = picked.describe();
  assert.equal(d.path, 'cpu');
  assert.match(d.pathLabel, /^CPU \(wasm-simd\) — GPU route [\d.]+× this device's CPU here \(whole steps\)$/);
  assert.equal(heard.at(-1).pathLabel, d.pathLabel, 'the whole steps\' verdict was not reported through onChange');
  const before = e.stats.gpuCalls;
  const a = await new Group(cfg, 2, stream, picked.backend).step(), b = await new Group(cfg, 2, stream, picked.cpu).step();
  assert.equal(e.stats.gpuCalls, before, 'a shape went to the GPU after whole steps chose the CPU');
  assert.deepEqual(a.hashes, b.hashes);
  e.destroy();
});

test('on a software adapter the page default measures nothing and says the adapter is software', async () => {
  const picked = await pickBackend({ gpu: nodeGpu(), mode: 'auto', threads: 1, settings: makeConfig(TINY), engineOpts: { log: { log: () => {} } } });
  assert.deepEqual(Object.keys(picked.engine.shapeTimes), []);
  assert.equal(picked.describe().pathLabel, 'CPU (wasm-simd) — WebGPU adapter is software');
  picked.engine.destroy();
});
