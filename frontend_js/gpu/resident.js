// The resident step's kernels (docs/ARCHITECTURE.md "The resident step", docs/VERIFICATION.md
// §9.2): the pieces of model.js and optim.js other than the INT8 unit, in float64 emulated on u32
// words (kernels/f64_lib.wgsl + kernels/f64_rows.wgsl prepended to each kernels/res_*.wgsl), so
// activations, weights and Adam's moments can stay on the GPU for a whole step. Each kernel is the
// JS twin's operations in the JS order; resident_gates.js checks every one against its twin, bit
// for bit, at boot and in the tests.
//   ResidentKernels.create(device, opts) compiles them (opts.texts: file -> text, the bug corpus)
//   k.f64(values) / k.zeros(n) / k.u32(words) / k.read(buffer, n)   buffers in and out
//   k.scratch(bytes, enc) / k.recycle()   a step's temporaries from the pool (cleared in `enc`),
//                         back into it once the step's read-back is done
//   k.uniform(words) / k.holdUniforms() / k.releaseUniforms()   dispatch parameters in 256-byte
//                         slots of a few kept buffers, reused once no step that wrote them is in flight
//   k.<piece>(..., enc?)  one dispatch on GPU buffers, encoded into `enc` (a GPUCommandEncoder)
//                         or submitted at once
// Runs in a browser (kernels fetched relative to gemm_kernel.js) and under Node's `webgpu` package.
import { loadText, compileKernel, ERROR_SCOPES } from './device.js';
import { KERNEL_BASE } from './gemm_kernel.js';

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
});
export const RESIDENT_WG = 64;
const ALIGN = 256;
const UNIFORM_CHUNK = 64 * 1024;    // 256 parameter slots per uniform buffer
const align = (bytes) => Math.ceil(Math.max(bytes, 16) / ALIGN) * ALIGN;
const STORAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

// a float64 as its two u32 words (low, high): how a uniform carries it
const words = (x) => new Uint32Array(new Float64Array([x]).buffer);
// the int8 message of n values as u32 words: per block of 256, 65 words (scale + codes)
export const int8MessageWords = (n) => Math.ceil((4 * Math.ceil(n / 256) + n) / 4);

export class ResidentKernels {
  constructor(device, pipes) {
    this.device = device; this.pipes = pipes;
    this.uniformChunks = [];         // UNIFORM_CHUNK-byte uniform buffers, kept; 256-byte slots
    this.uniformsUsed = 0;           // slots written since they were last free
    this.stepsInFlight = 0;          // steps between holdUniforms() and their releaseUniforms()
    this.pool = new Map();           // size (a power of two) -> free storage buffers of the step's temporaries
    this.lent = [];                  // the temporaries taken since recycle()
    this.reads = new Map();          // size -> free mappable buffers (read-backs)
  }

