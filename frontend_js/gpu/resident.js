// The resident step's kernels (docs/ARCHITECTURE.md "The resident step", docs/VERIFICATION.md
// §9.2): the pieces of model.js and optim.js other than the INT8 unit, in float64 emulated on u32
// words (kernels/f64_lib.wgsl + kernels/f64_rows.wgsl prepended to each kernels/res_*.wgsl), so
// activations, weights and Adam's moments can stay on the GPU for a whole step. Each kernel is the
// JS twin's operations in the JS order; resident_gates.js checks every one against its twin, bit
// for bit, at boot and in the tests.
//   ResidentKernels.create(device, opts) compiles them (opts.texts: file -> text, the bug corpus)
//   k.f64(values) / k.zeros(n) / k.u32(words) / k.read(buffer, n)   buffers in and out
//   k.beginStep() -> step   a step's lease: step.scratch(bytes, enc) (a temporary from the pool,
//                         cleared in `enc`), step.input(words) (one written from the host),
//                         step.bind(pipe, entries) (a bind group, kept across steps), step.end()
//                         (its temporaries back into the pool, its parameter slots free: after
//                         its read-back)
//   k.uniform(words) / k.holdUniforms() / k.releaseUniforms()   dispatch parameters in 256-byte
//                         slots of a few kept buffers, reused once no step that wrote them is in flight
//   k.submit(commandBuffers)   the parameters written since the last submit onto the GPU, then
//                         the commands: every submit of work that reads a slot goes through it
//   k.<piece>(..., enc?)  one dispatch on GPU buffers, encoded into `enc` (a GPUCommandEncoder)
//                         or submitted at once
// Runs in a browser (kernels fetched relative to gemm_kernel.js) and under Node's `webgpu` package.
import { loadText, compileKernel, bindLayout, ERROR_SCOPES } from './device.js';
import { KERNEL_BASE } from './gemm_kernel.js';
import { key, draw, PURPOSE_EXCHANGE, PURPOSE_AUDIT } from '../prng.js';
import { CODECS } from '../exchange_codec.js';
import { unitDot } from '../units.js';

export const RESIDENT_LIBS = Object.freeze(['f64_lib.wgsl', 'f64_rows.wgsl']);
// piece -> [kernel file, TREE_N (the workgroup tree's capacity: half the longest row it sums, padded)]
export const RESIDENT_KERNELS = Object.freeze({
  add: ['res_add.wgsl', 1],
  relu: ['res_relu.wgsl', 1],
  reluBack: ['res_relu_back.wgsl', 1],
  adam: ['res_adam.wgsl', 1],
  rmsnorm: ['res_rmsnorm.wgsl', 64],             // C <= 128
  rmsnormDx: ['res_rmsnorm_dx.wgsl', 64],        // C <= 128
  rmsnormDg: ['res_rmsnorm_dg.wgsl', 2048],      // N = B*T <= 4096
  causalSoftmax: ['res_softmax.wgsl', 64],       // T <= 128
  softmaxBack: ['res_softmax_back.wgsl', 64],    // T <= 128
  crossEntropy: ['res_xent.wgsl', 256],          // V = 257
  embedBack: ['res_embed_back.wgsl', 1],
  embed: ['res_embed.wgsl', 1],
  splitHeads: ['res_split_heads.wgsl', 1],
  wpeBack: ['res_wpe_back.wgsl', 1],
  mergeHeads: ['res_merge_heads.wgsl', 1],
  int8Encode: ['res_codec_encode.wgsl', 1],
  int8Decode: ['res_codec_decode.wgsl', 1],
  auditGather: ['res_audit_gather.wgsl', 1],
});
export const RESIDENT_WG = 64;
// elements of every unit call's result self-audited per step (its last and one drawn): the rows
// and columns they need are read back with the step, 1.3 MB at the largest settings
export const UNIT_AUDIT_SAMPLES = 2;
const UNIT_AUDIT_STREAM = 0x5e1fa0d1;   // the elements' draw: the audit purpose's key, another stream (no bit depends on it)
const ALIGN = 256;
const UNIFORM_CHUNK = 64 * 1024;    // 256 parameter slots per uniform buffer
const align = (bytes) => Math.ceil(Math.max(bytes, 16) / ALIGN) * ALIGN;
const STORAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

// a float64 as its two u32 words (low, high): how a uniform carries it
const words = (x) => new Uint32Array(new Float64Array([x]).buffer);
// the int8 message of n values as u32 words: per block of 256, 65 words (scale + codes)
export const int8MessageWords = (n) => Math.ceil((4 * Math.ceil(n / 256) + n) / 4);

// Bind groups kept by what they bind (the pipeline; each entry's buffer, offset and size): a step
// binds the same pool buffers and parameter slots every time, so it makes its bind groups once
// (a bind group cost more host time than any other call of a dispatch, Dawn under Node). At most
// `cap` are kept: past it the cache starts over (a change of settings, the gates' fresh buffers).
export class BindGroupCache {
  constructor(device, cap = 4096) {
    this.device = device; this.cap = cap;
    this.ids = new WeakMap(); this.nextId = 1;     // object -> a number for the key
    this.groups = new Map();                        // key -> GPUBindGroup
    this.made = 0;                                  // bind groups made (a bench's count)
  }
  id(obj) { let i = this.ids.get(obj); if (!i) { i = this.nextId++; this.ids.set(obj, i); } return i; }
  // pipe, entries [[buffer, offset, size], ...] (binding i = entry i) -> a GPUBindGroup
  get(pipe, entries) {
    let key = `${this.id(pipe)}`;
    for (const [b, offset, size] of entries) key += ` ${this.id(b)}/${offset}/${size}`;
    let g = this.groups.get(key);
    if (!g) {
      if (this.groups.size >= this.cap) this.groups.clear();
      g = this.device.createBindGroup({ layout: bindLayout(pipe), entries: entries.map(([buffer, offset, size], binding) => ({ binding, resource: { buffer, offset, size } })) });
      this.groups.set(key, g);
      this.made++;
    }
    return g;
  }
}

