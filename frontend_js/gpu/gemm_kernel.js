// The GEMM kernel: C = A @ B exactly, int8 operands, int32 results, on the GPU.
// Data layout: the kernel (kernels/gemm_int8.wgsl, its dot4 prepended: gemmSource) reads A (batch, M, K4) and B^T (batch, N, K4) as
// u32 words of four int8 lanes (units.js packI8x4), K zero-padded to K4 words; C is (batch, M, N)
// int32. packRowsI8 / packColsI8 make those words from int8 operands on the host (B transposed).
// GemmKernel.run takes any number of jobs (see engine.js "Jobs") and runs them as ONE submit and
// ONE mapAsync; it knows nothing of quantization, audits or routing.
import { packI8x4 } from '../units.js';
import { ERROR_SCOPES, loadText, compileKernel, storageBuffer, uniformBuffer } from './device.js';

export const KERNEL_BASE = new URL('../../kernels/', import.meta.url);
export const PACKED_FEATURE = 'packed_4x8_integer_dot_product';

// In preference order. `file`: the variant's dot4 (prepended to GEMM_BODY); `needs`: a WGSL
// language feature it requires.
export const GEMM_KERNELS = [
  { id: 'packed', file: 'dot4_packed.wgsl', needs: PACKED_FEATURE },
  { id: 'portable', file: 'dot4_portable.wgsl' },
];
export const GEMM_BODY = 'gemm_int8.wgsl';
// its Params words for one job: K in one slice (split-K is the INT8 unit's, f64.js gemmSplits)
const gemmParams = (M, N, K4, batch) => [M, N, K4, batch, 1, 0, 0, 0];
const PARAM_BYTES = 32;

// A GEMM kernel's WGSL: the dot4 of `file` prepended to the one body, as f64_lib.wgsl is prepended
// to the f64 kernels. body: GEMM_BODY, or a patched copy's URL (the bug corpus, tests/gpu/mutants.js)
export async function gemmSource(file, kernelBase = KERNEL_BASE, body = GEMM_BODY) {
  const [dot, main] = await Promise.all([loadText(new URL(file, kernelBase)), loadText(new URL(body, kernelBase))]);
  return `${dot}\n${main}`;
}
// Tile 32x32: small enough for SwiftShader; the H200 bench sets WG 16x16, RM = RN = 8.
export const DEFAULT_TUNING = { WG_X: 8, WG_Y: 8, RM: 4, RN: 4, TK: 4 };

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

const ALIGN = 256;                                        // storage/uniform binding offset alignment
const align = (bytes) => Math.ceil(bytes / ALIGN) * ALIGN;
const S_USAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

// One compiled GEMM kernel. C = A @ B on words packed as in the header.
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
    const code = await gemmSource(spec.file, kernelBase, spec.body);
    const pipeline = await compileKernel(device, code, { ...t, ...(spec.constants || {}) }, spec.file);
    return new GemmKernel(device, spec, pipeline, t);
  }

  tile() { return { M: this.tuning.WG_Y * this.tuning.RM, N: this.tuning.WG_X * this.tuning.RN }; }
  groups(batch, M, N) { const t = this.tile(); return [Math.ceil(N / t.N), Math.ceil(M / t.M), batch]; }

  bindGroup(entries) {
    if (this.state) entries.push({ binding: 4, resource: { buffer: this.state } });
    return this.device.createBindGroup({ layout: this.pipeline.getBindGroupLayout(0), entries });
  }

  // bind group + workgroup counts for buffers already on the GPU (params: a 32-byte uniform)
  prepare(aBuf, bBuf, cBuf, batch, M, K4, N, params = null) {
    if (params) this.device.queue.writeBuffer(params, 0, new Uint32Array(gemmParams(M, N, K4, batch)));
    else params = uniformBuffer(this.device, gemmParams(M, N, K4, batch));
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
      for (const s of ERROR_SCOPES) d.pushErrorScope(s);
      const enc = d.createCommandEncoder(), pass = enc.beginComputePass();
      pass.setPipeline(this.pipeline);
      jobs.forEach((j, i) => {
        const l = lay[i];
        j.write(d.queue, slot.input, l.a, l.b);
        slot.paramWords.set(gemmParams(j.M, j.N, j.K4, j.batch), (i * ALIGN) / 4);
        const k = `${i}:${l.a}:${j.aWords}:${l.b}:${j.bWords}:${l.c}:${l.cBytes}`;
        let bg = slot.binds.get(k);
        if (!bg) {
          bg = this.bindGroup([[slot.input, l.a, j.aWords * 4], [slot.input, l.b, j.bWords * 4], [slot.output, l.c, l.cBytes],
            [slot.params, i * ALIGN, PARAM_BYTES]].map(([buffer, offset, size], binding) => ({ binding, resource: { buffer, offset, size } })));
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
      const pops = ERROR_SCOPES.map(() => d.popErrorScope());
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
export function int8Job(qa, qb, batch, M, K, N, packB) {
  const a = packRowsI8(qa, batch * M, K), b = packB(qb, batch, K, N);
  return { batch, M, N, K4: Math.ceil(K / 4), aWords: a.length, bWords: b.length,
    write(queue, buffer, aByte, bByte) { queue.writeBuffer(buffer, aByte, a); queue.writeBuffer(buffer, bByte, b); } };
}
