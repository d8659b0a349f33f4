// The whole INT8 unit on the GPU (docs/VERIFICATION.md §4, §9.1): float64 emulated with u32
// integer operations in WGSL (kernels/f64_lib.wgsl), so the quantizers and the epilogue run
// there with the bits of units.js, and one qmatmulT is ONE submit (quantize A, quantize B, the
// integer GEMM, the epilogue: four dispatches) and ONE read-back of the float64 result.
//   GpuF64Unit.create(device, opts)  compiles the kernels (kernels/f64_ops, unit_quant,
//                                     unit_epilogue with the library prepended; gemm_int8 with a dot4)
//   unitPlan(nb, m, kk, n, transA, transB, tuning, opts)
//                                  -> the four dispatches' parameters and workgroup counts (pure):
//                                     quantThreads(K) threads per quantized row, gemmSplits K-slices
//                                     (unit.planOpts is its opts: the profile's other layout)
//   unit.qmatmulT(a, transA, b, transB, batch, M, K, N, out)
//                                  -> Float64Array (batch, M, N), units.qmatmulT's contract, or
//                                     null when an operand holds ±inf or NaN (the caller then
//                                     computes the call on the CPU: JS's NaN handling is not
//                                     emulated)
//   unit.ops(op, a, b)             -> Uint32Array: one emulated operation per element (gates, tests)
//   gateF64(unit)                  -> { ok, reason, cases }: every operation and the unit against
//                                     JS float64 and units.js, bit for bit, on edge cases and a
//                                     deterministic random sweep; a 1-ULP error fails it
//   spotAudit(...)                 -> null or a reason: sampled elements of a result recomputed on
//                                     the CPU (the engine audits every call with it)
// Runs in a browser (kernels fetched relative to this file) and under Node's `webgpu` package.
import { MAX_K, cpuEngine, qmatmulT as unitQmatmulT, unitDot } from '../units.js';
import { rint } from '../detmath.js';
import { draw } from '../prng.js';
import { ERROR_SCOPES, loadText, bindLayout, compileKernel as compile } from './device.js';
import { KERNEL_BASE, GEMM_BODY, gemmSource } from './gemm_kernel.js';


export const F64_LIB = 'f64_lib.wgsl';
export const OPS = Object.freeze({ mul: 0, div: 1, add: 2, sub: 3, sqrt: 4, fromI32: 5, rintClamp127: 6 });
// Tile of the GEMM kernels (kernels/gemm_*.wgsl override constants); the H200 bench passes 16x16, 8x8.
export const DEFAULT_GEMM_TUNING = { WG_X: 8, WG_Y: 8, RM: 4, RN: 4, TK: 4 };

const ALIGN = 256;
const align = (bytes) => Math.ceil(Math.max(bytes, 16) / ALIGN) * ALIGN;

export class GpuF64Unit {
  constructor(device, pipes, tuning, names) {
    this.device = device; this.pipes = pipes; this.tuning = tuning; this.names = names;
    this.slot = null;            // buffers of the last call, reused while big enough
    this.stats = { calls: 0, submits: 0, nonFinite: 0 };
    this.reads = {};             // free mappable buffers by size
    this.stages = {};            // free staging buffers (mapped for writing) by size
    this.upload = 'staging';     // or 'write': queue.writeBuffer (the bench compares them)
    this.profile = null;         // { upload, compute, readback, host } ms: time the phases apart
    this.planOpts = {};          // unitPlan's opts (the profile compares { maxSplits: 1, threads: 64 })
  }

  // opts: kernelBase, lib (the library file), gemm (the GEMM's dot4 file, gemm_kernel.js
  // GEMM_KERNELS: 'dot4_packed.wgsl' where the WGSL language feature
  // packed_4x8_integer_dot_product exists, else 'dot4_portable.wgsl'), tuning (the GEMM's tile);
  // quant, epilogue, gemmBody: the unit's kernel files (the bug corpus swaps one of these or lib)
  static async create(device, { kernelBase = KERNEL_BASE, lib = F64_LIB, gemm = 'dot4_portable.wgsl', tuning = {},
    quant = 'unit_quant.wgsl', epilogue = 'unit_epilogue.wgsl', gemmBody = GEMM_BODY } = {}) {
    const libText = await loadText(new URL(lib, kernelBase));
    const withLib = async (file, constants = {}) => compile(device, `${libText}\n${await loadText(new URL(file, kernelBase))}`, constants, `${file} + ${lib}`);
    const t = { ...DEFAULT_GEMM_TUNING, ...tuning };
    const [ops, q, epi, mm] = await Promise.all([withLib('f64_ops.wgsl'), withLib(quant), withLib(epilogue),
      compile(device, await gemmSource(gemm, kernelBase, gemmBody), t, `${gemm} + ${gemmBody}`)]);
    return new GpuF64Unit(device, { ops, quant: q, epi, mm }, t, { lib, gemm });
  }