export class ResidentKernels {
  constructor(device, pipes) {
    this.device = device; this.pipes = pipes;
    this.uniformChunks = [];         // UNIFORM_CHUNK-byte uniform buffers, kept; 256-byte slots
    this.uniformsUsed = 0;           // slots written since they were last free
    this.stepsInFlight = 0;          // steps between holdUniforms() and their releaseUniforms()
    this.pool = new Map();           // size (a power of two) -> free storage buffers of the steps' temporaries
    this.reads = new Map();          // size -> free mappable buffers (read-backs)
    this.groups = new BindGroupCache(device);
  }

  // A step's lease on the pool, the parameter slots and the bind groups. The pool hands buffers
  // out first in, first out, so a step of the same shapes gets the same buffers in the same order
  // each time, its parameters the same slots, and so the same bind groups (kept in this.groups:
  // from the second step on a step makes none; ~200 at the largest settings otherwise).
  beginStep() {
    const k = this, lent = [];
    let open = true;
    k.holdUniforms();
    return {
      // a temporary of at least `bytes`, zeroed by a clear encoded into `enc` (as a fresh buffer is)
      scratch(bytes, enc) { const b = k.take(bytes); enc.clearBuffer(b); lent.push(b); return b; },
      // a temporary holding `data` (a typed array), written now: queue order puts the write after
      // the work already submitted and before this step's
      input(data) { const b = k.take(data.byteLength); k.device.queue.writeBuffer(b, 0, data); lent.push(b); return b; },
      bind: (pipe, entries) => k.groups.get(pipe, entries),
      // the temporaries back into the pool, the slots free (after the work that used them)
      end() {
        if (!open) return;
        open = false;
        for (const b of lent) k.pool.get(b.size).push(b);
        k.releaseUniforms();
      },
    };
  }
  // Another ResidentKernels on this device and these pipelines, with its own pool, parameter slots,
  // read-back buffers and bind groups: one ResidentTrainer's among several of one process. A
  // trainer's steps never overlap (it waits its step started ahead out before another), so each
  // of its steps takes the same buffers and slots in the same order, and so the same bind groups.
  // Two trainers sharing one instance (a Group of two) took them in an order that changed with
  // their steps' overlap: on an H100, ~160 bind groups remade per local step at the default
  // settings, its encoding 2.7 -> 5.6 ms, the 2-peer step 12.0 -> 17.5 ms (TEST_RESULTS "What the
  // unit's self-audit costs"). A page's one trainer at a time keeps sharing one pool.
  own() { return new ResidentKernels(this.device, this.pipes); }
  // every buffer this instance holds freed (its trainer is done with it)
  destroy() {
    for (const list of [...this.pool.values(), ...this.reads.values()]) for (const b of list) b.destroy();
    for (const chunk of this.uniformChunks) chunk.buffer.destroy();
    this.pool.clear(); this.reads.clear(); this.uniformChunks = []; this.groups = new BindGroupCache(this.device);
  }
  // a storage buffer of at least `bytes` (a power of two), from the pool: a step allocates nothing
  // once its shapes have been seen (a buffer's creation and first clear cost more than a clear)
  take(bytes) {
    const size = 2 ** Math.ceil(Math.log2(align(bytes)));
    if (!this.pool.has(size)) this.pool.set(size, []);
    return this.pool.get(size).shift() || this.device.createBuffer({ size, usage: STORAGE() });
  }

  // opts: kernelBase; texts: {file: WGSL text} replacing a kernel or library file (the bug corpus);
  // only: the pieces to compile (default: every one in RESIDENT_KERNELS)
  static async create(device, { kernelBase = KERNEL_BASE, texts = {}, only = Object.keys(RESIDENT_KERNELS) } = {}) {
    const text = async (file) => texts[file] ?? loadText(new URL(file, kernelBase));
    const lib = (await Promise.all(RESIDENT_LIBS.map(text))).join('\n');
    const pipes = {};
    await Promise.all(only.map(async (piece) => {
      const [file, treeN] = RESIDENT_KERNELS[piece];
      pipes[piece] = await compileKernel(device, `${lib}\n${await text(file)}`, { WG: RESIDENT_WG, TREE_N: treeN }, `${file} + ${RESIDENT_LIBS.join(' + ')}`);
    }));
    return new ResidentKernels(device, pipes);
  }

  // --- buffers ------------------------------------------------------------------------------
  buffer(bytes) { return this.device.createBuffer({ size: align(bytes), usage: STORAGE() }); }
  f64(values) { const b = this.buffer(values.length * 8); this.device.queue.writeBuffer(b, 0, Float64Array.from(values)); return b; }
  zeros(n) { return this.buffer(n * 8); }                       // WebGPU zero-fills: +0.0 each
  u32(values) { const b = this.buffer(values.length * 4); this.device.queue.writeBuffer(b, 0, Uint32Array.from(values)); return b; }
  // One dispatch's parameters -> its binding {buffer, offset, size}: the next free slot of a few
  // kept buffers, written into the host's copy of its buffer now and onto the GPU by the next
  // submit() (one write per buffer per submit; queue order puts it before the commands that read
  // it). A fresh buffer per dispatch (~280 per local step) cost the host several times a write
  // into a kept slot (Dawn), and a write per slot again more than one per submit.
  uniform(u32s) {
    const n = Math.ceil(u32s.length / 4) * 4;
    if (n * 4 > ALIGN) throw new Error(`${n * 4} bytes of parameters: a slot holds ${ALIGN}`);
    const per = UNIFORM_CHUNK / ALIGN, i = this.uniformsUsed++, c = Math.floor(i / per);
    if (c === this.uniformChunks.length) {
      this.uniformChunks.push({ buffer: this.device.createBuffer({ size: UNIFORM_CHUNK, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST }),
        host: new Uint32Array(UNIFORM_CHUNK / 4), lo: Infinity, hi: 0 });
    }
    const chunk = this.uniformChunks[c], offset = (i % per) * ALIGN, at = offset / 4;
    chunk.host.fill(0, at, at + n); chunk.host.set(u32s, at);
    chunk.lo = Math.min(chunk.lo, offset); chunk.hi = Math.max(chunk.hi, offset + n * 4);
    return { buffer: chunk.buffer, offset, size: ALIGN };
  }
  // the parameters written since the last submit onto the GPU, then the command buffers
  submit(commandBuffers) {
    for (const chunk of this.uniformChunks) {
      if (chunk.hi <= chunk.lo) continue;
      this.device.queue.writeBuffer(chunk.buffer, chunk.lo, chunk.host, chunk.lo / 4, (chunk.hi - chunk.lo) / 4);
      chunk.lo = Infinity; chunk.hi = 0;
    }
    this.device.queue.submit(commandBuffers);
  }
  // A step takes the slots it writes until its releaseUniforms() (after its read-back: its work is
  // done); the slots are free again once no held step is in flight, so two trainers' steps on
  // these kernels never write each other's parameters. Without a hold (the gates): free at once.
  holdUniforms() { this.stepsInFlight++; }
  releaseUniforms() {
    this.stepsInFlight = Math.max(0, this.stepsInFlight - 1);
    if (this.stepsInFlight === 0) this.uniformsUsed = 0;
  }

