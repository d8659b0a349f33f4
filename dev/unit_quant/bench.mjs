// The quantizer before and after issue 26's second pass, on the quantizer rows of the largest
// settings' step (width 128, seq 128, batch 32, 8 heads): dev/unit_quant/unit_quant_before.wgsl (one
// 64-thread workgroup per row, every code through the exact division) vs kernels/unit_quant.wgsl
// (quantThreads(K) threads per row, the float32 estimate deciding codes away from half-integers).
// Both runs' codes and scales are compared word for word (any mismatch is printed and exits 1).
//   source .gpu/setup.sh && $NODE dev/unit_quant/bench.mjs     (a real GPU; on SwiftShader it runs,
//                                                               the times say nothing)
// Per shape: the median ms of 20 dispatches (each its own submit, onSubmittedWorkDone), the ratio.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);
const { openDevice, compileKernel } = await import('../../frontend_js/gpu/device.js');
const { quantThreads } = await import('../../frontend_js/gpu/f64.js');

const text = (p) => readFileSync(new URL(p, import.meta.url), 'utf8');
const lib = text('../../kernels/f64_lib.wgsl');
const { device } = await openDevice(create([]));
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; };
const SMALL = process.env.DAISY_BENCH_SMALL === '1';
// [batch, rows, K, strided]: q/k rows (256 heads x 128 rows of D = 16), p rows (K = T = 128), v's
// columns (16 of K = 128, strided), activations (4096 rows of C = 128, 512), weight-gradient rows
// (K = B*T = 4096, strided: the transposed operands of dW = dY^T X)
const SHAPES = SMALL ? [[4, 16, 16, false], [1, 8, 300, true]]
  : [[256, 128, 16, false], [256, 128, 128, false], [256, 16, 128, true], [1, 4096, 128, false], [1, 4096, 512, false], [1, 512, 4096, true], [1, 128, 4096, true]];
const before = await compileKernel(device, `${lib}\n${text('./unit_quant_before.wgsl')}`, { WG: 64 }, 'before');
const after = await compileKernel(device, `${lib}\n${text('../../kernels/unit_quant.wgsl')}`, { WG: 64 }, 'after');
const S = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
const mk = (bytes, usage = S) => device.createBuffer({ size: Math.max(16, Math.ceil(bytes / 16) * 16), usage });
async function words(buf, bytes) {
  const r = mk(bytes, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST), enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(buf, 0, r, 0, r.size); device.queue.submit([enc.finish()]);
  await r.mapAsync(GPUMapMode.READ); const w = new Uint32Array(r.getMappedRange().slice(0)); r.destroy(); return w;
}
let bad = 0;
for (const [nb, R, K, strided] of SHAPES) {
  const K4 = Math.ceil(K / 4);
  // activations-like values (zeros of a ReLU every 5th), through the row's strides
  const x = Float64Array.from({ length: nb * R * K }, (_, i) => (i % 5 === 0 ? 0 : Math.sin(i * 0.7) * 3 * (1 + (i % 7))));
  const strides = strided ? [1, R, R * K] : [K, 1, R * K];
  const bx = mk(x.byteLength), bf = mk(16);
  device.queue.writeBuffer(bx, 0, x);
  const row = { shape: [nb, R, K], strided, threadsPerRow: quantThreads(K) };
  const got = {};
  for (const [name, pipe, tpr] of [['before', before, 64], ['after', after, quantThreads(K)]]) {
    const bq = mk(nb * R * K4 * 4), bs = mk(nb * R * 8), bp = mk(32, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
    device.queue.writeBuffer(bp, 0, new Uint32Array([R, K, K4, ...strides, tpr, 0]));
    const bg = device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries: [bx, bq, bs, bf, bp].map((buffer, binding) => ({ binding, resource: { buffer } })) });
    const ms = [];
    for (let i = 0; i < (SMALL ? 3 : 21); i++) {
      const enc = device.createCommandEncoder(), pass = enc.beginComputePass();
      pass.setPipeline(pipe); pass.setBindGroup(0, bg); pass.dispatchWorkgroups(Math.ceil(R / (64 / tpr)), nb); pass.end();
      const t0 = performance.now();
      device.queue.submit([enc.finish()]);
      await device.queue.onSubmittedWorkDone();
      if (i) ms.push(performance.now() - t0);
    }
    row[name] = +median(ms).toFixed(3);
    got[name] = [await words(bq, nb * R * K4 * 4), await words(bs, nb * R * 8)];
    for (const b of [bq, bs, bp]) b.destroy();
  }
  row['after/before'] = +(row.after / row.before).toFixed(3);
  const i = got.before[0].findIndex((w, j) => w !== got.after[0][j]), j = got.before[1].findIndex((w, k) => w !== got.after[1][k]);
  row.equal = i < 0 && j < 0;
  if (!row.equal) { bad++; row.firstMismatch = i >= 0 ? `code word ${i}: before ${got.before[0][i]}, after ${got.after[0][i]}` : `scale word ${j}`; }
  console.log(JSON.stringify(row));
  for (const b of [bx, bf]) b.destroy();
}
device.destroy();
process.exit(bad ? 1 : 0);