  // A temporary of at least `bytes`, zeroed by a clear encoded into `enc` (as a fresh buffer is):
  // from the pool, so a step allocates nothing once the shapes have been seen (a buffer's creation
  // and first clear cost more than the clear)
  scratch(bytes, enc) {
    const size = 2 ** Math.ceil(Math.log2(align(bytes)));
    const b = this.pool.get(size)?.pop() || this.device.createBuffer({ size, usage: STORAGE() });
    enc.clearBuffer(b);
    this.lent.push(b);
    return b;
  }
  // every temporary taken since the last recycle back into the pool (after the work that used them)
  recycle() {
    for (const b of this.lent.splice(0)) {
      if (!this.pool.has(b.size)) this.pool.set(b.size, []);
      this.pool.get(b.size).push(b);
    }
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
  // One dispatch's parameters -> its binding {buffer, offset, size}: the next free slot, written
  // now (queue order puts the write before the submit that reads it). A fresh buffer per dispatch
  // (~280 per local step) cost the host several times a write into a kept slot (Dawn).
  uniform(u32s) {
    const data = new Uint32Array(Math.ceil(u32s.length / 4) * 4); data.set(u32s);
    if (data.byteLength > ALIGN) throw new Error(`${data.byteLength} bytes of parameters: a slot holds ${ALIGN}`);
    const per = UNIFORM_CHUNK / ALIGN, i = this.uniformsUsed++, c = Math.floor(i / per);
    if (c === this.uniformChunks.length) this.uniformChunks.push(this.device.createBuffer({ size: UNIFORM_CHUNK, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST }));
    const slot = { buffer: this.uniformChunks[c], offset: (i % per) * ALIGN, size: ALIGN };
    this.device.queue.writeBuffer(slot.buffer, slot.offset, data);
    return slot;
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
      d.queue.submit([enc.finish()]);
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
      d.queue.submit([enc.finish()]);
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

  // one dispatch of `piece` over `groups` workgroups (a count; laid out in 2D under the limit)
  dispatch(piece, buffers, groups, enc = null) {
    const d = this.device, pipe = this.pipes[piece];
    if (!pipe) throw new Error(`resident kernel ${piece} was not compiled`);
    // a buffer whole, or a binding {buffer, offset, size} (a uniform slot)
    const bg = d.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries: buffers.map((b, binding) => ({ binding, resource: b.buffer ? b : { buffer: b } })) });
    const own = !enc, e = enc || d.createCommandEncoder();
    const pass = e.beginComputePass();
    pass.setPipeline(pipe); pass.setBindGroup(0, bg);
    const lim = d.limits.maxComputeWorkgroupsPerDimension, gx = Math.max(1, Math.min(groups, lim));
    pass.dispatchWorkgroups(gx, Math.ceil(groups / gx));
    pass.end();
    if (own) d.queue.submit([e.finish()]);
  }