  // buffer -> Float64Array of its first n values (after the queued work)
  async read(buffer, n) {
    const bytes = align(n * 8), d = this.device;
    const read = d.createBuffer({ size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    try {
      const enc = d.createCommandEncoder();
      enc.copyBufferToBuffer(buffer, 0, read, 0, bytes);
      this.submit([enc.finish()]);
      await read.mapAsync(GPUMapMode.READ);
      return new Float64Array(read.getMappedRange(0, bytes).slice(0, n * 8));
    } finally {
      read.destroy();
    }
  }

  // [[buffer, n, into?], ...] -> [Float64Array of each buffer's first n values]: one copy into one
  // staging buffer, one submit, one map (a step's read-backs in one round trip). `into` (a
  // Float64Array of n): the values are copied there from the mapped range (one host copy, not two)
  // and it is returned; none of them is written unless the whole read-back succeeded.
  async readMany(list) {
    const d = this.device, at = [];
    let bytes = 0;
    for (const [, n] of list) { at.push(bytes); bytes += align(n * 8); }
    const size = 2 ** Math.ceil(Math.log2(Math.max(bytes, ALIGN)));
    const read = this.reads.get(size)?.pop() || d.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    let ok = false;
    try {
      const enc = d.createCommandEncoder();
      list.forEach(([buffer, n], i) => enc.copyBufferToBuffer(buffer, 0, read, at[i], align(n * 8)));
      this.submit([enc.finish()]);
      await read.mapAsync(GPUMapMode.READ, 0, bytes);
      const all = read.getMappedRange(0, bytes);
      const out = list.map(([, n, into], i) => (into ? (into.set(new Float64Array(all, at[i], n)), into) : new Float64Array(all.slice(at[i], at[i] + n * 8))));
      read.unmap();
      ok = true;
      return out;
    } finally {
      if (ok) { if (!this.reads.has(size)) this.reads.set(size, []); this.reads.get(size).push(read); } else read.destroy();
    }
  }

  // one dispatch of `piece` over `groups` workgroups (a count; laid out in 2D under the limit);
  // its bind group from the cache (a step's buffers and slots repeat)
  dispatch(piece, buffers, groups, enc = null) {
    const d = this.device, pipe = this.pipes[piece];
    if (!pipe) throw new Error(`resident kernel ${piece} was not compiled`);
    // a buffer whole, or a binding {buffer, offset, size} (a uniform slot)
    const entries = buffers.map((b) => (b.buffer ? [b.buffer, b.offset, b.size] : [b, 0, b.size]));
    const bg = this.groups.get(pipe, entries);
    const own = !enc, e = enc || d.createCommandEncoder();
    const pass = e.beginComputePass();
    pass.setPipeline(pipe); pass.setBindGroup(0, bg);
    const lim = d.limits.maxComputeWorkgroupsPerDimension, gx = Math.max(1, Math.min(groups, lim));
    pass.dispatchWorkgroups(gx, Math.ceil(groups / gx));
    pass.end();
    if (own) this.submit([e.finish()]);
  }

  // --- the pieces (shapes as model.js; every buffer float64 unless said) ----------------------
  // one unit call's audit samples -> out: per sample [row of A (kk)][column of B (kk)][the result
  // element]; samples: [{aBase, aStride, bBase, bStride, e}] (at most 4; auditSamples)
  auditGather(a, b, r, out, kk, samples, enc) {
    if (samples.length > 4) throw new RangeError(`${samples.length} audit samples: a dispatch holds 4`);
    const at = [0, 1, 2, 3].flatMap((i) => { const x = samples[i]; return x ? [x.aBase, x.aStride, x.bBase, x.bStride] : [0, 0, 0, 0]; });
    const elem = [0, 1, 2, 3].flatMap((i) => [samples[i]?.e ?? 0, 0, 0, 0]);
    this.dispatch('auditGather', [a, b, r, out, this.uniform([kk, samples.length, 0, 0, ...at, ...elem])], Math.ceil(samples.length * (2 * kk + 1) / RESIDENT_WG), enc);
  }
  // x (n) += y (n)
  add(x, y, n, enc) { this.dispatch('add', [x, y, this.uniform([n])], Math.ceil(n / RESIDENT_WG), enc); }
  // h (n) -> hr (n)
  relu(h, hr, n, enc) { this.dispatch('relu', [h, hr, this.uniform([n])], Math.ceil(n / RESIDENT_WG), enc); }
  // dhr, h (n) -> dh (n)
  reluBack(dhr, h, dh, n, enc) { this.dispatch('reluBack', [dhr, h, dh, this.uniform([n])], Math.ceil(n / RESIDENT_WG), enc); }
  // w, m, v (n) updated in place from g (n): optim.adamStep's update with its constants
  // ({B1, OMB1, B2, OMB2, EPS}), the learning rate and the bias corrections bc1, bc2 of step t
  adam(w, g, m, v, n, { B1, OMB1, B2, OMB2, EPS }, lr, bc1, bc2, enc) {
    const p = [n, 0, 0, 0, ...[B1, OMB1, B2, OMB2, EPS, lr, bc1, bc2].flatMap((x) => [...words(x)])];
    this.dispatch('adam', [w, g, m, v, this.uniform(p)], Math.ceil(n / RESIDENT_WG), enc);
  }
  // x (N, C), g (C) -> y (N, C), xhat (N, C), r (N)
  rmsnorm(x, g, y, xhat, r, N, C, eps, enc) {
    this.dispatch('rmsnorm', [x, g, y, xhat, r, this.uniform([N, C, 0, 0, ...words(eps), 0, 0])], N, enc);
  }
  // dy (N, C), g (C), cache xhat (N, C), r (N) -> dx (N, C), dg (C): rmsnormBackward's two results
  rmsnormBackward(dy, g, xhat, r, dx, dg, N, C, enc) {
    const p = this.uniform([N, C]);
    this.dispatch('rmsnormDx', [dy, g, xhat, r, dx, p], N, enc);
    this.dispatch('rmsnormDg', [dy, xhat, dg, p], C, enc);
  }
  // s (G, T, T) -> pr (G, T, T), the scores times scale first
  causalSoftmax(s, pr, G, T, scale, enc) {
    this.dispatch('causalSoftmax', [s, pr, this.uniform([G * T, T, 0, 0, ...words(scale), 0, 0])], G * T, enc);
  }
  // dp, pr (G, T, T) -> ds (G, T, T)
  softmaxBackward(dp, pr, ds, G, T, scale, enc) {
    this.dispatch('softmaxBack', [dp, pr, ds, this.uniform([G * T, T, 0, 0, ...words(scale), 0, 0])], G * T, enc);
  }
  // logits (N, V), targets (N, u32) -> dlogits (N, V), lossN (N): the mean is the host's (treeSum / N)
  crossEntropy(logits, targets, dl, lossN, N, V, enc) {
    this.dispatch('crossEntropy', [logits, targets, dl, lossN, this.uniform([N, V])], N, enc);
  }
  // dx (N, C), idx (N, u32) -> dw (V, C)
  embeddingBackward(dx, idx, dw, V, N, C, enc) {
    this.dispatch('embedBack', [dx, idx, dw, this.uniform([V, N, C])], Math.ceil((V * C) / RESIDENT_WG), enc);
  }
  // wte (V, C), wpe (T, C), idx (N, u32) -> x (N, C) = wte[idx] + wpe[n % T]
  embed(wte, wpe, idx, x, N, T, C, enc) { this.dispatch('embed', [wte, wpe, idx, x, this.uniform([N, T, C])], Math.ceil((N * C) / RESIDENT_WG), enc); }
  // qkv (N, W) -> out (B, H, T, D): part 0 (q), 1 (k) or 2 (v) of W = 3C; W = C: splitHeads3
  splitHeads(qkv, out, part, B, T, H, D, enc, W = 3 * H * D) {
    this.dispatch('splitHeads', [qkv, out, this.uniform([B, T, H, D, part, W])], Math.ceil((B * H * T * D) / RESIDENT_WG), enc);
  }
  // dx (B, T, C) -> dwpe (T, C): the tree over b (B <= 32)
  wpeBackward(dx, dw, B, TC, enc) {
    if (B > 32) throw new Error(`the position gradient's tree holds 32 rows, got batch ${B}`);
    this.dispatch('wpeBack', [dx, dw, this.uniform([B, TC])], Math.ceil(TC / RESIDENT_WG), enc);
  }
  // yh (B, H, T, D) -> out (N, W) at column col0
  mergeHeads(yh, out, W, col0, B, T, H, D, enc) {
    this.dispatch('mergeHeads', [yh, out, this.uniform([B, T, H, D, W, col0])], Math.ceil((B * H * T * D) / RESIDENT_WG), enc);
  }
  // the int8 exchange (exchange_codec.js): x (n) -> msg, the message's bytes as u32 words
  // (int8MessageWords(n)), under the stream key `key` from `offset`; flags (one u32, zeroed by the
  // caller) != 0: a value or block the JS codec refuses (run it for the message)
  int8Encode(x, msg, flags, n, key, offset, enc) {
    this.dispatch('int8Encode', [x, msg, flags, this.uniform([n, key >>> 0, offset])], Math.ceil(n / 256), enc);
  }
  // msg (words) -> out (n) float64; flags != 0: a malformed block (the JS decode says which)
  int8Decode(msg, out, flags, n, enc) {
    this.dispatch('int8Decode', [msg, out, flags, this.uniform([n])], Math.ceil(n / RESIDENT_WG), enc);
  }
}

// The forward pass resident on the GPU (model.js forward, piece for piece): params as GPU buffers
// {name: buffer} (canonical names), idx and targets (N) on the host; every activation stays on
// the GPU; one command encoder, one submit; the per-row losses and the logits come back (the
// mean loss is the host's treeSum / N, as model.js crossEntropy). unit: gpu/f64.js GpuF64Unit.
// -> {loss, logits (N, V), lossN (N), nonFinite}: nonFinite true = an operand of a unit held
// ±inf or NaN (the caller then computes the step on the CPU)
// withGrads: the backward pass too (model.js backward), its gradients read back as {name: Float64Array}
// encode ({names, key}, with withGrads): the gradients laid end to end in `names` order (the flat
// gradient) and encoded on the GPU as the int8 exchange's message under the stream key `key`
// (exchange_codec.js; the slot's key) -> out.encoded (Uint8Array), or null when the kernel flagged
// a value the JS codec refuses (the exchange then encodes on the host, and says why)
// audit ({key, samples, clearResultOf}): every unit call's self-audit (VERIFICATION.md §9.2): its
// `samples` elements (auditSamples, drawn under `key`) gathered with their rows of A and columns
// of B into the call's audit buffer, read back with the step -> out.audits, for checkUnitAudits.
// clearResultOf: a test's fault, the last element of that unit call (0-based) cleared after it ran.
export async function residentForward(k, unit, params, cfg, idx, targets, { treeSum, NORM_EPS, VOCAB_SIZE }, withGrads = false, encode = null, audit = null) {
  const C = cfg.width, H = cfg.heads, L = cfg.layers, V = VOCAB_SIZE, B = cfg.batch, T = cfg.seq_len;
  const D = Math.floor(C / H), N = B * T, G = B * H, scale = 1.0 / Math.sqrt(D);
  const d = k.device, temps = [];
  // an invalid command buffer runs nothing and reads back zeros: every error is caught and thrown
  for (const sc of ERROR_SCOPES) d.pushErrorScope(sc);
  const step = k.beginStep();
  // The step is encoded in parts, each submitted when encoded (after the forward pass, after each
  // block's backward), so the GPU runs one part while the host encodes the next; the queue keeps
  // their order, so nothing else changes. `enc` is the part being encoded.
  let enc = d.createCommandEncoder();
  const submitPart = () => { k.submit([enc.finish()]); enc = d.createCommandEncoder(); };
  const z = (n) => step.scratch(n * 8, enc);       // every activation and gradient: the pool's, zeroed
  // token ids (>= 0) as the kernels' u32: an Int32Array's words as they are, anything else copied
  const u32 = (a) => (ArrayBuffer.isView(a) && a.BYTES_PER_ELEMENT === 4 ? new Uint32Array(a.buffer, a.byteOffset, a.length) : Uint32Array.from(a));
  const flags = step.scratch(16, enc), idxBuf = step.input(u32(idx)), targetBuf = step.input(u32(targets));
  const uniform = (words) => { const u = k.uniform(words); return [u.buffer, u.offset, u.size]; };
  const audits = [];                               // per unit call: {kk, samples, buffer}
  const mm = (a, ta, b, tb, nb, M, K, Nn) => {
    const out = z(nb * M * Nn);
    temps.push(...unit.encodeUnit(enc, a, ta, b, tb, nb, M, K, Nn, out, flags, (bytes) => step.scratch(bytes, enc), uniform, step.bind));
    if (audit) {
      const call = audits.length, samples = auditSamples(nb, M, K, Nn, ta, tb, audit.key, call, audit.samples);
      if (audit.clearResultOf === call) enc.clearBuffer(out, 8 * (nb * M * Nn - 1), 8);
      const buffer = z(samples.length * (2 * K + 1));
      k.auditGather(a, b, out, buffer, K, samples, enc);
      audits.push({ kk: K, samples, buffer });
    }
    return out;
  };
  let grads = null, logits, lossN, message = null;
  try {
    const norm = (x, g) => { const y = z(N * C), cache = { xhat: z(N * C), r: z(N) }; k.rmsnorm(x, g, y, cache.xhat, cache.r, N, C, NORM_EPS, enc); return [y, cache]; };
    const x = z(N * C);
    k.embed(params['wte.weight'], params['wpe.weight'], idxBuf, x, N, T, C, enc);
    const caches = [];
    for (let l = 0; l < L; l++) {
      const p = `blocks.${l}.`;
      const [xn1, n1] = norm(x, params[p + 'norm1.weight']);
      const qkv = mm(xn1, false, params[p + 'attn.qkv.weight'], true, 1, N, C, 3 * C);
      const [q, kk, v] = [0, 1, 2].map((part) => { const o = z(N * C); k.splitHeads(qkv, o, part, B, T, H, D, enc); return o; });
      const s = mm(q, false, kk, true, G, T, D, T);
      const pr = z(G * T * T);
      k.causalSoftmax(s, pr, G, T, scale, enc);
      const yh = mm(pr, false, v, false, G, T, T, D);
      const y = z(N * C);
      k.mergeHeads(yh, y, C, 0, B, T, H, D, enc);
      k.add(x, mm(y, false, params[p + 'attn.proj.weight'], true, 1, N, C, C), N * C, enc);
      const [xn2, n2] = norm(x, params[p + 'norm2.weight']);
      const h = mm(xn2, false, params[p + 'mlp.fc.weight'], true, 1, N, C, 4 * C);
      const hr = z(N * 4 * C);
      k.relu(h, hr, N * 4 * C, enc);
      k.add(x, mm(hr, false, params[p + 'mlp.proj.weight'], true, 1, N, 4 * C, C), N * C, enc);
      caches.push({ xn1, n1, q, k: kk, v, pr, y, xn2, n2, h, hr });
    }
    const [xf, nf] = norm(x, params['norm_f.weight']);
    logits = mm(xf, false, params['head.weight'], true, 1, N, C, V);
    const dl = z(N * V);
    lossN = z(N);
    k.crossEntropy(logits, targetBuf, dl, lossN, N, V, enc);
    if (withGrads) {
      submitPart();
      grads = residentBackward(k, params, cfg, { encoder: () => enc, submitPart, z, mm, caches, xf, nf, dl, idxBuf, scale, V });
    }
    if (grads && encode) {
      const total = encode.names.reduce((n, name) => n + grads[name][1], 0);
      const flat = z(total);
      let at = 0;
      for (const name of encode.names) { const [b, n] = grads[name]; enc.copyBufferToBuffer(b, 0, flat, 8 * at, 8 * n); at += n; }
      const words = int8MessageWords(total);
      message = { buffer: step.scratch(4 * words, enc), flags: step.scratch(16, enc), words, bytes: 4 * Math.ceil(total / 256) + total };
      k.int8Encode(flat, message.buffer, message.flags, total, encode.key, 0, enc);
    }
    k.submit([enc.finish()]);
  } catch (e) {                                     // a host-side error while encoding: nothing held stays
    await Promise.all(ERROR_SCOPES.map(() => d.popErrorScope()));
    for (const b of temps) b.destroy();
    step.end();
    throw e;
  }
  const errors = (await Promise.all(ERROR_SCOPES.map(() => d.popErrorScope()))).filter(Boolean);
  if (errors.length) { for (const b of temps) b.destroy(); step.end(); throw new Error(`GPU error in the resident step: ${errors.map((e) => e.message).join('; ')}`); }
  // one read-back: the per-row losses, the flag, and the gradients (training) or the logits
  const named = grads ? Object.entries(grads) : [];
  const tail = message ? [[message.flags, 1], [message.buffer, Math.ceil(message.words / 2)]] : [];
  const audited = audits.map((x) => [x.buffer, x.samples.length * (2 * x.kk + 1)]);
  const got = await k.readMany([[lossN, N], [flags, 1], ...(grads ? named.map(([, bn]) => bn) : [[logits, N * V]]), ...audited, ...tail]);
  for (const b of temps) b.destroy();
  step.end();
  const [ln, fl] = got;
  const out = { loss: treeSum(ln, 0, N) / N, logits: grads ? null : got[2], lossN: ln, nonFinite: new Uint32Array(fl.buffer)[0] !== 0 };
  if (grads) out.grads = Object.fromEntries(named.map(([name], i) => [name, got[2 + i]]));
  const firstAudit = 2 + (grads ? named.length : 1);
  out.audits = audits.map((x, i) => ({ kk: x.kk, samples: x.samples, values: got[firstAudit + i] }));
  if (message) {
    const [mf, mw] = got.slice(-2);
    out.encoded = new Uint32Array(mf.buffer)[0] === 0 ? new Uint8Array(mw.buffer, 0, message.bytes) : null;
  }
  return out;
}

// The elements of one unit call's result that its self-audit checks: the last (a ragged edge's)
// and `count - 1` drawn under (key, call), each with where its row of A and column of B start and
// their strides (the layouts of f64.js spotAudit) -> [{aBase, aStride, bBase, bStride, e}]
export function auditSamples(nb, m, kk, n, transA, transB, auditKey, call, count) {
  const total = nb * m * n, out = [];
  for (let s = 0; s < count && total > 0; s++) {
    const e = s === 0 ? total - 1 : draw(auditKey, call * count + s) % total;
    const bi = Math.floor(e / (m * n)), i = Math.floor(e / n) % m, j = e % n;
    out.push({ aBase: transA ? bi * kk * m + i : bi * m * kk + i * kk, aStride: transA ? m : 1,
      bBase: transB ? bi * n * kk + j * kk : bi * kk * n + j, bStride: transB ? 1 : n, e });
  }
  return out;
}

// A step's unit calls audited: each gathered element recomputed on the host from its gathered row
// and column (units.js unitDot) and compared in all 64 bits -> null, or the first difference
export function checkUnitAudits(audits) {
  const a = new Float64Array(2), bits = new Uint32Array(a.buffer);
  for (const [call, { kk, samples, values }] of audits.entries()) {
    for (const [s, { e }] of samples.entries()) {
      const at = s * (2 * kk + 1);
      a[0] = values[at + 2 * kk];
      a[1] = unitDot(values.subarray(at, at + kk), values.subarray(at + kk, at + 2 * kk), kk);
      if (bits[0] !== bits[2] || bits[1] !== bits[3]) return `unit call ${call + 1}, element ${e}: GPU ${a[0]}, CPU ${a[1]}`;
    }
  }
  return null;
}

// model.js backward on the GPU, encoded after the forward into the same encoder -> {name: [buffer,
// length]} (the gradients stay on the GPU: the step encodes them for the exchange there)
// (encoder(): the part being encoded; submitPart() submits it and starts the next)
function residentBackward(k, params, cfg, { encoder, submitPart, z, mm, caches, xf, nf, dl, idxBuf, scale, V }) {
  const C = cfg.width, H = cfg.heads, L = cfg.layers, B = cfg.batch, T = cfg.seq_len;
  const D = Math.floor(C / H), N = B * T, G = B * H, g = {};
  let enc = encoder();
  const normBack = (dy, w, cache) => { const dx = z(N * C), dg = z(C); k.rmsnormBackward(dy, w, cache.xhat, cache.r, dx, dg, N, C, enc); return [dx, dg]; };
  g['head.weight'] = [mm(dl, true, xf, false, 1, V, N, C), V * C];
  const dxf = mm(dl, false, params['head.weight'], false, 1, N, V, C);
  let [dx, dgf] = normBack(dxf, params['norm_f.weight'], nf);
  g['norm_f.weight'] = [dgf, C];
  for (let l = L - 1; l >= 0; l--) {
    const p = `blocks.${l}.`, c = caches[l];
    g[p + 'mlp.proj.weight'] = [mm(dx, true, c.hr, false, 1, C, N, 4 * C), C * 4 * C];
    const dhr = mm(dx, false, params[p + 'mlp.proj.weight'], false, 1, N, C, 4 * C);
    const dh = z(N * 4 * C);
    k.reluBack(dhr, c.h, dh, N * 4 * C, enc);
    g[p + 'mlp.fc.weight'] = [mm(dh, true, c.xn2, false, 1, 4 * C, N, C), 4 * C * C];
    const dxn2 = mm(dh, false, params[p + 'mlp.fc.weight'], false, 1, N, 4 * C, C);
    let [dxb, dgn] = normBack(dxn2, params[p + 'norm2.weight'], c.n2);
    g[p + 'norm2.weight'] = [dgn, C];
    k.add(dx, dxb, N * C, enc);
    g[p + 'attn.proj.weight'] = [mm(dx, true, c.y, false, 1, C, N, C), C * C];
    const dy = mm(dx, false, params[p + 'attn.proj.weight'], false, 1, N, C, C);
    const dyh = z(N * C);
    k.splitHeads(dy, dyh, 0, B, T, H, D, enc, C);
    const dpr = mm(dyh, false, c.v, true, G, T, D, T);
    const dv = mm(c.pr, true, dyh, false, G, T, T, D);
    const ds = z(G * T * T);
    k.softmaxBackward(dpr, c.pr, ds, G, T, scale, enc);
    const dq = mm(ds, false, c.k, false, G, T, T, D);
    const dk = mm(ds, true, c.q, false, G, T, T, D);
    const dqkv = z(N * 3 * C);
    k.mergeHeads(dq, dqkv, 3 * C, 0, B, T, H, D, enc);
    k.mergeHeads(dk, dqkv, 3 * C, C, B, T, H, D, enc);
    k.mergeHeads(dv, dqkv, 3 * C, 2 * C, B, T, H, D, enc);
    g[p + 'attn.qkv.weight'] = [mm(dqkv, true, c.xn1, false, 1, 3 * C, N, C), 3 * C * C];
    const dxn1 = mm(dqkv, false, params[p + 'attn.qkv.weight'], false, 1, N, 3 * C, C);
    [dxb, dgn] = normBack(dxn1, params[p + 'norm1.weight'], c.n1);
    g[p + 'norm1.weight'] = [dgn, C];
    k.add(dx, dxb, N * C, enc);
    submitPart(); enc = encoder();
  }
  const dwpe = z(T * C);
  k.wpeBackward(dx, dwpe, B, T * C, enc);
  g['wpe.weight'] = [dwpe, T * C];
  const dwte = z(V * C);
  k.embeddingBackward(dx, idxBuf, dwte, V, N, C, enc);
  g['wte.weight'] = [dwte, V * C];
  return g;
}

// A message of the whole flat gradient (grads {name: Float64Array} end to end in `names` order),
// made on the GPU, against the host codec on a few of its blocks: the first, the last and `more`
// drawn ones (a GPU fault that the boot gate missed would show in every block) -> null when they
// agree, else what differs. ~1,000 values encoded on the host instead of the whole gradient.
export function spotCheckMessage(codec, grads, names, message, { seed, step, slot }, more = 2) {
  const total = names.reduce((n, name) => n + grads[name].length, 0), blocks = Math.ceil(total / codec.block);
  if (message.length !== codec.messageBytes(total)) return `${message.length} bytes for ${total} values`;
  const values = (lo, hi) => {                     // the flat gradient's values [lo, hi)
    const out = new Float64Array(hi - lo);
    let at = 0;
    for (const name of names) {
      const g = grads[name], a = Math.max(lo, at), b = Math.min(hi, at + g.length);
      if (a < b) out.set(g.subarray(a - at, b - at), a - lo);
      at += g.length;
    }
    return out;
  };
  const picks = new Set([0, blocks - 1]);
  for (let i = 0; i < more; i++) picks.add(Math.floor(Math.random() * blocks));
  for (const j of picks) {
    const lo = j * codec.block, hi = Math.min(total, lo + codec.block);
    let want;
    try { want = codec.encode(values(lo, hi), { seed, step, slot, offset: lo }); } catch (e) { return `block ${j}: the host codec refuses it (${e.message})`; }
    const got = codec.sliceMessage(message, total, lo, hi);
    const i = want.findIndex((b, n) => b !== got[n]);
    if (i >= 0) return `block ${j}, byte ${i}: GPU ${got[i]}, host ${want[i]}`;
  }
  return null;
}

// A replica trained through the resident step, behind train.js Trainer's interface (Group and the
// run loop call localStep and apply; `backend` is the CPU backend, for whoever recomputes a step
// on the host: audits, a joiner's checks), so a Group of them is the reference's run. Weights and
// Adam's moments live on the GPU (one buffer per tensor); per step the host sends the tokens and
// reads the loss, the gradients and (int8 exchange) the gradient's message encoded on the GPU
// (one read-back: the decode and the reduce are the host's), sends the reduced gradient, and
// reads the weights and moments back (one read-back), then starts the next local step on the GPU
// (same slot) and hashes the weights on the host while it runs; the next localStep takes that
// step if it asks for it on the same weights, else drops it.
// replica.params and replica.adam stay the whole host copy that the run's undo, audits, joins and
// checkpoints read. A host copy changed under the trainer (an undo, a rollback: adam.t or the
// arrays differ from what the GPU holds) is sent up again before the next step. A unit operand
// that held ±inf or NaN (the GPU flags it) makes that local step the CPU's, from the same host
// weights: the same bits. Local steps (cfg.local_steps > 1) are not resident: the registry makes
// a train.js Trainer for them.
// A GPU error (a failed dispatch, a lost device) moves this trainer to the CPU backend for good,
// from the host copy (whole after every step): onFault(reason) tells the registry.
//   new ResidentTrainer({kernels, unit, cfg, replica, batches, cpu, lib, ownKernels, onFault, testFault})   cpu: a backend (engines.js)
// ownKernels: lease from kernels.own() (other trainers of this process step beside this one: a
// Group of several), not from `kernels` itself (a page's one trainer at a time: one pool, reused)
export class ResidentTrainer {
  constructor({ kernels, unit, cfg, replica, batches, cpu, lib, ownKernels = false, onFault = null, testFault = null }) {
    this.ownsKernels = ownKernels;
    this.k = ownKernels ? kernels.own() : kernels;   // the pool, parameter slots and bind groups its steps lease
    this.unit = unit; this.cfg = cfg; this.replica = replica; this.batches = batches;
    this.backend = cpu;                  // the CPU backend (engines.js interface)
    this.lib = lib;                      // {treeSum, NORM_EPS, VOCAB_SIZE, optim, weightHash, lossAndGrads, paramShapes}
    this.w = {}; this.m = {}; this.v = {};
    this.g = {};                         // the reduced gradient's buffers (rewritten every step)
    this.heldT = -1; this.heldParams = null;   // the host state the GPU buffers hold (adam.t, the params object)
    this.cpuSteps = 0;                   // local steps computed on the CPU (a flagged operand, a fault)
    this.fault = null;                   // the GPU error that moved this trainer to the CPU, or null
    this.onFault = onFault;
    this.names = lib.paramShapes(cfg).map(([name]) => name);   // the flat gradient's order (collective.js)
    // The next local step, started on the GPU once Adam's weights are back, so that the GPU runs it
    // while the host hashes the weights and the run does its bookkeeping:
    // {step, slot, t, params (what the GPU's weights are), batch (Promise), run (Promise of
    // residentForward's result, or null when the batch failed)}; taken by the next localStep when
    // it asks for that step of the same weights, else waited out and dropped
    this.ahead = null;
    this.lastSlot = null;                // the slot of the last local step (the next one's guess)
    this.aheadUsed = 0; this.aheadDropped = 0;
    this.unitAudits = 0;                 // unit calls self-audited (unitAuditSamples elements each)
    this.unitAuditSamples = UNIT_AUDIT_SAMPLES;   // per unit call; 0 only in benches (the step timed without its audit)
    this.testFault = testFault;          // tests only: {clearResultOf: unit call} (residentForward's audit)
    this.upload();
  }

  failed(err) {
    this.fault = `${err.message || err}`;
    console.error(`daisy: the resident step failed, the CPU backend goes on: ${this.fault}`);
    this.onFault?.(this.fault);
  }

  // the host replica -> the GPU buffers (made once, rewritten after)
  upload() {
    const r = this.replica, q = this.k.device.queue;
    for (const [name, w] of Object.entries(r.params)) {
      for (const [into, from] of [[this.w, w], [this.m, r.adam.m[name]], [this.v, r.adam.v[name]]]) {
        if (into[name]) q.writeBuffer(into[name], 0, from); else into[name] = this.k.f64(from);
      }
    }
    this.heldT = r.adam.t; this.heldParams = r.params;
  }

  sync() { if (this.replica.adam.t !== this.heldT || this.replica.params !== this.heldParams) this.upload(); }

  // (loss, grads) of this replica on the batch of (seed, step, slot); sink (the streamed
  // exchange) is not fed: the gradients arrive together and the collective sends them whole
  // -> {loss, grads, encoded}: encoded, with the int8 exchange, the gradient's message under this
  // slot's key encoded on the GPU (the collective cuts its GRADs from it instead of encoding them;
  // null where the kernel flagged a value or a spot check of its blocks failed: then the host encodes)
  async localStep(step, slot, arena = undefined) {
    const cfg = this.cfg, L = this.lib;
    this.lastSlot = slot;
    const ahead = await this.takeAhead(step, slot);
    const { x, y } = await (ahead ? ahead.batch.catch(() => this.batches.get(step, slot)) : this.batches.get(step, slot));
    if (!this.fault) {
      try {
        let r = ahead ? await ahead.run : null;          // null: not started ahead, or its batch failed
        if (!r) { this.sync(); r = await this.forward(step, slot, x, y); }
        if (!r.nonFinite) {
          // the unit's self-audit: a wrong element means this GPU cannot be trusted with the run
          // (VERIFICATION.md §9: never sent, never applied): the step is the CPU's, and so is every
          // later one. (Checked here, on the way to the exchange: checked as soon as a step started
          // ahead was back, it saved nothing measurable, TEST_RESULTS "What the unit's self-audit costs".)
          const bad = checkUnitAudits(r.audits);
          this.unitAudits += r.audits.length;
          if (bad) throw new Error(`the unit's self-audit failed: ${bad}`);
          let encoded = r.encoded ?? null;
          const why = encoded && spotCheckMessage(CODECS.int8, r.grads, this.names, encoded, { seed: cfg.seed, step, slot });
          if (why) { console.error(`daisy: the resident step's exchange message failed its spot check, the host encodes it: ${why}`); encoded = null; }
          return { loss: r.loss, grads: r.grads, encoded };
        }
      } catch (e) {
        this.failed(e);
      }
    }
    this.cpuSteps++;
    return L.lossAndGrads(this.replica.params, cfg, x, y, cfg.batch, cfg.seq_len, this.backend, arena);
  }

  // one local step encoded and submitted now (residentForward's synchronous part) on the weights the
  // GPU holds -> Promise of its result
  forward(step, slot, x, y) {
    const encode = this.cfg.exchange === 'int8' ? { names: this.names, key: key(PURPOSE_EXCHANGE, this.cfg.seed, step, slot) } : null;
    const audit = this.unitAuditSamples > 0 ? { key: (key(PURPOSE_AUDIT, this.cfg.seed, step, slot) ^ UNIT_AUDIT_STREAM) >>> 0, samples: this.unitAuditSamples, clearResultOf: this.testFault?.clearResultOf ?? null } : null;
    return residentForward(this.k, this.unit, this.w, this.cfg, x, y, this.lib, true, encode, audit);
  }

  // the next local step on the GPU, submitted as soon as its batch is here (apply calls it before
  // hashing: the same bits as a step started later, from the same weights and batch)
  startAhead(step, slot) {
    const batch = this.batches.get(step, slot);
    const run = batch.then(({ x, y }) => this.forward(step, slot, x, y), () => null);
    batch.catch(() => {}); run.catch(() => {});         // a failure is the taker's (or nobody's: dropped)
    this.ahead = { step, slot, t: this.replica.adam.t, params: this.replica.params, batch, run };
  }

  // the local step started ahead if it is this one: the same step and slot, on the weights the host
  // copy holds now (an undo or a rollback changes adam.t or the arrays: then the GPU's are uploaded
  // again, sync). One that is not is waited out first (its buffers go back to the pool in order).
  async takeAhead(step, slot) {
    const a = this.ahead;
    if (a && !this.fault && a.step === step && a.slot === slot && a.t === this.replica.adam.t && a.params === this.replica.params) {
      this.ahead = null; this.aheadUsed++; return a;
    }
    await this.dropAhead();
    return null;
  }

  // the local step started ahead, if any, waited out and dropped
  async dropAhead() {
    const a = this.ahead;
    if (!a) return;
    this.ahead = null;
    await a.run.catch(() => null);
    this.aheadDropped++;
  }

  // Adam with the group's G on the GPU (one encoder), the weights and moments back -> {step, hash}
  async apply(G) {
    const r = this.replica;
    if (this.fault) {
      this.backend.adamStep(r.params, G, r.adam, this.cfg.lr);
      return { step: r.step, hash: await this.backend.weightHashAsync(r.params) };
    }
    try {
      return await this.applyOnGpu(G);
    } catch (e) {
      this.failed(e);                   // the host copy is untouched until the read-back is done
      return this.apply(G);
    }
  }

  async applyOnGpu(G) {
    await this.dropAhead();               // (none in the loop's order: a local step took it)
    this.sync();
    const { optim, weightHash } = this.lib, r = this.replica, t = r.adam.t + 1, d = this.k.device;
    for (const sc of ERROR_SCOPES) d.pushErrorScope(sc);
    const bc1 = 1.0 - optim.powInt(optim.B1, t), bc2 = 1.0 - optim.powInt(optim.B2, t);
    this.k.holdUniforms();
    try {
      const enc = d.createCommandEncoder(), names = Object.keys(this.w);
      for (const name of names) {
        if (this.g[name]) d.queue.writeBuffer(this.g[name], 0, G[name]); else this.g[name] = this.k.f64(G[name]);
        this.k.adam(this.w[name], this.g[name], this.m[name], this.v[name], G[name].length, optim, this.cfg.lr, bc1, bc2, enc);
      }
      this.k.submit([enc.finish()]);
      const errors = (await Promise.all(ERROR_SCOPES.map(() => d.popErrorScope()))).filter(Boolean);
      if (errors.length) throw new Error(`GPU error in the resident Adam step: ${errors.map((e) => e.message).join('; ')}`);
      // weights and moments straight into the host copy (all of it, or none on a failed map)
      await this.k.readMany(names.flatMap((name) => [[this.w[name], r.params[name]], [this.m[name], r.adam.m[name]], [this.v[name], r.adam.v[name]]]
        .map(([b, into]) => [b, into.length, into])));
    } finally {
      this.k.releaseUniforms();
    }
    r.adam.t = t;
    this.heldT = t;
    // the next step (same slot) runs on the GPU while the host hashes: with WebCrypto's digest
    // (off the main thread) the host encodes it meanwhile too
    if (this.lastSlot !== null && r.step < this.cfg.steps) this.startAhead(r.step, this.lastSlot);
    const hash = this.backend?.weightHashAsync ? await this.backend.weightHashAsync(r.params) : weightHash(r.params);
    return { step: r.step, hash };
  }

  // the GPU buffers freed (the trainer is not used after; a step started ahead fails, unheard)
  destroy() {
    this.ahead = null;
    for (const set of [this.w, this.m, this.v, this.g]) for (const b of Object.values(set)) b.destroy();
    if (this.ownsKernels) this.k.destroy();
  }
}
