// Time the split-K GEMM (dev/gemm_splitk: SPLITS slices + the reduce) against the mainline packed
// kernel on the weight-gradient GEMMs of the largest settings' step (K = B*T = 4096; M x N = the
// weight's shape: 128 x 128, 384 x 128, 512 x 128, 128 x 512, 257 x 128). Validate first
// (python3 dev/gemm_splitk/validate.py); then, on a real GPU:
//   source .gpu/setup.sh && $NODE dev/gemm_splitk/bench.mjs          (not run yet: no GPU lent)
// Per shape: median ms of 20 submits (onSubmittedWorkDone) and the ratio to the mainline kernel.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);
const { openDevice, compileKernel } = await import('../../frontend_js/gpu/device.js');

const text = (p) => readFileSync(new URL(p, import.meta.url), 'utf8');
const { device } = await openDevice(create([]));
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; };
const T = { WG_X: 8, WG_Y: 8, RM: 4, RN: 4, TK: 4 };
const SHAPES = [[128, 4096, 128], [384, 4096, 128], [512, 4096, 128], [128, 4096, 512], [257, 4096, 128]];
const mainline = await compileKernel(device, text('../../kernels/dot4_packed.wgsl') + '\n' + text('../../kernels/gemm_int8.wgsl'), T, 'mainline');   // as gemm_kernel.js gemmSource
const reduce = await compileKernel(device, text('./splitk_reduce.wgsl'), { WG: 64 }, 'reduce');
const splits = {};
for (const S of [2, 4, 8, 16]) splits[S] = await compileKernel(device, text('./gemm_packed_splitk.wgsl'), { ...T, SPLITS: S }, `splitk${S}`);
const ST = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
const mk = (bytes, usage = ST) => device.createBuffer({ size: Math.max(16, Math.ceil(bytes / 16) * 16), usage });
const bg = (pipe, bufs) => device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries: bufs.map((buffer, binding) => ({ binding, resource: { buffer } })) });
async function time(encode) {
  const ms = [];
  for (let i = 0; i < 21; i++) {
    const enc = device.createCommandEncoder(), pass = enc.beginComputePass();
    encode(pass); pass.end();
    const t0 = performance.now();
    device.queue.submit([enc.finish()]);
    await device.queue.onSubmittedWorkDone();
    if (i) ms.push(performance.now() - t0);
  }
  return +median(ms).toFixed(3);
}
for (const [M, K, N] of SHAPES) {
  const K4 = Math.ceil(K / 4), total = M * N;
  const A = mk(M * K4 * 4), B = mk(N * K4 * 4), C = mk(total * 4), parts = mk(16 * total * 4);
  const p = mk(16, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
  device.queue.writeBuffer(A, 0, new Uint32Array(M * K4).fill(0x01ff7f81)); device.queue.writeBuffer(B, 0, new Uint32Array(N * K4).fill(0x7f0281ff));
  device.queue.writeBuffer(p, 0, new Uint32Array([M, N, K4, 1]));
  const gx = Math.ceil(N / (T.WG_X * T.RN)), gy = Math.ceil(M / (T.WG_Y * T.RM));
  const row = { shape: [M, K, N], mainline: await time((pass) => { pass.setPipeline(mainline); pass.setBindGroup(0, bg(mainline, [A, B, C, p])); pass.dispatchWorkgroups(gx, gy, 1); }) };
  for (const [S, pipe] of Object.entries(splits)) {
    const pr = mk(16, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
    device.queue.writeBuffer(pr, 0, new Uint32Array([total, Number(S), 0, 0]));
    row[`split${S}`] = await time((pass) => {
      pass.setPipeline(pipe); pass.setBindGroup(0, bg(pipe, [A, B, parts, p])); pass.dispatchWorkgroups(gx, gy, Number(S));
      pass.setPipeline(reduce); pass.setBindGroup(0, bg(reduce, [parts, C, pr])); pass.dispatchWorkgroups(Math.ceil(total / 64));
    });
    row[`split${S}/mainline`] = +(row[`split${S}`] / row.mainline).toFixed(3);
  }
  console.log(JSON.stringify(row));
}
device.destroy();
