// Split-K in the unit's GEMM (kernels/gemm_int8.wgsl; issue 26's second pass) on the weight
// gradients of the largest settings' step (K = B*T = 4096; M x N = the weight's shape): the kernel
// with one slice vs f64.js gemmSplits' slices, the partials summed as the
// epilogue does (here read back and summed on the host, outside the time) and compared with the
// one-slice result element for element (a mismatch exits 1). The epilogue's extra reads are not
// timed here (they are in bench/h200/resident_profile.mjs).
//   source .gpu/setup.sh && $NODE dev/gemm_splitk/bench.mjs     (a real GPU)
// Per shape: median ms of 20 submits (onSubmittedWorkDone) and the ratio to one slice.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { create, globals } = require('webgpu');
Object.assign(globalThis, globals);
const { openDevice, compileKernel } = await import('../../frontend_js/gpu/device.js');
const { gemmSource, GEMM_BODY } = await import('../../frontend_js/gpu/gemm_kernel.js');
const { gemmSplits, DEFAULT_GEMM_TUNING: T } = await import('../../frontend_js/gpu/f64.js');

const { device, info } = await openDevice(create([]));
const dot = info.wgslLanguageFeatures.includes('packed_4x8_integer_dot_product') ? 'dot4_packed.wgsl' : 'dot4_portable.wgsl';
const pipe = await compileKernel(device, await gemmSource(dot, undefined, GEMM_BODY), T, GEMM_BODY);
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; };
const SMALL = process.env.DAISY_BENCH_SMALL === '1';
const SHAPES = SMALL ? [[40, 1030, 33]] : [[128, 4096, 128], [384, 4096, 128], [512, 4096, 128], [128, 4096, 512], [257, 4096, 128]];
const ST = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
const mk = (bytes, usage = ST) => device.createBuffer({ size: Math.max(16, Math.ceil(bytes / 16) * 16), usage });
async function read(buf, n) {
  const r = mk(n * 4, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST), enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(buf, 0, r, 0, r.size); device.queue.submit([enc.finish()]);
  await r.mapAsync(GPUMapMode.READ); const w = new Int32Array(r.getMappedRange().slice(0)); r.destroy(); return w;
}
let bad = 0;
for (const [M, K, N] of SHAPES) {
  const K4 = Math.ceil(K / 4), total = M * N;
  const gx = Math.ceil(N / (T.WG_X * T.RN)), gy = Math.ceil(M / (T.WG_Y * T.RM)), splits = gemmSplits(gx * gy, K4);
  const A = mk(M * K4 * 4), B = mk(N * K4 * 4);
  device.queue.writeBuffer(A, 0, Uint32Array.from({ length: M * K4 }, (_, i) => Math.imul(i + 1, 0x9e3779b1) >>> 0));
  device.queue.writeBuffer(B, 0, Uint32Array.from({ length: N * K4 }, (_, i) => Math.imul(i + 7, 0x85ebca6b) >>> 0));
  const row = { shape: [M, K, N], splits };
  const sums = {};
  for (const s of [1, splits]) {
    const C = mk(s * total * 4), p = mk(32, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
    device.queue.writeBuffer(p, 0, new Uint32Array([M, N, K4, 1, s, 0, 0, 0]));
    const bg = device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries: [A, B, C, p].map((buffer, binding) => ({ binding, resource: { buffer } })) });
    const ms = [];
    for (let i = 0; i < (SMALL ? 3 : 21); i++) {
      const enc = device.createCommandEncoder(), pass = enc.beginComputePass();
      pass.setPipeline(pipe); pass.setBindGroup(0, bg); pass.dispatchWorkgroups(gx, gy, s); pass.end();
      const t0 = performance.now();
      device.queue.submit([enc.finish()]);
      await device.queue.onSubmittedWorkDone();
      if (i) ms.push(performance.now() - t0);
    }
    row[`slices${s}`] = +median(ms).toFixed(3);
    const parts = await read(C, s * total), sum = new Int32Array(total);
    for (let k = 0; k < s; k++) for (let i = 0; i < total; i++) sum[i] += parts[k * total + i];
    sums[s] = sum;
    C.destroy(); p.destroy();
  }
  row.ratio = +(row[`slices${splits}`] / row.slices1).toFixed(3);
  const i = sums[1].findIndex((v, j) => v !== sums[splits][j]);
  row.equal = i < 0;
  if (i >= 0) { bad++; row.firstMismatch = `element ${i}: one slice ${sums[1][i]}, ${splits} slices ${sums[splits][i]}`; }
  console.log(JSON.stringify(row));
  A.destroy(); B.destroy();
}
device.destroy();
process.exit(bad ? 1 : 0);
