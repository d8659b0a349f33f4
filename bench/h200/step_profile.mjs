// The GPU path's training step under `node --cpu-prof` (run by hand or on the H200):
//   $NODE --cpu-prof --cpu-prof-dir=DIR bench/h200/step_profile.mjs [steps] [config JSON]
//   $NODE bench/h200/profile_summary.mjs DIR > summary.txt
// Default config (or the given one), train20.dsyf's stream, the default GPU engine; 10 warm-up
// steps (2 for another config), then `steps`.
import { createRequire } from 'node:module';
import { loadFixture, timeSteps, runSteps, median } from './steps.mjs';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);
const { createGpuEngine } = await import('../../frontend_js/gpu/gpu.js');
const engine = await createGpuEngine({ gpu: create([]), log: { log() {} } });
if (engine.status.path !== 'gpu') throw new Error(`no GPU path: ${engine.status.reasons.join('; ')}`);
const fx = loadFixture(process.env.DAISY_FIXTURES || 'fixtures_out', 'train20.dsyf');
const steps = Number(process.argv[2] || 100);
if (process.argv[3]) {
  // another config (JSON of settings, e.g. '{"width":128,"seq_len":128,"batch":32}'): 2 warm-up
  // steps, no reference hashes for it
  const { makeConfig } = await import('../../frontend_js/config.js');
  const cfg = makeConfig({ ...fx.header.config, ...JSON.parse(process.argv[3]) });
  const r = await runSteps(cfg, fx.header.meta.peers, fx.tensors.stream.data, engine, 2 + steps);
  console.log(JSON.stringify({ kernel: engine.status.kernel, steps, config: process.argv[3], msPerGroupStep: median(r.ms.slice(2)), stats: engine.stats }));
} else {
  const r = await timeSteps(fx, engine, { steps: 10 + steps, counter: () => engine.stats.submits });
  console.log(JSON.stringify({ kernel: engine.status.kernel, steps, msPerGroupStep: median(r.ms.slice(10)),
    submitsPerGroupStep: median(r.submits.slice(10)), hashesOk: !r.firstBad, stats: engine.stats }));
}
engine.destroy();
process.exit(0);
