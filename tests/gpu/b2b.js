// B2B chain: several int8 layers run back to back on the GPU with no CPU round trip between them,
// bit-identical to the CPU mirror in this file (b2bChainCpu).
//
// Spec (integers only, so exact on every device):
//   input  q0: int8 (rows, K0), values in [-127, 127]
//   layer i (weights w_i: int8 (K_i, N_i), K_i = N_{i-1}; shift s_i in 1..30; relu_i):
//     acc_i = q_{i-1} @ w_i                                  int32 (rows, N_i), exact (int8 GEMM)
//     q_i   = clamp((acc_i + (1 << (s_i - 1))) >> s_i, -127, 127)     >> is arithmetic (floor),
//             so this is x / 2^s rounded half up; the add wraps like WGSL i32 (never at these
//             sizes: |acc| <= K*127^2, so |acc| + 2^29 < 2^31 for K <= 100,000)
//     q_i   = max(q_i, 0) when relu_i
//   output: acc of the last layer and q of the last layer.
// A transformer MLP block is two layers: (C -> 4C, relu) then (4C -> C, no relu).
// On the GPU: kernels/gemm_*.wgsl (the kernel the engine's gates chose) and
// kernels/requant_relu_pack.wgsl, which writes q_i packed four to a u32, already zero-padded,
// i.e. directly the A operand of the next GEMM. One command buffer; one readback at the end.
import { cpuEngine, unpackI8x4 } from '../../frontend_js/units.js';
import { KERNEL_BASE, loadText, compileKernel, packColsI8, packRowsI8, storageBuffer, uniformBuffer,
  submitChecked, readBack } from '../../frontend_js/gpu/gpu.js';
import { gateOperands, firstMismatch } from '../../frontend_js/gpu/gpu_gates.js';

export const MAX_SHIFT = 30;

function checkLayers(layers, K0) {
  let K = K0;
  layers.forEach((l, i) => {
    if (l.K !== K) throw new Error(`b2b layer ${i}: K=${l.K} but the previous layer gives ${K} columns`);
    if (!(l.w instanceof Int8Array) || l.w.length !== l.K * l.N) throw new Error(`b2b layer ${i}: w must be an Int8Array of K*N = ${l.K * l.N}`);
    if (!Number.isInteger(l.shift) || l.shift < 1 || l.shift > MAX_SHIFT) throw new Error(`b2b layer ${i}: shift must be an integer in 1..${MAX_SHIFT}, got ${l.shift}`);
    K = l.N;
  });
}

// int32 (n,) -> int8 (n,): the requantization above
export function requantize(acc, shift, relu) {
  const q = new Int8Array(acc.length), half = 1 << (shift - 1);
  for (let i = 0; i < acc.length; i++) {
    let y = ((acc[i] + half) | 0) >> shift;       // | 0: wrap to int32 like WGSL's i32 add
    y = y > 127 ? 127 : y < -127 ? -127 : y;
    q[i] = relu && y < 0 ? 0 : y;
  }
  return q;
}

// The CPU mirror. x: int8 (rows, K0); layers: [{ w: Int8Array (K, N), K, N, shift, relu }]
// -> { acc: Int32Array (rows, N_last), q: Int8Array (rows, N_last) }
export function b2bChainCpu(x, rows, layers) {
  checkLayers(layers, layers[0].K);
  let q = x, acc = null;
  for (const l of layers) {
    acc = cpuEngine.gemm(q, l.w, 1, rows, l.K, l.N);
    q = requantize(acc, l.shift, l.relu);
  }
  return { acc, q };
}