  buffer(bytes, usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST) {
    return this.device.createBuffer({ size: align(bytes), usage });
  }

  bind(pipe, buffers) {
    return this.device.createBindGroup({ layout: bindLayout(pipe),
      entries: buffers.map(([buffer, offset, size], binding) => ({ binding, resource: { buffer, offset, size } })) });
  }

  // A mappable buffer of at least `bytes`, from a pool (allocating and clearing a new one per
  // call costs more than the copy); back into the pool after unmap.
  takeRead(bytes) {
    const size = 2 ** Math.ceil(Math.log2(align(bytes)));
    const free = (this.reads[size] ||= []);
    return free.pop() || this.buffer(size, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST);
  }

  // A staging buffer (MAP_WRITE | COPY_SRC) of at least `bytes`, already mapped: from the pool,
  // whose buffers stay resident (a large queue.writeBuffer stages through fresh memory each time)
  takeStage(bytes) {
    const size = 2 ** Math.ceil(Math.log2(align(bytes)));
    const free = (this.stages[size] ||= []);
    return free.pop() || this.device.createBuffer({ size, usage: GPUBufferUsage.MAP_WRITE | GPUBufferUsage.COPY_SRC, mappedAtCreation: true });
  }

  // back into the pool once the submit that copies from it is done and it is mapped again
  returnStage(stage) {
    stage.mapAsync(GPUMapMode.WRITE).then(() => { if (this.stages[stage.size]) this.stages[stage.size].push(stage); else stage.destroy(); }, () => stage.destroy());
  }

  // Runs encode(pass) in one submit with a copy of `bytes` of src (from srcOffset) into a
  // mappable buffer; consume(ArrayBuffer of the mapped range) runs before it is unmapped.
  // With this.profile ({ upload, compute, readback, host } ms), the compute waits on its own
  // submit first, so the phases are timed apart (a profile, not the fast path).
  async submitRead(encode, src, bytes, srcOffset, consume, pre = null) {
    const d = this.device, prof = this.profile;
    const read = this.takeRead(bytes);
    let ok = false;
    try {
      for (const s of ERROR_SCOPES) d.pushErrorScope(s);
      let enc = d.createCommandEncoder();
      if (pre) pre(enc);
      const pass = enc.beginComputePass();
      encode(pass);
      pass.end();
      let t = performance.now();
      if (prof) {
        d.queue.submit([enc.finish()]);
        await d.queue.onSubmittedWorkDone();
        prof.compute += performance.now() - t; t = performance.now();
        enc = d.createCommandEncoder();
      }
      enc.copyBufferToBuffer(src, srcOffset, read, 0, align(bytes));
      d.queue.submit([enc.finish()]);
      this.stats.submits++;
      const pops = ERROR_SCOPES.map(() => d.popErrorScope());
      const mapped = read.mapAsync(GPUMapMode.READ, 0, align(bytes)).then(() => null, (e) => e || new Error('mapAsync failed'));
      const [errs, mapErr] = await Promise.all([Promise.all(pops), mapped]);
      const msgs = errs.filter(Boolean).map((e) => e.message);
      if (msgs.length) { if (!mapErr) read.unmap(); throw new Error(`GPU error: ${msgs.join('; ')}`); }
      if (mapErr) throw mapErr;
      if (prof) { prof.readback += performance.now() - t; t = performance.now(); }
      const result = consume(read.getMappedRange(0, align(bytes)));
      read.unmap();
      if (prof) prof.host += performance.now() - t;
      ok = true;
      return result;
    } finally {
      if (ok) this.reads[read.size].push(read); else read.destroy();
    }
  }

