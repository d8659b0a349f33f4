// The registry on a real WebGPU adapter (SwiftShader, under Node): pickBackend times the GPU and
// the CPU path on the run's settings (measured even on a software adapter here: the rule is
// given), reports the pick through onChange, trains with the bits of the CPU backend, and a GPU
// fault moves it to the CPU with one more onChange (the page announces it: peer.js detectPath).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { nodeGpu } from './node_gpu.mjs';
import { pickBackend } from '../../frontend_js/backends.js';
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
  assert.match(d.pathLabel, m.gpuShapes > 0 ? /^GPU: [\d.]+× this device's CPU at these settings$/ : /^CPU \(wasm-simd\) — GPU [\d.]+× this device's CPU here$/);
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

test('on a software adapter the page default measures nothing and says the adapter is software', async () => {
  const picked = await pickBackend({ gpu: nodeGpu(), mode: 'auto', threads: 1, settings: makeConfig(TINY), engineOpts: { log: { log: () => {} } } });
  assert.deepEqual(Object.keys(picked.engine.shapeTimes), []);
  assert.equal(picked.describe().pathLabel, 'CPU (wasm-simd) — WebGPU adapter is software');
  picked.engine.destroy();
});