// GPU chain on the engine's device and gated kernel; weights packed and uploaded once.
// -> { run(x, rows) -> Promise<{ acc, q }>, destroy() }. Throws when the engine is on the CPU.
export async function createB2bChain(engine, layers, { kernelBase = KERNEL_BASE } = {}) {
  if (!engine.kernel) throw new Error(`b2b chain needs a gated GPU kernel; engine is on the CPU (${engine.status.reasons.join('; ')})`);
  checkLayers(layers, layers[0].K);
  const device = engine.device, gemm = engine.kernel;
  const code = await loadText(new URL('requant_relu_pack.wgsl', kernelBase));
  const WG = 64;
  const pipes = {};
  for (const relu of [true, false]) pipes[relu] = await compileKernel(device, code, { WG, RELU: relu ? 1 : 0 }, `requant_relu_pack relu=${relu}`);
  const weights = layers.map((l) => { const w = packColsI8(l.w, 1, l.K, l.N); return storageBuffer(device, w.byteLength, w); });

  async function run(x, rows) {
    if (!(x instanceof Int8Array) || x.length !== rows * layers[0].K) throw new Error(`b2b input must be an Int8Array of rows*K0 = ${rows * layers[0].K}`);
    const temp = [];
    const a0 = packRowsI8(x, rows, layers[0].K);
    let aBuf = storageBuffer(device, a0.byteLength, a0);
    temp.push(aBuf);
    const steps = [];
    layers.forEach((l, i) => {
      const K4 = Math.ceil(l.K / 4), N4 = Math.ceil(l.N / 4);
      const accBuf = storageBuffer(device, rows * l.N * 4), qBuf = storageBuffer(device, rows * N4 * 4);
      const gemmPrep = gemm.prepare(aBuf, weights[i], accBuf, 1, rows, K4, l.N);
      const params = uniformBuffer(device, [rows, l.N, N4, l.shift]);
      const pipe = pipes[!!l.relu];
      const bind = device.createBindGroup({ layout: pipe.getBindGroupLayout(0),
        entries: [accBuf, qBuf, params].map((buffer, binding) => ({ binding, resource: { buffer } })) });
      steps.push({ gemmPrep, pipe, bind, groups: [Math.ceil(N4 / WG), rows, 1], accBuf, qBuf, N4, N: l.N });
      temp.push(accBuf, qBuf, params, gemmPrep.params);
      aBuf = qBuf;                                   // the next GEMM reads the packed q directly
    });
    try {
      await submitChecked(device, (enc) => {
        const pass = enc.beginComputePass();
        for (const s of steps) {
          gemm.encode(pass, s.gemmPrep);
          pass.setPipeline(s.pipe); pass.setBindGroup(0, s.bind); pass.dispatchWorkgroups(...s.groups);
        }
        pass.end();
      });
      const last = steps[steps.length - 1];
      const acc = new Int32Array(await readBack(device, last.accBuf, rows * last.N * 4));
      const words = new Uint32Array(await readBack(device, last.qBuf, rows * last.N4 * 4));
      const padded = unpackI8x4(words), q = new Int8Array(rows * last.N);   // drop the pad lanes
      for (let r = 0; r < rows; r++) q.set(padded.subarray(r * 4 * last.N4, r * 4 * last.N4 + last.N), r * last.N);
      return { acc, q };
    } finally {
      for (const b of temp) b.destroy();
    }
  }
  return { run, destroy() { for (const b of weights) b.destroy(); } };
}

// One check of the chain on `engine` against b2bChainCpu: `rows` input rows of width dims[0][0],
// layers dims = [[K, N, shift, relu], ...], seeded int8 operands in [-127, 127] (gateOperands'
// 'random' stream, -128 -> -127) -> { kernel, accMismatch, qMismatch, cpu, gpu }; a mismatch is
// firstMismatch's first differing index with both values, null when bit-identical.
export async function checkB2bChain(engine, rows, dims) {
  const rand = (n, seed) => gateOperands('random', 1, 1, n, 1, seed).qa.map((v) => (v === -128 ? -127 : v));
  const layers = dims.map(([K, N, shift, relu], i) => ({ K, N, shift, relu, w: rand(K * N, 10 + i) }));
  const x = rand(rows * dims[0][0], 99);
  const cpu = b2bChainCpu(x, rows, layers);
  const chain = await createB2bChain(engine, layers);
  let gpu;
  try { gpu = await chain.run(x, rows); } finally { chain.destroy(); }
  return { kernel: engine.status.kernel, accMismatch: firstMismatch(gpu.acc, cpu.acc), qMismatch: firstMismatch(gpu.q, cpu.q), cpu, gpu };
}
