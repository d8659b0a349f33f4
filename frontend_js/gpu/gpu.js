// The WebGPU integer engine: exact int8 GEMMs on the GPU behind the engine contracts of
// frontend_js/units.js: gemm(qa, qb, batch, M, K, N) -> Int32Array (batch, M, N), and the fused
// unit qmatmulT(a, transA, b, transB, batch, M, K, N, out) -> Float64Array (batch, M, N), which
// units.qmatmulT hands over whole. The GPU does integer work only; quantization and the float64
// epilogue stay on the CPU, in our own instance of the wasm engine's module (wasm_gemm.js
// GEMM_WASM: qrows, qcols, epi — the operations of units.js, gated there), so every result has
// the bits of the CPU engines — and the engine proves it:
//   boot:     device, then each kernel in preference order (packed dot4I8Packed, then portable
//             i32) is compiled and gated (frontend_js/gpu/gpu_gates.js); the first that passes is used.
//   each call: the result is bound-checked and Freivalds-checked; every `auditEvery` calls a
//             random tile is recomputed exactly on the CPU. Calls are numbered in issue order
//             (the audits' randomness is keyed by that number), so audits are deterministic.
//   batching: calls issued in the same tick (e.g. the dW and dX pair of model.js backward's
//             both(), which waits for both with Promise.allSettled) run as ONE submit (one
//             dispatch each, one copy into one mappable buffer) and ONE mapAsync; each is
//             audited and finished on its own, in issue order.
//   faults:   a failed gate, shader compile error, validation/OOM error, uncaptured error, lost
//             device or failed audit switches the engine to the CPU for good, with the reason in
//             engine.status.reasons, console.error, onFault callbacks and a 'fault' event.
//             Errors mean nothing wrong was returned: the calls of that submit are computed on the
//             CPU and the step goes on. A failed audit means the GPU returned wrong numbers: that
//             call rejects with GpuFault (recompute: true) and the caller redoes the whole step
//             (withGpuFallback does that); calls of the batch after it are computed on the CPU.
//   CPU:      opts.cpu, the caller's CPU engine (the page: its backend's); by default
//             engines.js bestGemmEngine() (wasm-simd when it passed its gate, else scalar).
//   routing:  with route 'auto' (the page's choice) a fused-unit call goes to the GPU only when
//             gpuPays (deep K, many multiply-adds); the rest run on the CPU engine, same bits.
// Data layout: the kernels read A (batch, M, K4) and B^T (batch, N, K4) as u32 words of four int8
// lanes (packI8x4), K zero-padded to K4 words; C is (batch, M, N) int32. The int8 API packs its
// operands so (B transposed on the CPU); the fused unit packs the wasm quantizers' padded int16
// codes (A (batch, Mp, Kp), B^T (batch, Np, Kp); Kp a multiple of 8, Mp even, Np a multiple of
// 4), runs the kernel on the padded shape (the pad codes are 0, so the pad rows of C are 0) and
// hands the padded C to the wasm epilogue, which reads its (Mp, Np) layout directly.
// Runs in a browser (navigator.gpu, kernels fetched relative to this file) and under Node's
// `webgpu` package (pass { gpu }, kernels read from disk through file: URLs).
import { packI8x4, MAX_K, cpuEngine, qmatmulT as unitQmatmulT } from '../units.js';
import { bestGemmEngine } from '../engines.js';
import { GEMM_WASM } from '../wasm_gemm.js';
import { gateKernel, gateOperands, checksumAuditView, tileAuditView, freivaldsVector, auditKey, view, denseView } from './gpu_gates.js';

export const KERNEL_BASE = new URL('../../kernels/', import.meta.url);
export const PACKED_FEATURE = 'packed_4x8_integer_dot_product';

// In preference order. `needs`: a WGSL language feature the kernel requires.
export const GEMM_KERNELS = [
  { id: 'packed', file: 'gemm_packed.wgsl', needs: PACKED_FEATURE },
  { id: 'portable', file: 'gemm_portable.wgsl' },
];
// Tile 32x32: small enough for SwiftShader; the H200 bench sets WG 16x16, RM = RN = 8.
export const DEFAULT_TUNING = { WG_X: 8, WG_Y: 8, RM: 4, RN: 4, TK: 4 };

export class GpuFault extends Error {
  constructor(message, { kind = 'audit', recompute = true } = {}) {
    super(message);
    this.name = 'GpuFault';
    this.kind = kind;
    this.recompute = recompute;   // true: a wrong result came back; redo the step on the CPU
  }
}

// Text of a URL: fetch over http(s), the file system for file: URLs (Node).
export async function loadText(url) {
  const u = new URL(url);
  if (u.protocol === 'file:') {
    const { readFile } = await import('node:fs/promises');
    return readFile(u, 'utf8');
  }
  const res = await fetch(u);
  if (!res.ok) throw new Error(`fetch ${u.href}: HTTP ${res.status}`);
  return res.text();
}

// --- packing (host side) ------------------------------------------------------------------------

// (rows, K) int8 -> (rows, K4) u32 words: each row zero-padded to 4*K4 lanes, then packI8x4.
export function packRowsI8(q, rows, K) {
  const K4 = Math.ceil(K / 4);
  if (K === 4 * K4) return packI8x4(q.subarray(0, rows * K));
  const padded = new Int8Array(rows * 4 * K4);
  for (let r = 0; r < rows; r++) padded.set(q.subarray(r * K, r * K + K), r * 4 * K4);
  return packI8x4(padded);
}