  // --- the pieces (shapes as model.js; every buffer float64 unless said) ----------------------
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
export async function residentForward(k, unit, params, cfg, idx, targets, { treeSum, NORM_EPS, VOCAB_SIZE }, withGrads = false) {
  const C = cfg.width, H = cfg.heads, L = cfg.layers, V = VOCAB_SIZE, B = cfg.batch, T = cfg.seq_len;
  const D = Math.floor(C / H), N = B * T, G = B * H, scale = 1.0 / Math.sqrt(D);
  const d = k.device, temps = [];
  // an invalid command buffer runs nothing and reads back zeros: every error is caught and thrown
  for (const sc of ERROR_SCOPES) d.pushErrorScope(sc);
  k.holdUniforms();
  // The step is encoded in parts, each submitted when encoded (after the forward pass, after each
  // block's backward), so the GPU runs one part while the host encodes the next; the queue keeps
  // their order, so nothing else changes. `enc` is the part being encoded.
  let enc = d.createCommandEncoder();
  const submitPart = () => { d.queue.submit([enc.finish()]); enc = d.createCommandEncoder(); };
  const z = (n) => k.scratch(n * 8, enc);          // every activation and gradient: the pool's, zeroed
  const flags = k.u32([0, 0, 0, 0]), idxBuf = k.u32(idx), targetBuf = k.u32(targets);
  temps.push(flags, idxBuf, targetBuf);
  const uniform = (words) => { const u = k.uniform(words); return [u.buffer, u.offset, u.size]; };
  const mm = (a, ta, b, tb, nb, M, K, Nn) => {
    const out = z(nb * M * Nn);
    temps.push(...unit.encodeUnit(enc, a, ta, b, tb, nb, M, K, Nn, out, flags, (bytes) => k.scratch(bytes, enc), uniform));
    return out;
  };
  let grads = null, logits, lossN;
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
    d.queue.submit([enc.finish()]);
  } catch (e) {                                     // a host-side error while encoding: nothing held stays
    await Promise.all(ERROR_SCOPES.map(() => d.popErrorScope()));
    for (const b of temps) b.destroy(); k.releaseUniforms(); k.recycle();
    throw e;
  }
  const errors = (await Promise.all(ERROR_SCOPES.map(() => d.popErrorScope()))).filter(Boolean);
  if (errors.length) { for (const b of temps) b.destroy(); k.releaseUniforms(); k.recycle(); throw new Error(`GPU error in the resident step: ${errors.map((e) => e.message).join('; ')}`); }
  // one read-back: the per-row losses, the flag, and the gradients (training) or the logits
  const named = grads ? Object.entries(grads) : [];
  const got = await k.readMany([[lossN, N], [flags, 1], ...(grads ? named.map(([, bn]) => bn) : [[logits, N * V]])]);
  for (const b of temps) b.destroy();
  k.releaseUniforms();
  k.recycle();
  const [ln, fl] = got;
  const out = { loss: treeSum(ln, 0, N) / N, logits: grads ? null : got[2], lossN: ln, nonFinite: new Uint32Array(fl.buffer)[0] !== 0 };
  if (grads) out.grads = Object.fromEntries(named.map(([name], i) => [name, got[2 + i]]));
  return out;
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

// A replica trained through the resident step, behind train.js Trainer's interface (Group and the
// run loop call localStep and apply; `backend` is the CPU backend, for whoever recomputes a step
// on the host: audits, a joiner's checks), so a Group of them is the reference's run. Weights and
// Adam's moments live on the GPU (one buffer per tensor); per step the host sends the tokens and
// reads the loss and the gradients (one read-back: the exchange's codec and reduce are the
// host's), sends the reduced gradient, and reads the weights and moments back (one read-back):
// replica.params and replica.adam stay the whole host copy that the run's undo, audits, joins and
// checkpoints read. A host copy changed under the trainer (an undo, a rollback: adam.t or the
// arrays differ from what the GPU holds) is sent up again before the next step. A unit operand
// that held ±inf or NaN (the GPU flags it) makes that local step the CPU's, from the same host
// weights: the same bits. Local steps (cfg.local_steps > 1) are not resident: the registry makes
// a train.js Trainer for them.
// A GPU error (a failed dispatch, a lost device) moves this trainer to the CPU backend for good,
// from the host copy (whole after every step): onFault(reason) tells the registry.
//   new ResidentTrainer({kernels, unit, cfg, replica, batches, cpu, lib, onFault})   cpu: a backend (engines.js)
export class ResidentTrainer {
  constructor({ kernels, unit, cfg, replica, batches, cpu, lib, onFault = null }) {
    this.k = kernels; this.unit = unit; this.cfg = cfg; this.replica = replica; this.batches = batches;
    this.backend = cpu;                  // the CPU backend (engines.js interface)
    this.lib = lib;                      // {treeSum, NORM_EPS, VOCAB_SIZE, optim, weightHash, lossAndGrads}
    this.w = {}; this.m = {}; this.v = {};
    this.g = {};                         // the reduced gradient's buffers (rewritten every step)
    this.heldT = -1; this.heldParams = null;   // the host state the GPU buffers hold (adam.t, the params object)
    this.cpuSteps = 0;                   // local steps computed on the CPU (a flagged operand, a fault)
    this.fault = null;                   // the GPU error that moved this trainer to the CPU, or null
    this.onFault = onFault;
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
  async localStep(step, slot, arena = undefined) {
    const cfg = this.cfg, { x, y } = await this.batches.get(step, slot), L = this.lib;
    if (!this.fault) {
      try {
        this.sync();
        const r = await residentForward(this.k, this.unit, this.w, cfg, x, y, L, true);
        if (!r.nonFinite) return { loss: r.loss, grads: r.grads };
      } catch (e) {
        this.failed(e);
      }
    }
    this.cpuSteps++;
    return L.lossAndGrads(this.replica.params, cfg, x, y, cfg.batch, cfg.seq_len, this.backend, arena);
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
      d.queue.submit([enc.finish()]);
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
    const hash = this.backend?.weightHashAsync ? await this.backend.weightHashAsync(r.params) : weightHash(r.params);
    return { step: r.step, hash };
  }

  // the GPU buffers freed (the trainer is not used after)
  destroy() { for (const set of [this.w, this.m, this.v, this.g]) for (const b of Object.values(set)) b.destroy(); }
}
