// Time dev/unit_quant's variant (ROWS rows per workgroup) against the mainline quantizer
// (kernels/unit_quant.wgsl, one workgroup per row) on the quantizer calls of the largest settings'
// step (width 128, seq 128, batch 32, 8 heads: attention rows of K = 16 and 128, weight rows of
// K = 128..4096). Validate first (python3 dev/unit_quant/validate.py); then, on a real GPU:
//   source .gpu/setup.sh && $NODE dev/unit_quant/bench.mjs          (not run yet: no GPU lent)
// Prints per shape the median ms of 20 dispatches (each its own submit, onSubmittedWorkDone) and
// the ratio to the mainline kernel in the same run.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);
const { openDevice, compileKernel } = await import('../../frontend_js/gpu/device.js');

const text = (p) => readFileSync(new URL(p, import.meta.url), 'utf8');
const lib = text('../../kernels/f64_lib.wgsl');
const { device } = await openDevice(create([]));
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; };
// [batch, rows, K]: q/k rows (256 heads x 128 rows of D = 16), p rows (K = T = 128), activations
// (4096 rows of C = 128), weight-gradient rows (128..512 rows of K = 4096)
const SHAPES = [[256, 128, 16], [256, 128, 128], [1, 4096, 128], [1, 512, 4096], [1, 128, 4096]];
const kernels = { mainline: [await compileKernel(device, `${lib}\n${text('../../kernels/unit_quant.wgsl')}`, { WG: 64 }, 'mainline'), 1] };
for (const ROWS of [2, 4, 8, 16]) kernels[`rows${ROWS}`] = [await compileKernel(device, `${lib}\n${text('./unit_quant_rows.wgsl')}`, { WG: 64, ROWS }, `rows${ROWS}`), ROWS];
const S = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
for (const [nb, R, K] of SHAPES) {
  const K4 = Math.ceil(K / 4), x = Float64Array.from({ length: nb * R * K }, (_, i) => Math.sin(i) * 3);
  const mk = (bytes, usage = S) => device.createBuffer({ size: Math.max(16, Math.ceil(bytes / 16) * 16), usage });
  const bx = mk(x.byteLength), bq = mk(nb * R * K4 * 4), bs = mk(nb * R * 8), bf = mk(16), bp = mk(32, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
  device.queue.writeBuffer(bx, 0, x);
  device.queue.writeBuffer(bp, 0, new Uint32Array([R, K, K4, K, 1, R * K, 0, 0]));
  const row = { shape: [nb, R, K] };
  for (const [name, [pipe, ROWS]] of Object.entries(kernels)) {
    const bg = device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries: [bx, bq, bs, bf, bp].map((buffer, binding) => ({ binding, resource: { buffer } })) });
    const ms = [];
    for (let i = 0; i < 21; i++) {
      const enc = device.createCommandEncoder(), pass = enc.beginComputePass();
      pass.setPipeline(pipe); pass.setBindGroup(0, bg); pass.dispatchWorkgroups(Math.ceil(R / ROWS), nb); pass.end();
      const t0 = performance.now();
      device.queue.submit([enc.finish()]);
      await device.queue.onSubmittedWorkDone();
      if (i) ms.push(performance.now() - t0);
    }
    row[name] = +median(ms).toFixed(3);
  }
  for (const name of Object.keys(kernels)) if (name !== 'mainline') row[`${name}/mainline`] = +(row[name] / row.mainline).toFixed(3);
  console.log(JSON.stringify(row));
  for (const b of [bx, bq, bs, bf, bp]) b.destroy();
}
device.destroy();