// (batch, K, N) int8 -> (batch, N, K4) u32 words: transposed so K is innermost, then packed.
export function packColsI8(q, batch, K, N) {
  const K4 = Math.ceil(K / 4), t = new Int8Array(batch * N * 4 * K4);
  for (let b = 0; b < batch; b++) {
    const src = b * K * N, dst = b * N * 4 * K4;
    for (let k = 0; k < K; k++) for (let j = 0; j < N; j++) t[dst + j * 4 * K4 + k] = q[src + k * N + j];
  }
  return packI8x4(t);
}

// --- device ---------------------------------------------------------------------------------

// -> { adapter, device, info }; throws Error with a human reason when there is no usable GPU.
export async function openDevice(gpu, { features = [] } = {}) {
  if (!gpu) throw new Error('WebGPU is missing (navigator.gpu is undefined)');
  const adapter = await gpu.requestAdapter();
  if (!adapter) throw new Error('WebGPU has no adapter (requestAdapter returned null)');
  const lim = adapter.limits;
  const requiredLimits = {
    maxStorageBufferBindingSize: lim.maxStorageBufferBindingSize,
    maxBufferSize: lim.maxBufferSize,
    maxComputeWorkgroupStorageSize: lim.maxComputeWorkgroupStorageSize,
    maxComputeInvocationsPerWorkgroup: lim.maxComputeInvocationsPerWorkgroup,
    maxComputeWorkgroupSizeX: lim.maxComputeWorkgroupSizeX,
    maxComputeWorkgroupSizeY: lim.maxComputeWorkgroupSizeY,
  };
  const requiredFeatures = features.filter((f) => adapter.features.has(f));
  const device = await adapter.requestDevice({ requiredLimits, requiredFeatures });
  const ai = adapter.info || {};
  const info = {
    vendor: ai.vendor, architecture: ai.architecture, device: ai.device, description: ai.description,
    isFallbackAdapter: ai.isFallbackAdapter ?? adapter.isFallbackAdapter ?? null,
    subgroupMinSize: ai.subgroupMinSize, subgroupMaxSize: ai.subgroupMaxSize,
    wgslLanguageFeatures: [...(gpu.wgslLanguageFeatures || [])].sort(),
    features: [...adapter.features].sort(),
    maxStorageBufferBindingSize: device.limits.maxStorageBufferBindingSize,
  };
  return { adapter, device, info };
}