  // op: OPS.*; a, b: Uint32Array of (low, high) word pairs, n = a.length / 2 -> Uint32Array pairs
  async ops(op, a, b) {
    const n = a.length / 2, bytes = n * 8, d = this.device;
    const bufA = this.buffer(bytes), bufB = this.buffer(bytes), out = this.buffer(bytes), params = this.buffer(16, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
    try {
      d.queue.writeBuffer(bufA, 0, a); d.queue.writeBuffer(bufB, 0, b);
      d.queue.writeBuffer(params, 0, new Uint32Array([n, op, 0, 0]));
      const bg = this.bind(this.pipes.ops, [[bufA, 0, align(bytes)], [bufB, 0, align(bytes)], [out, 0, align(bytes)], [params, 0, 16]]);
      const groups = Math.ceil(n / 64), gx = Math.min(groups, 32768);
      return await this.submitRead((pass) => {
        pass.setPipeline(this.pipes.ops); pass.setBindGroup(0, bg); pass.dispatchWorkgroups(gx, Math.ceil(groups / gx));
      }, out, bytes, 0, (mapped) => new Uint32Array(mapped.slice(0, bytes)));
    } finally {
      for (const buf of [bufA, bufB, out, params]) buf.destroy();
    }
  }

  // Buffers for one call, grown (powers of two) and reused. WebGPU tracks usage per buffer, so a
  // buffer a dispatch writes holds nothing else that dispatch binds: inputs (A, B floats), codes
  // (A, B words), scales (sA, sB), c (int32 accumulators), out (the float64 result, then the
  // flags word). -> { name: [buffer, offset, bytes] } for each part
  takeSlot(parts) {
    this.slot ||= { params: this.buffer(4 * ALIGN, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST) };
    const at = {};
    for (const [buf, list] of Object.entries(parts)) {
      let total = 0;
      for (const [k, v] of list) { at[k] = [buf, total, align(v)]; total += align(v); }
      if (!this.slot[buf] || this.slot[buf].size < total) {
        if (this.slot[buf]) this.slot[buf].destroy();
        this.slot[buf] = this.buffer(2 ** Math.ceil(Math.log2(total)));
      }
    }
    for (const k of Object.keys(at)) at[k][0] = this.slot[at[k][0]];
    return at;
  }

  // Whether a call's dispatches fit the device's workgroup-count limit: quantizers (rows, batch),
  // epilogue (outputs / 256, batch)
  fits(nb, m, n) {
    const lim = this.device.limits.maxComputeWorkgroupsPerDimension;
    return Math.max(nb, m, n, Math.ceil((m * n) / 256)) <= lim;
  }

  // units.qmatmulT's contract, every step on the GPU. -> Float64Array, or null (non-finite input)
  async qmatmulT(a, transA, b, transB, nb, m, kk, n, out = undefined) {
    if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
    if (a.length !== nb * m * kk || b.length !== nb * kk * n) throw new Error(`qmatmulT: operands of ${a.length} and ${b.length} values do not fit (batch, M, K, N) = (${nb}, ${m}, ${kk}, ${n})`);
    this.stats.calls++;
    const d = this.device, k4 = Math.ceil(kk / 4), prof = this.profile, t0 = performance.now();
    const plan = unitPlan(nb, m, kk, n, transA, transB, this.tuning, this.planOpts);
    const o = this.takeSlot({ inputs: [['xa', a.length * 8], ['xb', b.length * 8]], codes: [['qa', nb * m * k4 * 4], ['qb', nb * n * k4 * 4]],
      scales: [['sa', nb * m * 8], ['sb', nb * n * 8]], c: [['c', plan.splits * nb * m * n * 4]], out: [['out', nb * m * n * 8], ['flags', 16]] });
    const { params } = this.slot, at = (k) => o[k];
    let pre = null, stage = null;
    if (this.upload === 'staging') {           // both operands at their offsets in `inputs`
      const bytes = o.xb[1] + o.xb[2];
      stage = this.takeStage(bytes);
      const mapped = new Float64Array(stage.getMappedRange(0, bytes));
      mapped.set(a, o.xa[1] / 8); mapped.set(b, o.xb[1] / 8);
      stage.unmap();
      pre = (enc) => enc.copyBufferToBuffer(stage, 0, o.xa[0], 0, bytes);
      if (prof) { const enc = d.createCommandEncoder(); pre(enc); d.queue.submit([enc.finish()]); pre = null; }
    } else {
      d.queue.writeBuffer(o.xa[0], o.xa[1], a);
      d.queue.writeBuffer(o.xb[0], o.xb[1], b);
    }
    d.queue.writeBuffer(o.flags[0], o.flags[1], new Uint32Array(4));
    if (prof) { await d.queue.onSubmittedWorkDone(); prof.upload += performance.now() - t0; }
    const words = new Uint32Array(4 * ALIGN / 4);
    words.set(plan.quantA.params, 0); words.set(plan.quantB.params, ALIGN / 4);
    words.set(plan.mm.params, 2 * ALIGN / 4); words.set(plan.epi.params, 3 * ALIGN / 4);
    d.queue.writeBuffer(params, 0, words);
    const p = this.pipes, prm = (i) => [params, i * ALIGN, 32];
    const bgQA = this.bind(p.quant, [at('xa'), at('qa'), at('sa'), at('flags'), prm(0)]);
    const bgQB = this.bind(p.quant, [at('xb'), at('qb'), at('sb'), at('flags'), prm(1)]);
    const bgMM = this.bind(p.mm, [at('qa'), at('qb'), at('c'), prm(2)]);
    const bgEp = this.bind(p.epi, [at('c'), at('sa'), at('sb'), at('out'), [params, 3 * ALIGN, 16]]);
    // the result and the flags word come back in one copy (flags follow out in one buffer)
    const got = await this.submitRead((pass) => encodePlan(pass, p, plan, [bgQA, bgQB, bgMM, bgEp]), o.out[0], o.flags[1] + 16, o.out[1], (mapped) => {
      if (new Uint32Array(mapped, o.flags[1], 1)[0] !== 0) return null;
      const result = new Float64Array(mapped, 0, nb * m * n);      // copied out before unmap
      return out ? (out.set(result), out) : result.slice();
    }, pre).finally(() => { if (stage) this.returnStage(stage); });
    if (!got) this.stats.nonFinite++;
    return got;
  }

  // The unit on GPU buffers (the resident step, gpu/resident.js): units.qmatmulT's contract with
  // the operands read from `xa` and `xb` (float64 storage buffers, each operand at offset 0, laid
  // out as qmatmulT's a and b) and the result written into `out` (batch, M, N); encoded into `enc`
  // (no submit, nothing read back). Non-finite operands set flags[0] (a storage buffer of one
  // u32 the caller zeroed and reads once per step: then the step is the CPU's). scratch(bytes):
  // where the codes, scales and accumulators come from (the resident step's pool, zeroed; default
  // fresh buffers, returned); uniform(words): where the four dispatches' parameters go, -> [buffer,
  // offset, size] (the resident step's slots; default fresh buffers, returned); bind(pipe,
  // entries): where the bind groups come from (the resident step's cache; default made here).
  // -> the call's fresh temporary buffers, for the caller to destroy once its submit is done.
  encodeUnit(enc, xa, transA, xb, transB, nb, m, kk, n, out, flags, scratch = null, uniform = null, bind = null) {
    if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
    const k4 = Math.ceil(kk / 4), d = this.device, p = this.pipes;
    const plan = unitPlan(nb, m, kk, n, transA, transB, this.tuning, this.planOpts);
    const temps = [];
    const own = scratch || ((bytes) => { const b = this.buffer(bytes); temps.push(b); return b; });
    const qa = own(nb * m * k4 * 4), qb = own(nb * n * k4 * 4), sa = own(nb * m * 8), sb = own(nb * n * 8), c = own(plan.splits * nb * m * n * 4);
    const uni = uniform || ((words) => { const b = this.buffer(ALIGN, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST); d.queue.writeBuffer(b, 0, new Uint32Array(words)); temps.push(b); return [b, 0, ALIGN]; });
    const whole = (buf) => [buf, 0, buf.size];
    const bgOf = bind || ((pipe, entries) => this.bind(pipe, entries));
    const bgQA = bgOf(p.quant, [whole(xa), whole(qa), whole(sa), whole(flags), uni(plan.quantA.params)]);
    const bgQB = bgOf(p.quant, [whole(xb), whole(qb), whole(sb), whole(flags), uni(plan.quantB.params)]);
    const bgMM = bgOf(p.mm, [whole(qa), whole(qb), whole(c), uni(plan.mm.params)]);
    const bgEp = bgOf(p.epi, [whole(c), whole(sa), whole(sb), whole(out), uni(plan.epi.params)]);
    const pass = enc.beginComputePass();
    encodePlan(pass, p, plan, [bgQA, bgQB, bgMM, bgEp]);
    pass.end();
    return temps;
  }

  destroy() {
    for (const b of Object.values(this.slot || {})) b.destroy();
    for (const pool of [this.reads, this.stages]) for (const list of Object.values(pool)) for (const b of list) b.destroy();
    this.reads = {}; this.stages = {};
    this.slot = null;
  }
}

// --- the plan of one call (pure) --------------------------------------------------------------

// Threads per quantized row of K values: a power of two from 4 to 64 (the workgroup), about one
// code word of four values per thread, so short rows share a workgroup (kernels/unit_quant.wgsl)
export function quantThreads(kk) {
  let t = 4;
  while (t < 64 && t * 4 < kk) t *= 2;
  return t;
}

// K-slices of the unit's GEMM (kernels/gemm_int8.wgsl's split-K): doubled while the output's tiles (across
// the batch) give fewer than 256 workgroups and each slice keeps at least 64 K words, at most 16.
// The weight gradients at the largest settings (K = 4096, 128 x 128 .. 512 x 128): 4 to 16.
export function gemmSplits(tiles, k4, maxSplits = 16) {
  let s = 1;
  while (s < maxSplits && tiles * s < 256 && k4 >= 128 * s) s *= 2;
  return s;
}

// One call's four dispatches: each one's parameter words (the kernels' Params) and workgroups.
// Quantizer rows: A's logical row i, B's logical column j, through strides of the stored layout
// (R, K, K4, rowStride, kStride, batchStride, threads per row, 0). opts: maxSplits (at most 16),
// threads (per quantized row, a power of two up to 64, instead of quantThreads): a profile's
// { maxSplits: 1, threads: 64 } is the dispatch layout before issue 26's second pass (same bits).
export function unitPlan(nb, m, kk, n, transA, transB, tuning, { maxSplits = 16, threads = null } = {}) {
  const k4 = Math.ceil(kk / 4), tpr = threads ?? quantThreads(kk), rows = 64 / tpr;
  const qA = transA ? [m, kk, k4, 1, m, kk * m] : [m, kk, k4, kk, 1, m * kk];
  const qB = transB ? [n, kk, k4, kk, 1, n * kk] : [n, kk, k4, 1, n, kk * n];
  const gx = Math.ceil(n / (tuning.WG_X * tuning.RN)), gy = Math.ceil(m / (tuning.WG_Y * tuning.RM));
  const splits = gemmSplits(gx * gy * nb, k4, maxSplits);
  return {
    splits,
    quantA: { params: [...qA, tpr, 0], groups: [Math.ceil(m / rows), nb] },
    quantB: { params: [...qB, tpr, 0], groups: [Math.ceil(n / rows), nb] },
    mm: { params: [m, n, k4, nb, splits, 0, 0, 0], groups: [gx, gy, nb * splits] },
    epi: { params: [m, n, splits, nb * m * n], groups: [Math.ceil((m * n) / 256), nb] },
  };
}

// the plan's dispatches into one compute pass; bind groups [quantA, quantB, mm, epi]
function encodePlan(pass, pipes, plan, [bgQA, bgQB, bgMM, bgEp]) {
  pass.setPipeline(pipes.quant);
  pass.setBindGroup(0, bgQA); pass.dispatchWorkgroups(...plan.quantA.groups);
  pass.setBindGroup(0, bgQB); pass.dispatchWorkgroups(...plan.quantB.groups);
  pass.setPipeline(pipes.mm); pass.setBindGroup(0, bgMM); pass.dispatchWorkgroups(...plan.mm.groups);
  pass.setPipeline(pipes.epi); pass.setBindGroup(0, bgEp); pass.dispatchWorkgroups(...plan.epi.groups);
}

// --- the gate ---------------------------------------------------------------------------------

// xorshift32: the gate's inputs are the same on every boot
function rng(seed) {
  let s = seed >>> 0 || 1;
  return () => { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s; };
}
const f64Of = (lo, hi) => new Float64Array(new Uint32Array([lo, hi]).buffer)[0];
const hex = (lo, hi) => `0x${(hi >>> 0).toString(16).padStart(8, '0')}${(lo >>> 0).toString(16).padStart(8, '0')}`;
const show = (x) => { const w = new Uint32Array(new Float64Array([x]).buffer); return `${x} (${hex(w[0], w[1])})`; };

// Operand pairs [a, b] per operation: edges (zeros of both signs, subnormals, the largest and
// smallest normals, ties, carries out of the significand, exponent boundaries) and a random
// sweep of `random` pairs over the whole range and over the unit's own ranges.
export function f64Cases(random = 2048, seed = 0x5eed64) {
  const r = rng(seed), u = () => r() / 2 ** 32;
  const rand = () => f64Of(r(), r());                                   // any bits (NaN and inf included)
  const finite = () => { let x; do x = rand(); while (!Number.isFinite(x)); return x; };
  const odd27 = () => ((r() >>> 5) | 1) * (u() < 0.5 ? -1 : 1);         // products of two: ties
  const pow2 = (e) => 2 ** e;
  const scaled = () => (r() / 2 ** 32 + 1) * pow2(((r() % 200) | 0) - 100) * (u() < 0.5 ? -1 : 1);
  const edges = [0, -0, 1, -1, 2, 0.5, 127, 1 / 3, 2 ** -1074, -(2 ** -1074), 2 ** -1022, 2 ** -1022 - 2 ** -1074,
    Number.MAX_VALUE, -Number.MAX_VALUE, 2 ** 1023, 1 + 2 ** -52, 2 - 2 ** -52, 2 ** -60, 2 ** -67, 1e-300, 1e300,
    Infinity, -Infinity, NaN];
  const pairs = { mul: [], div: [], add: [], sub: [], sqrt: [], fromI32: [], rintClamp127: [] };
  for (const x of edges) for (const y of edges) { pairs.mul.push([x, y]); pairs.div.push([x, y]); pairs.add.push([x, y]); pairs.sub.push([x, y]); }
  for (const x of edges) pairs.sqrt.push([x, 0]);
  for (let i = 0; i < random; i++) {
    pairs.mul.push([finite(), finite()], [odd27() * pow2((r() % 120) - 60), odd27() * pow2((r() % 120) - 60)],
      [odd27() * 2 ** -540, odd27() * 2 ** -540], [scaled(), scaled()], [(r() | 0), scaled() / 127]);
    // the epilogue: float64(acc) × sA, then × sB with sA, sB >= 2^-60 / 127
    const s1 = Math.max(Math.abs(scaled()), 2 ** -60) / 127;
    pairs.mul.push([((r() | 0) % 66064385) * s1, Math.max(Math.abs(scaled()), 2 ** -60) / 127]);
    pairs.div.push([finite(), finite()], [scaled(), scaled()], [odd27() * 2 ** -1040, 2 ** ((r() % 30) + 1)],
      [(u() * 2 - 1) * 3, 3], [finite(), 127]);
    // the quantizer: x / s with s = max|x| / 127, x near the half-way points of the grid
    const amax = Math.abs(scaled()), sc = amax / 127, k = (r() % 255) - 127;
    pairs.div.push([(k + 0.5) * sc, sc], [k * sc, sc], [Math.min(amax, Math.abs((k + u()) * sc)), sc], [amax, 127]);
    const x = finite(), e = ((r() % 8) | 0);
    pairs.add.push([finite(), finite()], [scaled(), scaled()], [x, -x * (1 + 2 ** -52 * (r() % 4))], [x, x * 2 ** -(r() % 70)],
      [odd27() * 2 ** -1074, odd27() * 2 ** -1074], [odd27() * 2 ** e, odd27() * 2 ** (e - 30)]);
    pairs.sub.push([finite(), finite()], [scaled(), scaled()], [x, x * (1 + 2 ** -52 * (r() % 4))], [x, x * 2 ** -(r() % 70)],
      [odd27() * 2 ** -1074, odd27() * 2 ** -1074], [1, 2 ** -(r() % 64)]);
    pairs.sqrt.push([Math.abs(finite()), 0], [Math.abs(scaled()), 0], [(r() >>> 6) ** 2 * pow2(2 * ((r() % 100) - 50)), 0], [2 ** -1074 * (r() >>> 8), 0]);
    pairs.fromI32.push([f64Of(r(), 0), 0]);
    pairs.rintClamp127.push([(u() * 2 - 1) * 260, 0], [((r() % 512) - 256) / 2, 0], [finite(), 0], [((r() % 256) - 128) + 0.5 * (1 - 2 ** -52), 0]);
  }
  for (const v of [0, 1, -1, 2 ** 31 - 1, -(2 ** 31), 255, -256, 66064384, -66064384]) pairs.fromI32.push([f64Of(v >>> 0, 0), 0]);
  for (let k = -130; k <= 130; k++) for (const d of [0, 0.5, -0.5, 0.25, 0.5 - 2 ** -45, 0.5 + 2 ** -44]) pairs.rintClamp127.push([k + d, 0]);
  for (const x of [0, -0, 2 ** -1074, 0.5, -0.5, 1.5, 2.5, 126.5, 127.5, -127.5, 128, 1e300, Infinity, -Infinity]) pairs.rintClamp127.push([x, 0]);
  return pairs;
}

// The JS float64 result of op on (x, y): the bits every CPU gives (§1)
function expected(op, x, y, yLo) {
  switch (op) {
    case 'mul': return x * y;
    case 'div': return x / y;
    case 'add': return x + y;
    case 'sub': return x - y;
    case 'sqrt': return Math.sqrt(x);
    case 'fromI32': return yLo | 0;
    case 'rintClamp127': { const v = rint(x); return v > 127 ? 127 : v < -127 ? -127 : v; }
    default: throw new Error(`unknown op ${op}`);
  }
}

// Every op on its cases -> [{ name, ok, n, reason }]; a NaN result must be NaN (any payload),
// everything else equal in all 64 bits (so -0 != +0 and 1 ULP fails)
export async function gateF64Ops(unit, { random = 2048, seed = undefined } = {}) {
  const cases = [];
  for (const [op, list] of Object.entries(f64Cases(random, seed))) {
    const a = new Float64Array(list.map((p) => p[0])), b = new Float64Array(list.map((p) => p[1]));
    const aw = new Uint32Array(a.buffer), bw = new Uint32Array(b.buffer);
    const got = await unit.ops(OPS[op], aw, bw);
    let reason = null;
    for (let i = 0; i < list.length && !reason; i++) {
      const [glo, ghi] = [got[2 * i], got[2 * i + 1]];
      if (op === 'rintClamp127') {
        const want = expected(op, a[i]), g = glo | 0;
        if (!Number.isNaN(a[i]) && g !== (want | 0)) reason = `rintClamp127 #${i} of ${show(a[i])}: GPU ${g}, CPU ${want}`;
        continue;
      }
      const want = expected(op, a[i], b[i], aw[2 * i]);
      const ww = new Uint32Array(new Float64Array([want]).buffer);
      const ok = Number.isNaN(want) ? Number.isNaN(f64Of(glo, ghi)) : glo === ww[0] && ghi === ww[1];
      if (!ok) {
        const args = op === 'fromI32' ? `${aw[2 * i] | 0}` : op === 'sqrt' ? show(a[i]) : `${show(a[i])}, ${show(b[i])}`;
        reason = `${op} #${i} of (${args}): GPU ${show(f64Of(glo, ghi))}, CPU ${show(want)}`;
      }
    }
    cases.push({ name: `op ${op}`, ok: !reason, n: list.length, reason });
  }
  return cases;
}

// units.qmatmulT shapes for the gate: transposes, ragged K (not a multiple of 4), rows of
// zeros (the scale floor), values spanning exponents, a huge row, subnormals, K = 4096 at ±max
export function unitGateCases(seed = 0xfa57) {
  const r = rng(seed), u = () => r() / 2 ** 32;
  const fill = (len, kind, rowLen) => {
    const x = new Float64Array(len);
    if (kind === 'ties') {
      // rows of K: the row's max first (so its scale s = max / 127 is known), then values whose
      // quotient by s is a half-integer (k + 1/2) s or one ULP either side of it: the codes where
      // the quantizer's float32 estimate cannot decide and the exact division must
      const up = (v, dir) => { const w = new BigInt64Array(new Float64Array([v]).buffer); w[0] += BigInt(dir * Math.sign(v) || dir); return new Float64Array(w.buffer)[0]; };
      for (let o = 0; o < len; o += rowLen) {
        const amax = 1 + ((o / rowLen) % 5) * 0.37 + (o / rowLen) * 2 ** -30, s = amax / 127;
        x[o] = (o / rowLen) % 2 ? -amax : amax;
        for (let i = 1; i < rowLen && o + i < len; i++) {
          const tie = ((i * 37) % 254 - 127 + 0.5) * s;
          x[o + i] = i % 3 === 0 ? tie : up(tie, i % 3 === 1 ? 1 : -1);
        }
      }
      return x;
    }
    for (let i = 0; i < len; i++) {
      x[i] = kind === 'wide' ? (u() * 2 - 1) * 2 ** ((r() % 80) - 40)
        : kind === 'tiny' ? (u() * 2 - 1) * 2 ** -1060
          : kind === 'max' ? ((i ^ (i >> 3)) & 1 ? -1 : 1) * 3.5
            : kind === 'zeros' ? (i % 7 === 0 ? 0 : -0)
              : kind === 'huge' ? (u() * 2 - 1) * 1e300 : (u() * 2 - 1);
    }
    return x;
  };
  const cases = [];
  const add = (name, nb, m, kk, n, ta, tb, ka = 'rand', kb = 'rand') => cases.push({ name, nb, m, kk, n, ta, tb, a: fill(nb * m * kk, ka, kk), b: fill(nb * kk * n, kb, kk) });
  add('1x1x1', 1, 1, 1, 1, false, false);
  add('ragged 5x7x9', 1, 5, 7, 9, false, false);
  add('ragged transA', 2, 7, 13, 5, true, false);
  add('ragged transB', 2, 9, 6, 11, false, true);
  add('both transposed', 3, 6, 10, 7, true, true);
  add('wide exponents', 1, 17, 33, 19, false, true, 'wide', 'wide');
  add('subnormal rows (floor)', 1, 4, 12, 6, false, false, 'tiny', 'rand');
  add('zeros of both signs', 1, 5, 9, 3, false, false, 'zeros', 'zeros');
  add('huge values', 1, 6, 8, 5, false, true, 'huge', 'huge');
  add('K = 4096 at +-max', 1, 3, 4096, 5, false, false, 'max', 'max');
  add('tile edges 33x70x40', 2, 33, 70, 40, false, false);
  add('quantizer ties (short rows)', 3, 21, 16, 5, false, true, 'ties', 'ties');
  add('quantizer ties (long rows)', 1, 9, 300, 4, false, true, 'ties', 'rand');
  add('split-K ragged 40x1030x33', 2, 40, 1030, 33, false, false);
  return cases;
}

const bitsEqual = (x, y) => {
  const a = new Uint32Array(x.buffer, x.byteOffset, x.length * 2), b = new Uint32Array(y.buffer, y.byteOffset, y.length * 2);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i >> 1;
  return -1;
};

// The unit on the gate's shapes against units.qmatmulT with the CPU engine -> [{ name, ok, reason }]
export async function gateF64Unit(unit) {
  const cases = [];
  for (const c of unitGateCases()) {
    const want = await unitQmatmulT(cpuEngine, c.a, c.ta, c.b, c.tb, c.nb, c.m, c.kk, c.n);
    const got = await unit.qmatmulT(c.a, c.ta, c.b, c.tb, c.nb, c.m, c.kk, c.n);
    let reason = null;
    if (!got) reason = 'the GPU flagged finite operands as non-finite';
    else {
      const i = bitsEqual(got, want);
      if (i >= 0) reason = `element ${i} (batch ${Math.floor(i / (c.m * c.n))}, row ${Math.floor(i / c.n) % c.m}, col ${i % c.n}): GPU ${show(got[i])}, CPU ${show(want[i])}`;
    }
    cases.push({ name: `unit ${c.name}`, ok: !reason, reason });
  }
  // an inf operand must come back flagged (null), never as numbers
  const inf = new Float64Array(12).fill(1); inf[5] = Infinity;
  const flagged = await unit.qmatmulT(inf, false, new Float64Array(12).fill(0.5), false, 1, 3, 4, 3);
  cases.push({ name: 'unit non-finite operand flagged', ok: flagged === null, reason: flagged === null ? null : 'an inf operand was not flagged' });
  return cases;
}

// The boot gate: every emulated operation, then the unit -> { ok, reason, cases }
export async function gateF64(unit, opts = {}) {
  let cases;
  try {
    cases = [...await gateF64Ops(unit, opts), ...await gateF64Unit(unit)];
  } catch (e) {
    return { ok: false, reason: `the f64 gate threw: ${e.message}`, cases: [] };
  }
  const bad = cases.find((c) => !c.ok);
  return { ok: !bad, reason: bad ? `${bad.name}: ${bad.reason}` : null, cases };
}

// --- the audit of every call ----------------------------------------------------------------

// Spot audit of one unit result (the codes never leave the GPU, so the GEMM engine's Freivalds
// check has nothing to check): `samples` elements, the first and the last of the whole result
// and the rest drawn from the PRNG keyed by (key, call), recomputed exactly on the CPU through
// units.js (that row of A and column of B quantized, the int dot product, the epilogue) and
// compared in all 64 bits. -> null, or the reason naming the element and both values.
export function spotAudit(a, transA, b, transB, nb, m, kk, n, result, key, call, samples = 8) {
  const total = nb * m * n, row = new Float64Array(kk), col = new Float64Array(kk);
  const got = new DataView(result.buffer, result.byteOffset, result.byteLength), want = new DataView(new ArrayBuffer(8));
  for (let s = 0; s < samples && total > 0; s++) {
    const e = s === 0 ? 0 : s === 1 ? total - 1 : draw(key, call * samples + s) % total;
    const bi = Math.floor(e / (m * n)), i = Math.floor(e / n) % m, j = e % n;
    for (let k = 0; k < kk; k++) {
      row[k] = transA ? a[bi * kk * m + k * m + i] : a[bi * m * kk + i * kk + k];
      col[k] = transB ? b[bi * n * kk + j * kk + k] : b[bi * kk * n + k * n + j];
    }
    want.setFloat64(0, unitDot(row, col, kk), true);
    if (got.getUint32(8 * e, true) !== want.getUint32(0, true) || got.getUint32(8 * e + 4, true) !== want.getUint32(4, true)) {
      return `spot audit: batch ${bi} row ${i} col ${j}: GPU ${show(result[e])}, CPU ${show(want.getFloat64(0, true))}`;
    }
  }
  return null;
}
