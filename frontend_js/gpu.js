// The WebGPU integer engine: exact int8 GEMMs on the GPU behind the engine contract of
// frontend_js/units.js ({ name, gemm(qa, qb, batch, M, K, N) -> Int32Array (batch, M, N) }).
// The GPU does integer work only; quantization and the float epilogue stay on the CPU, so the
// bits of every result are those of cpuEngine.gemm — and the engine proves it:
//   boot:     device, then each kernel in preference order (packed dot4I8Packed, then portable
//             i32) is compiled and gated (frontend_js/gpu_gates.js); the first that passes is used.
//   each call: the result is bound-checked and Freivalds-checked; every `auditEvery` calls a
//             random tile is recomputed exactly on the CPU.
//   faults:   a failed gate, shader compile error, validation/OOM error, uncaptured error, lost
//             device or failed audit switches the engine to the CPU for good, with the reason in
//             engine.status.reasons, console.error, onFault callbacks and a 'fault' event.
//             Errors mean nothing wrong was returned: that call is computed on the CPU and the step
//             goes on. A failed audit means the GPU returned wrong numbers: gemm throws GpuFault
//             (recompute: true) and the caller redoes the whole step (withGpuFallback does that).
// Data layout: the engine packs A (batch, M, K) row by row and B (batch, K, N) transposed to
// (batch, N, K), each row zero-padded to K4 = ceil(K/4) words (packI8x4 lanes), on the CPU before
// upload; so the backward GEMMs (which the model hands over already transposed, as float arrays
// before quantization) are the same op and the kernels only ever read K-contiguous words.
// Runs in a browser (navigator.gpu, kernels fetched relative to this file) and under Node's
// `webgpu` package (pass { gpu }, kernels read from disk through file: URLs).
import { cpuEngine, packI8x4, MAX_K } from './units.js';
import { gateKernel, checksumAudit, tileAudit, auditKey } from './gpu_gates.js';

export const KERNEL_BASE = new URL('../kernels/', import.meta.url);
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

// One compiled GEMM kernel. C = A @ B on words packed by packRowsI8 / packColsI8.
export class GemmKernel {
  constructor(device, spec, pipeline, tuning) {
    this.device = device; this.spec = spec; this.pipeline = pipeline; this.tuning = tuning;
    this.id = spec.id;
    // the bug corpus's stateful kernel keeps a dispatch counter in binding 4
    this.state = spec.stateful ? storageBuffer(device, 16, new Uint32Array(4)) : null;
    this.pool = new Map();    // "usage:size" -> free buffers
  }

  static async create(device, spec, { kernelBase = KERNEL_BASE, tuning = {} } = {}) {
    const t = { ...DEFAULT_TUNING, ...tuning };
    const code = await loadText(new URL(spec.file, kernelBase));
    const pipeline = await compileKernel(device, code, { ...t, ...(spec.constants || {}) }, spec.file);
    return new GemmKernel(device, spec, pipeline, t);
  }

  tile() { return { M: this.tuning.WG_Y * this.tuning.RM, N: this.tuning.WG_X * this.tuning.RN }; }

  // bind group + workgroup counts for buffers already on the GPU (params: a 16-byte uniform)
  prepare(aBuf, bBuf, cBuf, batch, M, K4, N, params = null) {
    if (params) this.device.queue.writeBuffer(params, 0, new Uint32Array([M, N, K4, batch]));
    else params = uniformBuffer(this.device, [M, N, K4, batch]);
    const entries = [aBuf, bBuf, cBuf, params].map((buffer, binding) => ({ binding, resource: { buffer } }));
    if (this.state) entries.push({ binding: 4, resource: { buffer: this.state } });
    const bindGroup = this.device.createBindGroup({ layout: this.pipeline.getBindGroupLayout(0), entries });
    const t = this.tile();
    return { bindGroup, params, groups: [Math.ceil(N / t.N), Math.ceil(M / t.M), batch] };
  }

  encode(pass, prep) {
    pass.setPipeline(this.pipeline);
    pass.setBindGroup(0, prep.bindGroup);
    pass.dispatchWorkgroups(...prep.groups);
  }

  // Buffers are reused across calls of the same sizes (a training step repeats a few shapes):
  // creating five buffers per call cost about a millisecond on the H200.
  take(usage, bytes) {
    const size = Math.max(16, Math.ceil(bytes / 16) * 16), k = `${usage}:${size}`;
    const list = this.pool.get(k);
    return (list && list.pop()) || this.device.createBuffer({ size, usage });
  }

  give(buf) {
    const k = `${buf.usage}:${buf.size}`;
    if (!this.pool.has(k) && this.pool.size >= 96) { buf.destroy(); return; }
    const list = this.pool.get(k) || [];
    if (list.length >= 2) { buf.destroy(); return; }
    list.push(buf); this.pool.set(k, list);
  }