// Compiles a .wgsl file into a compute pipeline; throws with the compiler's messages.
export async function compileKernel(device, code, constants, label) {
  device.pushErrorScope('validation');
  const module = device.createShaderModule({ code, label });
  const msgs = (await module.getCompilationInfo()).messages.filter((m) => m.type === 'error');
  if (msgs.length) {
    await device.popErrorScope();
    throw new Error(`shader ${label} does not compile: ${msgs.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`).join('; ')}`);
  }
  let pipeline;
  try {
    pipeline = await device.createComputePipelineAsync({ layout: 'auto', label, compute: { module, entryPoint: 'main', constants } });
  } finally {
    const err = await device.popErrorScope();
    if (err && !pipeline) throw new Error(`pipeline ${label}: ${err.message}`);
  }
  return pipeline;
}

// Runs fn(encoder) on the queue inside validation/OOM/internal error scopes; throws on any error.
export async function submitChecked(device, fn) {
  const scopes = ['validation', 'out-of-memory', 'internal'];
  for (const s of scopes) device.pushErrorScope(s);
  const enc = device.createCommandEncoder();
  fn(enc);
  device.queue.submit([enc.finish()]);
  const errs = [];
  for (let i = 0; i < scopes.length; i++) { const e = await device.popErrorScope(); if (e) errs.push(e.message); }
  if (errs.length) throw new Error(`GPU error: ${errs.join('; ')}`);
}

export function storageBuffer(device, bytes, data) {
  const buf = device.createBuffer({ size: Math.max(16, Math.ceil(bytes / 4) * 4), usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
  if (data) device.queue.writeBuffer(buf, 0, data);
  return buf;
}

export function uniformBuffer(device, words) {
  const data = new Uint32Array(Math.max(4, Math.ceil(words.length / 4) * 4));
  data.set(words);
  const buf = device.createBuffer({ size: data.byteLength, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  device.queue.writeBuffer(buf, 0, data);
  return buf;
}

// Copies `bytes` of src back to the CPU -> ArrayBuffer (after the queued work).
export async function readBack(device, src, bytes) {
  const size = Math.ceil(bytes / 4) * 4;
  const read = device.createBuffer({ size: Math.max(16, size), usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  try {
    await submitChecked(device, (enc) => enc.copyBufferToBuffer(src, 0, read, 0, size));
    await read.mapAsync(GPUMapMode.READ);
    return read.getMappedRange(0, size).slice(0);
  } finally {
    read.destroy();
  }
}

const SCOPES = ['validation', 'out-of-memory', 'internal'];
const ALIGN = 256;                                        // storage/uniform binding offset alignment
const align = (bytes) => Math.ceil(bytes / ALIGN) * ALIGN;
const S_USAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

// One compiled GEMM kernel. C = A @ B on words packed as above.
export class GemmKernel {
  constructor(device, spec, pipeline, tuning) {
    this.device = device; this.spec = spec; this.pipeline = pipeline; this.tuning = tuning;
    this.id = spec.id;
    // the bug corpus's stateful kernel keeps a dispatch counter in binding 4
    this.state = spec.stateful ? storageBuffer(device, 16, new Uint32Array(4)) : null;
    this.slots = [];          // free buffer sets for run(), reused across submits
  }

  static async create(device, spec, { kernelBase = KERNEL_BASE, tuning = {} } = {}) {
    const t = { ...DEFAULT_TUNING, ...tuning };
    const code = await loadText(new URL(spec.file, kernelBase));
    const pipeline = await compileKernel(device, code, { ...t, ...(spec.constants || {}) }, spec.file);
    return new GemmKernel(device, spec, pipeline, t);
  }

  tile() { return { M: this.tuning.WG_Y * this.tuning.RM, N: this.tuning.WG_X * this.tuning.RN }; }
  groups(batch, M, N) { const t = this.tile(); return [Math.ceil(N / t.N), Math.ceil(M / t.M), batch]; }

  bindGroup(entries) {
    if (this.state) entries.push({ binding: 4, resource: { buffer: this.state } });
    return this.device.createBindGroup({ layout: this.pipeline.getBindGroupLayout(0), entries });
  }

  // bind group + workgroup counts for buffers already on the GPU (params: a 16-byte uniform)
  prepare(aBuf, bBuf, cBuf, batch, M, K4, N, params = null) {
    if (params) this.device.queue.writeBuffer(params, 0, new Uint32Array([M, N, K4, batch]));
    else params = uniformBuffer(this.device, [M, N, K4, batch]);
    const bindGroup = this.bindGroup([aBuf, bBuf, cBuf, params].map((buffer, binding) => ({ binding, resource: { buffer } })));
    return { bindGroup, params, groups: this.groups(batch, M, N) };
  }

  encode(pass, prep) {
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, prep.bindGroup);
    pass.dispatchWorkgroups(...prep.groups);
  }

  // A set of buffers for run(): inputs (A and B words of every job), C of every job, its mappable
  // copy, the params uniforms; grown (powers of two) when a submit needs more, else reused
  // together with the bind groups made for it (a training step repeats the same few layouts).
  takeSlot(inBytes, outBytes, jobs) {
    const slot = this.slots.pop() || { input: null, output: null, read: null, params: null, binds: new Map() };
    const d = this.device, grow = (buf, bytes, usage) => {
      if (buf && buf.size >= bytes) return buf;
      if (buf) buf.destroy();
      slot.binds.clear();
      return d.createBuffer({ size: 2 ** Math.ceil(Math.log2(Math.max(bytes, ALIGN))), usage });
    };
    slot.input = grow(slot.input, inBytes, S_USAGE());
    slot.output = grow(slot.output, outBytes, S_USAGE());
    slot.read = grow(slot.read, outBytes, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST);
    slot.params = grow(slot.params, jobs * ALIGN, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
    if (!slot.paramWords || slot.paramWords.byteLength < slot.params.size) slot.paramWords = new Uint32Array(slot.params.size / 4);
    if (slot.binds.size > 1024) slot.binds.clear();
    return slot;
  }

  destroySlot(slot) { for (const b of [slot.input, slot.output, slot.read, slot.params]) if (b) b.destroy(); }

  // Runs jobs [{ batch, M, N, K4, aWords, bWords, write(queue, buffer, aByte, bByte) }] as ONE
  // submit (a dispatch each, then one copy of every C into one mappable buffer) and ONE mapAsync.
  // write uploads the job's A words at byte aByte of buffer, its B^T words at bByte; consume(i, c)
  // gets job i's C (Int32Array (batch, M, N), a view valid only during the call).
  // Throws (nothing consumed) on any GPU error.
  async run(jobs, consume) {
    const d = this.device;
    let inBytes = 0, outBytes = 0;
    const lay = jobs.map((j) => {
      const a = inBytes; inBytes += align(j.aWords * 4);
      const b = inBytes; inBytes += align(j.bWords * 4);
      const cBytes = j.batch * j.M * j.N * 4, c = outBytes; outBytes += align(cBytes);
      return { a, b, c, cBytes };
    });
    const slot = this.takeSlot(inBytes, outBytes, jobs.length);
    let ok = false;
    try {
      for (const s of SCOPES) d.pushErrorScope(s);
      const enc = d.createCommandEncoder(), pass = enc.beginComputePass();
      pass.setPipeline(this.pipeline);
      jobs.forEach((j, i) => {
        const l = lay[i];
        j.write(d.queue, slot.input, l.a, l.b);
        slot.paramWords.set([j.M, j.N, j.K4, j.batch], (i * ALIGN) / 4);
        const k = `${i}:${l.a}:${j.aWords}:${l.b}:${j.bWords}:${l.c}:${l.cBytes}`;
        let bg = slot.binds.get(k);
        if (!bg) {
          bg = this.bindGroup([[slot.input, l.a, j.aWords * 4], [slot.input, l.b, j.bWords * 4], [slot.output, l.c, l.cBytes],
            [slot.params, i * ALIGN, 16]].map(([buffer, offset, size], binding) => ({ binding, resource: { buffer, offset, size } })));
          slot.binds.set(k, bg);
        }
        pass.setBindGroup(0, bg);
        pass.dispatchWorkgroups(...this.groups(j.batch, j.M, j.N));
      });
      pass.end();
      enc.copyBufferToBuffer(slot.output, 0, slot.read, 0, outBytes);
      d.queue.writeBuffer(slot.params, 0, slot.paramWords, 0, (jobs.length * ALIGN) / 4);
      d.queue.submit([enc.finish()]);
      // error scopes and the map resolve together: one wait for the whole batch
      const pops = SCOPES.map(() => d.popErrorScope());
      const mapped = slot.read.mapAsync(GPUMapMode.READ, 0, outBytes).then(() => null, (e) => e || new Error('mapAsync failed'));
      const [errs, mapErr] = await Promise.all([Promise.all(pops), mapped]);
      const msgs = errs.filter(Boolean).map((e) => e.message);
      if (msgs.length) { if (!mapErr) slot.read.unmap(); throw new Error(`GPU error: ${msgs.join('; ')}`); }
      if (mapErr) throw mapErr;
      const all = slot.read.getMappedRange(0, outBytes);
      jobs.forEach((j, i) => consume(i, new Int32Array(all, lay[i].c, lay[i].cBytes / 4)));
      slot.read.unmap();
      ok = true;
    } finally {
      if (ok) this.slots.push(slot); else this.destroySlot(slot);
    }
  }

  // int8 (batch, M, K) @ (batch, K, N) -> Int32Array (batch, M, N); packB: the host packer for B.
  async gemm(qa, qb, batch, M, K, N, packB = packColsI8) {
    let c = null;
    await this.run([int8Job(qa, qb, batch, M, K, N, packB)], (i, view) => { c = view.slice(); });
    return c;
  }

  destroy() {
    for (const slot of this.slots) this.destroySlot(slot);
    this.slots = [];
    if (this.state) this.state.destroy();
  }
}

// A run() job for the int8 API: operands packed now (A rows, B transposed by packB).
function int8Job(qa, qb, batch, M, K, N, packB) {
  const a = packRowsI8(qa, batch * M, K), b = packB(qb, batch, K, N);
  return { batch, M, N, K4: Math.ceil(K / 4), aWords: a.length, bWords: b.length,
    write(queue, buffer, aByte, bByte) { queue.writeBuffer(buffer, aByte, a); queue.writeBuffer(buffer, bByte, b); } };
}

// The CPU ends of the fused unit for the GPU engine: our own instance of GEMM_WASM (the module
// the wasm engine gated: qrows, qcols, epi with units.js's operations) and a bump allocator over
// its memory for the calls in flight (codes, scales, C, result); it rewinds when none is left.
// Its `audit` (Freivalds + bound in exact float64 integers) and `pack8` are gated here
// (gateWasmHost) like everything else: where either disagrees with JS, the engine does without
// the host (GEMMs through the int8 API, JS quantizers and audits).
export class WasmUnitHost {
  constructor() {
    const inst = new WebAssembly.Instance(new WebAssembly.Module(GEMM_WASM), {});
    Object.assign(this, inst.exports);     // mem, qrows, qcols, epi, audit, pack8 (and gemm, unused here)
    this.top = 0; this.live = 0;
  }

  // The checksum audit of one padded GEMM result in this memory -> 0, or 1 + (b*M + i) of the
  // first failing row. r: freivaldsVector(k, call, K, N).
  auditAt(oA, oB, oC, r, nb, m, kk, n, mp, np, kp) {
    const top = this.top, oR = this.alloc(n * 8), oBr = this.alloc(kp * 8);
    new Float64Array(this.mem.buffer, oR, n).set(r);
    const row = this.audit(oA, oB, oC, oR, oBr, nb, m, n, kk, kp, mp, np);
    this.top = top;
    return row;
  }

  alloc(bytes) {
    const at = this.top;
    this.top += (bytes + 15) & ~15;
    const need = Math.ceil((this.top - this.mem.buffer.byteLength) / 65536);
    if (need > 0) this.mem.grow(need);
    return at;
  }

  done() { if (--this.live === 0) this.top = 0; }
}

// The host's pack8 against the codes it packs, and its audit against gpu_gates.js
// checksumAuditView on exact and corrupted GEMM results (ragged padded shapes, batches, K = 4096
// at +-127): it must pass every exact one and name the corrupted row of every other.
// -> null, or the first disagreement in words.
export function gateWasmHost(h) {
  const shapes = [[1, 1, 1, 1, 'random'], [1, 3, 5, 7, 'random'], [2, 5, 9, 3, 'random'], [3, 17, 31, 19, 'random'],
    [1, 64, 257, 33, 'random'], [1, 3, 4096, 5, 'posneg'], [2, 2, 4095, 3, 'bigpos']];
  const key = auditKey(0x5eed);
  try {
    // pack8 first: what the GPU sees must be the codes the audit reads
    for (const n of [8, 16, 24, 40, 4096 + 8]) {
      const codes = gateOperands('random', 1, 1, n, 1, n).qa.map((v) => Math.max(-127, v));
      h.top = 0;
      const o16 = h.alloc(2 * n), o8 = h.alloc(n);
      new Int16Array(h.mem.buffer, o16, n).set(codes);
      h.pack8(o16, o8, n);
      const got = new Int8Array(h.mem.buffer, o8, n), bad = got.findIndex((v, i) => v !== codes[i]);
      if (bad >= 0) return `wasm pack8 (n = ${n}) byte ${bad}: ${got[bad]} vs code ${codes[bad]}`;
    }
    for (const [s, [nb, m, kk, n, fill]] of shapes.entries()) {
      const kp = (kk + 7) & ~7, mp = m + (m & 1), np = (n + 3) & ~3;
      const { qa, qb } = gateOperands(fill, nb, m, kk, n, 77 + s);
      const A = new Int8Array(nb * mp * kp), BT = new Int8Array(nb * np * kp);     // padded, pads 0
      for (let b = 0; b < nb; b++) for (let k = 0; k < kk; k++) {
        for (let i = 0; i < m; i++) A[(b * mp + i) * kp + k] = Math.max(-127, qa[(b * m + i) * kk + k]);
        for (let j = 0; j < n; j++) BT[(b * np + j) * kp + k] = Math.max(-127, qb[(b * kk + k) * n + j]);
      }
      const C = cpuEngine.gemmBT(A, BT, nb, mp, kp, np);
      h.top = 0;
      const oA = h.alloc(A.length * 2), oB = h.alloc(BT.length * 2), oC = h.alloc(C.length * 4);
      new Int16Array(h.mem.buffer, oA, A.length).set(A);
      new Int16Array(h.mem.buffer, oB, BT.length).set(BT);
      const views = () => [view(new Int16Array(h.mem.buffer), oA / 2, mp * kp, kp, 1), view(new Int16Array(h.mem.buffer), oB / 2, np * kp, 1, kp),
        view(new Int32Array(h.mem.buffer), oC / 4, mp * np, np, 1)];
      // exact, then one element off by one in the last row and column of the last batch, then
      // in the first, then a value no int8 GEMM can produce (bound)
      const edits = [null, [nb - 1, m - 1, n - 1, 1], [0, 0, 0, -1], [0, 0, 0, kk * 16384 + 1 - C[0]]];
      for (const [e, edit] of edits.entries()) {
        const c = C.slice();
        if (edit) c[(edit[0] * mp + edit[1]) * np + edit[2]] += edit[3];
        new Int32Array(h.mem.buffer, oC, c.length).set(c);
        const want = edit ? 1 + edit[0] * m + edit[1] : 0, call = 3 * s + e + 1;
        const got = h.auditAt(oA, oB, oC, freivaldsVector(key, call, kk, n), nb, m, kk, n, mp, np, kp);
        const js = checksumAuditView(...views(), nb, m, kk, n, key, call);
        if (got !== want || (js === null) !== (want === 0)) {
          return `wasm audit (${nb}, ${m}, ${kk}, ${n}) edit ${JSON.stringify(edit)}: returned ${got}, expected ${want}; JS audit: ${js}`;
        }
      }
    }
    return null;
  } catch (e) {
    return `wasm audit failed to run: ${e.message}`;
  } finally {
    h.top = 0;
  }
}

// --- the engine -------------------------------------------------------------------------------

// route: 'auto' sends a fused-unit call to the GPU only where that is faster than the wasm engine.
// Measured on the H200 (TEST_RESULTS.md): per output element the GPU path pays ~2 ns on the CPU
// (readback copy, audit) and per call ~0.1 ms (submit, map), while the wasm GEMM costs 0.04-0.15
// ns per multiply-add (the small-K batched shapes are the slow ones) — so the GPU wins only with
// a deep enough K and a large call; at the default settings no call qualifies. Either way the bits
// are the same (both exact, both gated); only where the integers are computed changes.
export const ROUTE = Object.freeze({ minK: 32, minMacs: 2 ** 22 });
export const gpuPays = (nb, m, kk, n, rule = ROUTE) => kk >= rule.minK && nb * m * kk * n >= rule.minMacs;

function checkOperands(qa, qb, batch, M, K, N) {
  for (const [n, v] of [['batch', batch], ['M', M], ['K', K], ['N', N]]) {
    if (!Number.isInteger(v) || v < (n === 'K' ? 0 : 1)) throw new Error(`gemm: ${n} must be a positive integer, got ${v}`);
  }
  if (!(qa instanceof Int8Array) || !(qb instanceof Int8Array)) throw new Error('gemm: operands must be Int8Array');
  if (qa.length !== batch * M * K) throw new Error(`gemm: A has ${qa.length} values, (batch, M, K) = (${batch}, ${M}, ${K}) needs ${batch * M * K}`);
  if (qb.length !== batch * K * N) throw new Error(`gemm: B has ${qb.length} values, (batch, K, N) = (${batch}, ${K}, ${N}) needs ${batch * K * N}`);
  if (K > MAX_K) throw new Error(`gemm: K=${K} could overflow int32 (MAX_K = ${MAX_K})`);
}

export class GpuEngine extends EventTarget {
  constructor(opts) {
    super();
    this.opts = opts;
    this.name = 'cpu';
    this.status = { path: 'cpu', kernel: null, adapter: null, reasons: [], gates: [] };
    // submits: GPU round trips (one per batch of calls issued in the same tick)
    // routed: fused-unit calls route 'auto' kept on the CPU (not faults; not in cpuCalls)
    this.stats = { calls: 0, gpuCalls: 0, cpuCalls: 0, routed: 0, checksums: 0, tileAudits: 0, submits: 0 };
    this.route = opts.route === 'auto' ? { ...ROUTE, ...(opts.routeRule || {}) } : null;   // null: all
    this.kernel = null; this.device = null;
    this.cpu = opts.cpu || bestGemmEngine().engine;
    // the fused unit's CPU ends, only where the wasm engine (same module) passed its gates
    const host = this.cpu.qmatmulT ? new WasmUnitHost() : null, hostBad = host && gateWasmHost(host);
    if (hostBad) this.fault(`fused unit off (int8 API, JS quantizers and audits): ${hostBad}`, 'host', false);
    this.host = hostBad ? null : host;
    this.pending = null;                  // calls issued this tick, submitted together
    this.pendingBytes = 0;
    this.lastBatch = Promise.resolve();
    this.faultCallbacks = [];
    this.auditKey = auditKey(opts.seed ?? 0);
    this.closing = false;
  }

  log(msg) { (this.opts.log || console).log(`[gpu] ${msg}`); }

  // Records a reason; when `fatal`, drops to the CPU for good and tells everyone, loudly.
  fault(reason, kind, fatal = true) {
    this.status.reasons.push(reason);
    if (!fatal) { this.log(reason); return; }
    const wasGpu = this.status.path === 'gpu';
    this.status.path = 'cpu'; this.status.kernel = null; this.name = 'cpu'; this.kernel = null;
    console.error(`[gpu] ${wasGpu ? 'GPU path disabled, computing on CPU' : 'GPU path unavailable'}: ${reason}`);
    const detail = { reason, kind, status: this.status };
    for (const cb of this.faultCallbacks) { try { cb(detail); } catch (e) { console.error('[gpu] onFault callback threw', e); } }
    this.dispatchEvent(Object.assign(new Event('fault'), { detail }));
  }

  reportLost(info) {
    this.lostReported = true;
    this.fault(`device lost (${info.reason || 'unknown'}): ${info.message}`, 'device-lost');
  }

  onFault(cb) { this.faultCallbacks.push(cb); return () => { this.faultCallbacks = this.faultCallbacks.filter((c) => c !== cb); }; }

  async boot() {
    const o = this.opts;
    let opened;
    try {
      opened = o.device ? { device: o.device, info: o.info || null } : await openDevice(o.gpu ?? globalThis.navigator?.gpu);
    } catch (e) {
      this.fault(e.message, 'no-gpu');
      return this;
    }
    const { device, info } = opened;
    this.device = device; this.ownsDevice = !o.device; this.status.adapter = info;
    if (this.ownsDevice) {
      device.lost.then((li) => { if (!this.closing && !this.lostReported) this.reportLost(li); });
    }
    this.onGpuError = (ev) => this.fault(`uncaptured GPU error: ${ev.error.message}`, 'gpu-error');
    device.addEventListener('uncapturederror', this.onGpuError);
    const langs = new Set(info ? info.wgslLanguageFeatures : [...((o.gpu ?? globalThis.navigator?.gpu)?.wgslLanguageFeatures || [])]);
    for (const spec of o.kernels || GEMM_KERNELS) {
      if (spec.needs && !langs.has(spec.needs)) { this.fault(`${spec.id} kernel skipped: WGSL language feature ${spec.needs} missing`, 'skip', false); continue; }
      let kernel;
      try {
        kernel = await GemmKernel.create(device, spec, { kernelBase: o.kernelBase, tuning: o.tuning });
      } catch (e) { this.fault(`${spec.id} kernel disabled: ${e.message}`, 'compile', false); continue; }
      const packB = o.packB || packColsI8;
      const gate = o.gate === false ? { ok: true, cases: [] }
        : await gateKernel(spec.id, (qa, qb, b, M, K, N) => kernel.gemm(qa, qb, b, M, K, N, packB), { cases: o.gateCases });
      this.status.gates.push({ kernel: spec.id, ok: gate.ok, reason: gate.reason, cases: gate.cases });
      if (!gate.ok) { kernel.destroy(); this.fault(`${spec.id} kernel disabled: ${gate.reason}`, 'gate', false); continue; }
      this.kernel = kernel;
      this.status.path = 'gpu'; this.status.kernel = spec.id; this.name = `webgpu-${spec.id}`;
      // a software adapter (SwiftShader) is never faster than the wasm engine; an explicit
      // routeRule (tests) is used as given
      if (this.route && info?.isFallbackAdapter && !this.opts.routeRule) this.route = { ...this.route, minMacs: Infinity };
      this.status.routing = !this.route ? 'every GEMM on the GPU'
        : this.route.minMacs === Infinity ? 'every GEMM on the CPU: a software adapter is slower than the wasm engine'
          : `GEMMs with K >= ${this.route.minK} and >= ${this.route.minMacs} multiply-adds on the GPU, the rest on the CPU (faster for small ones)`;
      this.log(`using the ${spec.id} kernel (gates passed: ${gate.cases.length} cases)`);
      return this;
    }
    this.fault('no GPU kernel passed its gate', 'gate');
    return this;
  }

  // The largest bytes one batch may upload or read back (its buffers grow to the next power of 2).
  batchLimit() { return Math.min(this.device.limits.maxBufferSize, this.device.limits.maxStorageBufferBindingSize) / 4; }

  // The int8 contract: int8 (batch, M, K) @ (batch, K, N) -> Int32Array. Always exact: GPU when
  // proven, else the CPU engine.
  async gemm(qa, qb, batch, M, K, N) {
    checkOperands(qa, qb, batch, M, K, N);
    this.stats.calls++;
    const K4 = Math.ceil(K / 4), bytes = 4 * (batch * M * N + batch * (M + N) * K4);
    if (!this.kernel || K === 0 || bytes > this.batchLimit()) { this.stats.cpuCalls++; return this.cpu.gemm(qa, qb, batch, M, K, N); }
    const job = int8Job(qa, qb, batch, M, K, N, this.opts.packB || packColsI8);
    let c = null;
    Object.assign(job, {
      shape: `${batch}x${M}x${K}x${N}`, bytes,
      take: (view) => { c = view.slice(); },
      audit: (call) => this.audit(denseView(qa, M, K), denseView(qb, K, N), denseView(c, M, N), batch, M, K, N, call),
      finish: () => c,
      cpu: () => this.cpu.gemm(qa, qb, batch, M, K, N),
    });
    return this.enqueue(job);
  }

  // The fused unit, units.qmatmulT's contract: a holds A (batch, M, K) or, transA, A^T (batch, K, M);
  // b holds B (batch, K, N) or, transB, B^T (batch, N, K); -> Float64Array (batch, M, N), into
  // `out` when given. Quantized now (wasm, into the host's memory), GEMM on the GPU with the other
  // calls of this tick, epilogue (wasm) once the result passed its audits.
  qmatmulT(a, transA, b, transB, nb, m, kk, n, out = undefined) {
    if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
    const h = this.host;
    if (!h) return unitQmatmulT({ gemm: (...args) => this.gemm(...args) }, a, transA, b, transB, nb, m, kk, n, out);
    this.stats.calls++;
    const kp = (kk + 7) & ~7, mp = m + (m & 1), np = (n + 3) & ~3;
    const bytes = 4 * nb * mp * np + 2 * nb * (mp + np) * kp;
    if (!this.kernel || kk === 0 || bytes > this.batchLimit()) { this.stats.cpuCalls++; return this.cpuUnit(a, transA, b, transB, nb, m, kk, n, out); }
    if (this.route && !gpuPays(nb, m, kk, n, this.route)) { this.stats.routed++; return this.cpuUnit(a, transA, b, transB, nb, m, kk, n, out); }
    // (batch, Mp, Kp) and (batch, Np, Kp) int16 codes, scales, padded C, result: live until done
    h.live++;
    try {
      return this.enqueue(this.unitJob(h, a, transA, b, transB, nb, m, kk, n, out, kp, mp, np, bytes));
    } catch (e) {
      h.done();
      throw e;
    }
  }

  unitJob(h, a, transA, b, transB, nb, m, kk, n, out, kp, mp, np, bytes) {
    const oA = h.alloc(nb * mp * kp * 2), oB = h.alloc(nb * np * kp * 2), oSa = h.alloc(nb * m * 8), oSb = h.alloc(nb * n * 8);
    const oC = h.alloc(nb * mp * np * 4), oOut = h.alloc(nb * m * n * 8);
    const top = h.top, oXa = h.alloc(a.length * 8), oXb = h.alloc(b.length * 8);   // the floats: only for now
    let buf = h.mem.buffer;
    new Float64Array(buf, oXa, a.length).set(a);
    new Float64Array(buf, oXb, b.length).set(b);
    if (kp !== kk || mp !== m) new Int16Array(buf, oA, nb * mp * kp).fill(0);
    if (kp !== kk || np !== n) new Int16Array(buf, oB, nb * np * kp).fill(0);
    (transA ? h.qcols : h.qrows)(oXa, oA, oSa, nb, m, kk, mp, kp);   // A's logical row i
    (transB ? h.qrows : h.qcols)(oXb, oB, oSb, nb, n, kk, np, kp);   // B's logical column j
    h.top = top;
    // the kernels' int8x4 words of both operands, uploaded straight from wasm memory
    const aBytes = nb * mp * kp, bBytes = nb * np * kp, oA8 = h.alloc(aBytes), oB8 = h.alloc(bBytes);
    h.pack8(oA, oA8, aBytes);
    h.pack8(oB, oB8, bBytes);
    const job = {
      batch: nb, M: mp, N: np, K4: kp / 4, aWords: aBytes / 4, bWords: bBytes / 4,
      shape: `${nb}x${m}x${kk}x${n}`, bytes,
      write(queue, buffer, aByte, bByte) {
        queue.writeBuffer(buffer, aByte, h.mem.buffer, oA8, aBytes);
        queue.writeBuffer(buffer, bByte, h.mem.buffer, oB8, bBytes);
      },
      take: (c) => { new Int32Array(h.mem.buffer, oC, c.length).set(c); },
      audit: (call) => {
        const views = () => {
          buf = h.mem.buffer;
          return [view(new Int16Array(buf), oA / 2, mp * kp, kp, 1), view(new Int16Array(buf), oB / 2, np * kp, 1, kp),
            view(new Int32Array(buf), oC / 4, mp * np, np, 1)];
        };
        const wasmChecksum = () => {
          const row = h.auditAt(oA, oB, oC, freivaldsVector(this.auditKey, call, kk, n), nb, m, kk, n, mp, np, kp);
          if (!row) return null;
          const b = Math.floor((row - 1) / m), i = (row - 1) % m;
          return checksumAuditView(...views(), nb, m, kk, n, this.auditKey, call)
            || `checksum audit (wasm): batch ${b} row ${i} failed; the JS audit disagrees`;
        };
        return this.audit(...views(), nb, m, kk, n, call, wasmChecksum);
      },
      finish: () => {
        h.epi(oC, oSa, oSb, oOut, nb, m, n, mp, np);
        const result = new Float64Array(h.mem.buffer, oOut, nb * m * n);
        return out ? (out.set(result), out) : result.slice();
      },
      cpu: () => this.cpuUnit(a, transA, b, transB, nb, m, kk, n, out),
      done: () => h.done(),
    };
    return job;
  }

  cpuUnit(a, transA, b, transB, nb, m, kk, n, out) {
    return this.cpu.qmatmulT ? this.cpu.qmatmulT(a, transA, b, transB, nb, m, kk, n, out)
      : unitQmatmulT(this.cpu, a, transA, b, transB, nb, m, kk, n, out);
  }

  // -> Promise of the job's result; jobs issued in the same tick share one submit.
  enqueue(job) {
    if (this.pending && this.pendingBytes + job.bytes > this.batchLimit()) this.flush();
    return new Promise((resolve, reject) => {
      Object.assign(job, { resolve, reject });
      if (!this.pending) { this.pending = []; this.pendingBytes = 0; queueMicrotask(() => this.flush()); }
      this.pending.push(job); this.pendingBytes += job.bytes;
    });
  }

  flush() {
    const jobs = this.pending;
    if (!jobs) return;
    this.pending = null;
    const kernel = this.kernel, prev = this.lastBatch;
    this.lastBatch = (async () => {
      let error = null;
      if (kernel) {
        this.stats.submits++;
        try { await kernel.run(jobs, (i, c) => jobs[i].take(c)); } catch (e) { error = e; }
      }
      await prev;            // batches finish in submission order: call numbers follow issue order
      if (error) await this.submitFailed(kernel, jobs, error);
      for (const job of jobs) {
        try {
          if (error || !kernel || this.kernel !== kernel) {   // lost, faulted or failed: don't trust it
            this.stats.cpuCalls++;
            job.resolve(await job.cpu());
            continue;
          }
          this.stats.gpuCalls++;
          const call = this.stats.gpuCalls, bad = job.audit(call);
          if (bad) {
            const reason = `${kernel.id} kernel failed an audit on call ${call} (${job.shape}): ${bad}`;
            this.fault(reason, 'audit');
            job.reject(new GpuFault(reason, { kind: 'audit', recompute: true }));
            continue;
          }
          job.resolve(job.finish());
        } catch (e) {
          job.reject(e);
        } finally {
          if (job.done) job.done();
        }
      }
    })();
  }

  async submitFailed(kernel, jobs, e) {
    // A submit that fails because the device went away (e.g. mapAsync aborted) usually rejects
    // before device.lost resolves: give it a moment so the reason names the real cause.
    const lost = this.device && await Promise.race([this.device.lost, new Promise((r) => setTimeout(r, 100, null))]);
    if (lost) { if (!this.lostReported) this.reportLost(lost); return; }
    if (this.kernel !== kernel) return;      // already faulted for another reason
    this.fault(`${kernel.id} kernel failed a submit of ${jobs.length} call(s) (${jobs.map((j) => j.shape).join(', ')}): ${e.message}`, 'error');
  }

  // Audits of one GPU result (operands and C as gpu_gates.js views) -> null or the reason;
  // checksum: the same check in wasm where the unit's host has it (-> null or the reason)
  audit(A, B, C, batch, M, K, N, call, checksum = null) {
    let bad = null;
    if (this.opts.checksum !== false) {
      this.stats.checksums++;
      bad = checksum ? checksum() : checksumAuditView(A, B, C, batch, M, K, N, this.auditKey, call);
    }
    const every = this.opts.auditEvery ?? 8;
    if (!bad && every > 0 && call % every === 0) {
      this.stats.tileAudits++;
      bad = tileAuditView(A, B, C, batch, M, K, N, this.auditKey, call, this.opts.auditTile ?? 8);
    }
    return bad;
  }

  destroy() {
    this.closing = true;
    if (this.device && this.onGpuError) this.device.removeEventListener('uncapturederror', this.onGpuError);
    if (this.kernel) this.kernel.destroy();
    if (this.ownsDevice && this.device) this.device.destroy();
    this.kernel = null; this.status.path = 'cpu'; this.name = 'cpu';
  }
}

// createGpuEngine({ gpu, auditEvery = 8, auditTile = 8, checksum = true, seed, kernelBase, tuning,
//                   kernels, onFault, device, info, route = 'all' | 'auto', routeRule = ROUTE })
// -> GpuEngine (never null: when the GPU is
// unusable it runs on the CPU and engine.status = { path: 'cpu', reasons: [...] } says why).
export async function createGpuEngine(opts = {}) {
  const engine = new GpuEngine(opts);
  if (opts.onFault) engine.onFault(opts.onFault);
  return engine.boot();
}

// Runs stepFn(engine) (which must not mutate state before it returns); when the GPU returned a
// wrong result (GpuFault) the engine is on the CPU by then, so the step is simply computed again.
export async function withGpuFallback(engine, stepFn) {
  try {
    return await stepFn(engine);
  } catch (e) {
    if (!(e instanceof GpuFault)) throw e;
    console.error(`[gpu] recomputing the step on CPU: ${e.message}`);
    return stepFn(engine);
  }
}