  destroy() {
    for (const list of this.pool.values()) for (const b of list) b.destroy();
    this.pool.clear();
    if (this.state) this.state.destroy();
  }

  // int8 (batch, M, K) @ (batch, K, N) -> Int32Array (batch, M, N); packB: the host packer for B.
  // One submit: dispatch, then copy C into a mappable buffer; then one mapAsync.
  async gemm(qa, qb, batch, M, K, N, packB = packColsI8) {
    const d = this.device, K4 = Math.ceil(K / 4);
    const a = packRowsI8(qa, batch * M, K), bt = packB(qb, batch, K, N);
    const bytesC = batch * M * N * 4;
    const S = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    const aBuf = this.take(S, a.byteLength), bBuf = this.take(S, bt.byteLength), cBuf = this.take(S, bytesC);
    const params = this.take(GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST, 16);
    const read = this.take(GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST, bytesC);
    const used = [aBuf, bBuf, cBuf, params, read];
    let ok = false;
    try {
      d.queue.writeBuffer(aBuf, 0, a); d.queue.writeBuffer(bBuf, 0, bt);
      const prep = this.prepare(aBuf, bBuf, cBuf, batch, M, K4, N, params);
      await submitChecked(d, (enc) => {
        const p = enc.beginComputePass(); this.encode(p, prep); p.end();
        enc.copyBufferToBuffer(cBuf, 0, read, 0, Math.ceil(bytesC / 4) * 4);
      });
      await read.mapAsync(GPUMapMode.READ);
      const c = new Int32Array(read.getMappedRange(0, Math.ceil(bytesC / 4) * 4).slice(0), 0, batch * M * N);
      read.unmap();
      ok = true;
      return c;
    } finally {
      for (const b of used) { if (ok) this.give(b); else b.destroy(); }
    }
  }
}

// --- the engine -------------------------------------------------------------------------------

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
    this.stats = { calls: 0, gpuCalls: 0, cpuCalls: 0, checksums: 0, tileAudits: 0 };
    this.kernel = null; this.device = null;
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
      this.log(`using the ${spec.id} kernel (gates passed: ${gate.cases.length} cases)`);
      return this;
    }
    this.fault('no GPU kernel passed its gate', 'gate');
    return this;
  }

  // The engine contract. Always exact: GPU when proven, else cpuEngine.
  async gemm(qa, qb, batch, M, K, N) {
    checkOperands(qa, qb, batch, M, K, N);
    this.stats.calls++;
    const kernel = this.kernel;
    const tooBig = this.device && Math.max(batch * M * N * 4, batch * N * Math.ceil(K / 4) * 4) > this.device.limits.maxStorageBufferBindingSize;
    if (!kernel || tooBig) { this.stats.cpuCalls++; return cpuEngine.gemm(qa, qb, batch, M, K, N); }
    let c;
    try {
      c = await kernel.gemm(qa, qb, batch, M, K, N, this.opts.packB || packColsI8);
    } catch (e) {
      // A call that fails because the device went away (e.g. mapAsync aborted) usually rejects
      // before device.lost resolves: give it a moment so the reason names the real cause.
      const lost = this.device && await Promise.race([this.device.lost, new Promise((r) => setTimeout(r, 100, null))]);
      if (lost) { if (!this.lostReported) this.reportLost(lost); }
      else this.fault(`${kernel.id} kernel failed a call (${batch}x${M}x${K}x${N}): ${e.message}`, 'error');
      this.stats.cpuCalls++;
      return cpuEngine.gemm(qa, qb, batch, M, K, N);
    }
    if (this.kernel !== kernel) {   // lost or faulted while in flight: don't trust what came back
      this.stats.cpuCalls++;
      return cpuEngine.gemm(qa, qb, batch, M, K, N);
    }
    this.stats.gpuCalls++;
    const call = this.stats.gpuCalls;
    let bad = null;
    if (this.opts.checksum !== false) { this.stats.checksums++; bad = checksumAudit(qa, qb, c, batch, M, K, N, this.auditKey, call); }
    const every = this.opts.auditEvery ?? 8;
    if (!bad && every > 0 && call % every === 0) {
      this.stats.tileAudits++;
      bad = tileAudit(qa, qb, c, batch, M, K, N, this.auditKey, call, this.opts.auditTile ?? 8);
    }
    if (bad) {
      const reason = `${kernel.id} kernel failed an audit on call ${call} (${batch}x${M}x${K}x${N}): ${bad}`;
      this.fault(reason, 'audit');
      throw new GpuFault(reason, { kind: 'audit', recompute: true });
    }
    return c;
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
//                   kernels, onFault, device, info }) -> GpuEngine (never null: when the GPU is
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
