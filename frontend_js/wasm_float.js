// The float64 row kernels of the step in WebAssembly SIMD: the softmax rows (attention's causal
// softmax, cross-entropy's) and their backward, RMSNorm and its backward, ReLU and its backward,
// and Adam's update. Each does the same float64 operations as its JS twin (model.js, optim.js)
// on every element, in the same order, so the same bits; f64x2 lanes are two independent IEEE
// float64 operations. Written with the assembler of wasm_asm.js. rowPieces and adamUpdate wrap
// the kernels in their twins' signatures; engines.js gates them against the twins before a
// backend uses them.
import { LITTLE_ENDIAN } from './host.js';
import { EXP_COEFFS, EXP_MIN, EXP_MAX, INV_LN2, LN2_HI, LN2_LO } from './detmath.js';
import * as ADAM from './optim.js';     // B1, OMB1, B2, OMB2, EPS, powInt
import { NORM_EPS, crossEntropyTail } from './model.js';
import { freshF64 } from './arena.js';
import {
  Module, local, block, loop, br, br_if, if_, return_, call, select, i32, i64, f64, v128, V128_ZERO,
  i32x4, i64x2, f64x2, whileStep, forRange, addr8,
} from './wasm_asm.js';

const splatF = (x) => [f64.const(x), f64x2.splat];
const floatModule = new Module();

// exp on one f64x2 as statements (each ends in a local.set), so two vectors' chains can be
// interleaved: the Horner chain is latency-bound, two in flight nearly double the rate.
// Locals of one vector: x (input), k, r, p, f (result), sp.
const expStatements = (x, k, r, p, f, sp) => [
  [local.get(x), splatF(INV_LN2), f64x2.mul, f64x2.nearest, local.set(k)],                  // k = rint(x / ln2)
  [local.get(x), local.get(k), splatF(LN2_HI), f64x2.mul, f64x2.sub,
    local.get(k), splatF(LN2_LO), f64x2.mul, f64x2.sub, local.set(r)],                      // r = (x - k hi) - k lo
  [splatF(EXP_COEFFS[13]), local.get(r), f64x2.mul, splatF(EXP_COEFFS[12]), f64x2.add, local.set(p)],
  ...[11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0].map((c) => [local.get(p), local.get(r), f64x2.mul, splatF(EXP_COEFFS[c]), f64x2.add, local.set(p)]),
  [local.get(p), local.get(k), i32x4.trunc_sat_f64x2_s_zero, i64x2.extend_low_i32x4_s, i64.const(1023), i64x2.splat, i64x2.add,
    i32.const(52), i64x2.shl, f64x2.mul, local.set(f)],                                     // p * 2^k (bits (k+1023) << 52)
  // special lanes: x > EXP_MAX -> +inf, x < EXP_MIN -> 0, NaN -> x (as detmath.exp)
  [splatF(Infinity), local.get(x), local.get(x), splatF(EXP_MAX), f64x2.gt, v128.bitselect, local.set(sp)],
  [V128_ZERO, local.get(sp), local.get(x), splatF(EXP_MIN), f64x2.lt, v128.bitselect, local.set(sp)],
  [local.get(f), local.get(sp), local.get(x), splatF(EXP_MIN), f64x2.ge, local.get(x), splatF(EXP_MAX), f64x2.le,
    v128.and, v128.bitselect, local.set(f)],
];
const interleave = (a, b) => a.flatMap((st, i) => [...st, ...b[i]]);

// softmaxRows(src, dst, stats, scratch, R, W, causalT, divN, pre): softmax over R rows of width W
// (f64, row-major):
//   x  = src * pre                                  (attention's scale; 1 for cross-entropy)
//   n  = causalT ? (r % causalT) + 1 : W           the row's live columns
//   m  = running max of x[0..n) (m = x > m ? x : m, from x[0], in order: as the JS loop)
//   e  = exp(x[j] - m) for j < n (detmath.exp: Cody-Waite, Horner 13, 2^k from bits), +0 after
//   z  = detmath.tree_sum(e[0..W))
//   dst[j] = e[j] / z, then / divN when divN > 0   stats[2r] = m, stats[2r + 1] = z
// exp runs on f64x2 lanes: two independent IEEE float64 chains; a lane outside [EXP_MIN, EXP_MAX]
// (or NaN) takes exp's special value (0, +inf, the NaN) by select. The vector loops may read and
// write up to 3 elements past a row's live end; the next row (or the padding after the last) is
// written later, so nothing outside dst[0..R*W) survives.
floatModule.func('softmaxRows', {
  params: 'src dst stats scratch R W causalT divN pre:f64',
  locals: `r n j p q n1 w1 m:f64 t:f64 z:f64 dn:f64
    x0:v128 k0:v128 r0:v128 p0:v128 f0:v128 s0:v128 x1:v128 k1:v128 r1:v128 p1:v128 f1:v128 s1:v128
    vm:v128 vz:v128 vd:v128 vpre:v128`,
}, (L) => [
  local.get(L.pre), f64x2.splat, local.set(L.vpre),
  local.get(L.divN), f64.convert_i32_s, local.set(L.dn),
  local.get(L.dn), f64x2.splat, local.set(L.vd),
  local.get(L.W), i32.const(1), i32.add, local.set(L.w1),
  forRange(L.r, L.R, [
    local.get(L.src), local.get(L.r), local.get(L.W), i32.mul, i32.const(3), i32.shl, i32.add, local.set(L.p),
    local.get(L.dst), local.get(L.r), local.get(L.W), i32.mul, i32.const(3), i32.shl, i32.add, local.set(L.q),
    local.get(L.causalT), i32.eqz,
    if_([local.get(L.W), local.set(L.n)], [local.get(L.r), local.get(L.causalT), i32.rem_u, i32.const(1), i32.add, local.set(L.n)]),
    // m: the running max, in column order
    local.get(L.p), f64.load(), local.get(L.pre), f64.mul, local.set(L.m), i32.const(1), local.set(L.j),
    whileStep(L.j, 1, L.n, [addr8(L.p, L.j), f64.load(), local.get(L.pre), f64.mul, local.tee(L.t), local.get(L.m), local.get(L.t), local.get(L.m), f64.gt, select, local.set(L.m)]),
    // e = exp(x - m) for j < n, four at a time (two vectors in flight; up to 3 past the end)
    local.get(L.n), i32.const(3), i32.add, local.set(L.n1), i32.const(0), local.set(L.j), local.get(L.m), f64x2.splat, local.set(L.vm),
    whileStep(L.j, 4, L.n1, [
      addr8(L.p, L.j), v128.load(), local.get(L.vpre), f64x2.mul, local.get(L.vm), f64x2.sub, local.set(L.x0),
      addr8(L.p, L.j), i32.const(16), i32.add, v128.load(), local.get(L.vpre), f64x2.mul, local.get(L.vm), f64x2.sub, local.set(L.x1),
      interleave(expStatements(L.x0, L.k0, L.r0, L.p0, L.f0, L.s0), expStatements(L.x1, L.k1, L.r1, L.p1, L.f1, L.s1)),
      addr8(L.q, L.j), local.get(L.f0), v128.store(),
      addr8(L.q, L.j), i32.const(16), i32.add, local.get(L.f1), v128.store()]),
    local.get(L.n), local.set(L.j),
    whileStep(L.j, 1, L.W, [addr8(L.q, L.j), f64.const(0), f64.store()]),
    // z = tree_sum(e[0..W))
    local.get(L.q), local.get(L.W), i32.const(8), local.get(L.scratch), call(tsum), local.set(L.z),
    local.get(L.stats), local.get(L.r), i32.const(4), i32.shl, i32.add, local.get(L.m), f64.store(),
    local.get(L.stats), local.get(L.r), i32.const(4), i32.shl, i32.add, i32.const(8), i32.add, local.get(L.z), f64.store(),
    // dst = e / z (then / divN)
    local.get(L.z), f64x2.splat, local.set(L.vz), i32.const(0), local.set(L.j),
    whileStep(L.j, 2, L.w1, [addr8(L.q, L.j), v128.load(), local.get(L.vz), f64x2.div, local.set(L.x0),
      local.get(L.divN), if_([local.get(L.x0), local.get(L.vd), f64x2.div, local.set(L.x0)]),
      addr8(L.q, L.j), local.get(L.x0), v128.store()]),
  ]),
]);

// adamStep(w, g, m, v, n, lr, bc1, bc2): optim.adamStep on n elements (f64x2 lanes; n padded to
// even by the caller), the same operations in the same order:
//   m = B1*m + OMB1*g;  v = B2*v + OMB2*(g*g);  w = w - lr * ((m / bc1) / (sqrt(v / bc2) + EPS))
floatModule.func('adamStep', {
  params: 'w g m v n lr:f64 bc1:f64 bc2:f64',
  locals: 'i o gi:v128 mi:v128 vi:v128 vlr:v128 vb1:v128 vb2:v128',
}, (L) => [
  local.get(L.lr), f64x2.splat, local.set(L.vlr), local.get(L.bc1), f64x2.splat, local.set(L.vb1),
  local.get(L.bc2), f64x2.splat, local.set(L.vb2), i32.const(0), local.set(L.i),
  whileStep(L.i, 2, L.n, [
    local.get(L.i), i32.const(3), i32.shl, local.set(L.o),
    local.get(L.g), local.get(L.o), i32.add, v128.load(), local.set(L.gi),
    splatF(ADAM.B1), local.get(L.m), local.get(L.o), i32.add, v128.load(), f64x2.mul,
    splatF(ADAM.OMB1), local.get(L.gi), f64x2.mul, f64x2.add, local.set(L.mi),
    splatF(ADAM.B2), local.get(L.v), local.get(L.o), i32.add, v128.load(), f64x2.mul,
    splatF(ADAM.OMB2), local.get(L.gi), local.get(L.gi), f64x2.mul, f64x2.mul, f64x2.add, local.set(L.vi),
    local.get(L.m), local.get(L.o), i32.add, local.get(L.mi), v128.store(),
    local.get(L.v), local.get(L.o), i32.add, local.get(L.vi), v128.store(),
    local.get(L.w), local.get(L.o), i32.add,
    local.get(L.w), local.get(L.o), i32.add, v128.load(),
    local.get(L.vlr), local.get(L.mi), local.get(L.vb1), f64x2.div,
    local.get(L.vi), local.get(L.vb2), f64x2.div, f64x2.sqrt, splatF(ADAM.EPS), f64x2.add, f64x2.div, f64x2.mul,
    f64x2.sub, v128.store(),
  ]),
]);

// tsum(ptr, n, strideBytes, scratch) -> f64: detmath.tree_sum of a[i] = f64 at ptr + i*strideBytes:
// padded with +0.0 to a power of two p, then s[i] = s[i] + s[i + p/2] until one is left (the
// first level reads the source; a pad adds +0.0 explicitly); n = 1 gives a[0], n = 0 gives +0.
const tsum = floatModule.func(null, { params: 'a n sb s', result: 'f64', locals: 'half full j' }, (L) => {
  const at = (j, off) => [local.get(L.a), local.get(j), off ? [local.get(off), i32.add] : [], local.get(L.sb), i32.mul, i32.add];
  const sAt = (j, off) => [local.get(L.s), local.get(j), off ? [local.get(off), i32.add] : [], i32.const(3), i32.shl, i32.add];
  return [
    local.get(L.n), i32.const(1), i32.gt_s, i32.eqz,
    if_([local.get(L.n), i32.eqz, if_([f64.const(0), return_]), local.get(L.a), f64.load(), return_]),   // n <= 1
    i32.const(1), local.set(L.half),
    block(loop(local.get(L.half), local.get(L.n), i32.lt_u, i32.eqz, br_if(1),      // half = the power of two >= n
      local.get(L.half), i32.const(1), i32.shl, local.set(L.half), br(0))),
    local.get(L.half), i32.const(1), i32.shr_u, local.set(L.half),
    local.get(L.n), local.get(L.half), i32.sub, local.set(L.full),
    forRange(L.j, L.full, [sAt(L.j), at(L.j), f64.load(), at(L.j, L.half), f64.load(), f64.add, f64.store()]),
    whileStep(L.j, 1, L.half, [sAt(L.j), at(L.j), f64.load(), f64.const(0), f64.add, f64.store()]),
    block(loop(local.get(L.half), i32.const(1), i32.gt_s, i32.eqz, br_if(1),
      local.get(L.half), i32.const(1), i32.shr_u, local.set(L.half),
      forRange(L.j, L.half, [sAt(L.j), sAt(L.j), f64.load(), sAt(L.j, L.half), f64.load(), f64.add, f64.store()]),
      br(0))),
    local.get(L.s), f64.load(),
  ];
});

// pairs over j < n (reaching one past an odd end: every buffer has 2 doubles of padding)
const pairs = (j, n1, body) => [i32.const(0), local.set(j), whileStep(j, 2, n1, body)];
const rowAddr = (base, row, C, out) => [local.get(base), local.get(row), local.get(C), i32.mul, i32.const(3), i32.shl, i32.add, local.set(out)];

// rmsnormRows(x, g, y, xhat, r, N, C, scratch, sq, eps): model.rmsnorm on N rows of C
//   sq = x*x; r = 1 / sqrt(tree_sum(sq)/C + eps); xhat = x*r; y = xhat*g
floatModule.func('rmsnormRows', {
  params: 'x g y xhat r N C scratch sq eps:f64',
  locals: 'n c px py ph c1 rn:f64 vx:v128 vr:v128 vh:v128',
}, (L) => [
  local.get(L.C), i32.const(1), i32.add, local.set(L.c1),
  forRange(L.n, L.N, [
    rowAddr(L.x, L.n, L.C, L.px), rowAddr(L.y, L.n, L.C, L.py), rowAddr(L.xhat, L.n, L.C, L.ph),
    pairs(L.c, L.c1, [addr8(L.sq, L.c), addr8(L.px, L.c), v128.load(), local.tee(L.vx), local.get(L.vx), f64x2.mul, v128.store()]),
    f64.const(1), local.get(L.sq), local.get(L.C), i32.const(8), local.get(L.scratch), call(tsum),
    local.get(L.C), f64.convert_i32_s, f64.div, local.get(L.eps), f64.add, f64.sqrt, f64.div, local.set(L.rn),
    addr8(L.r, L.n), local.get(L.rn), f64.store(),
    local.get(L.rn), f64x2.splat, local.set(L.vr),
    pairs(L.c, L.c1, [addr8(L.px, L.c), v128.load(), local.get(L.vr), f64x2.mul, local.set(L.vh),
      addr8(L.ph, L.c), local.get(L.vh), v128.store(),
      addr8(L.py, L.c), local.get(L.vh), addr8(L.g, L.c), v128.load(), f64x2.mul, v128.store()]),
  ]),
]);

// rmsnormBackRows(dy, g, xhat, r, dx, dg, prod, N, C, scratch, dxh, t): model.rmsnormBackward
//   prod = dy*xhat; dg[c] = tree_sum over rows of prod[., c]; per row: dxh = dy*g, t = dxh*xhat,
//   d = tree_sum(t)/C, dx = (dxh - xhat*d) * r
floatModule.func('rmsnormBackRows', {
  params: 'dy g xhat r dx dg prod N C scratch dxh t',
  locals: 'n c pdy ph pdx nc1 c1 d:f64 vd:v128 vr:v128 vg:v128',
}, (L) => [
  local.get(L.N), local.get(L.C), i32.mul, i32.const(1), i32.add, local.set(L.nc1), local.get(L.C), i32.const(1), i32.add, local.set(L.c1),
  pairs(L.c, L.nc1, [addr8(L.prod, L.c), addr8(L.dy, L.c), v128.load(), addr8(L.xhat, L.c), v128.load(), f64x2.mul, v128.store()]),
  forRange(L.c, L.C, [addr8(L.dg, L.c), addr8(L.prod, L.c), local.get(L.N), local.get(L.C), i32.const(3), i32.shl,
    local.get(L.scratch), call(tsum), f64.store()]),
  forRange(L.n, L.N, [
    rowAddr(L.dy, L.n, L.C, L.pdy), rowAddr(L.xhat, L.n, L.C, L.ph), rowAddr(L.dx, L.n, L.C, L.pdx),
    pairs(L.c, L.c1, [addr8(L.dxh, L.c), addr8(L.pdy, L.c), v128.load(), addr8(L.g, L.c), v128.load(), f64x2.mul, local.tee(L.vg), v128.store(),
      addr8(L.t, L.c), local.get(L.vg), addr8(L.ph, L.c), v128.load(), f64x2.mul, v128.store()]),
    local.get(L.t), local.get(L.C), i32.const(8), local.get(L.scratch), call(tsum), local.get(L.C), f64.convert_i32_s, f64.div, f64x2.splat, local.set(L.vd),
    addr8(L.r, L.n), f64.load(), f64x2.splat, local.set(L.vr),
    pairs(L.c, L.c1, [addr8(L.pdx, L.c), addr8(L.dxh, L.c), v128.load(), addr8(L.ph, L.c), v128.load(), local.get(L.vd), f64x2.mul,
      f64x2.sub, local.get(L.vr), f64x2.mul, v128.store()]),
  ]),
]);

// softmaxBackRows(dp, p, ds, R, T, scale, scratch, t): model.softmaxBackward on R rows of T
//   t = dp*p; d = tree_sum(t); ds = (p * (dp - d)) * scale
floatModule.func('softmaxBackRows', {
  params: 'dp p ds R T scale:f64 scratch t',
  locals: 'n j pdp pp pds t1 vd:v128 vs:v128',
}, (L) => [
  local.get(L.T), i32.const(1), i32.add, local.set(L.t1), local.get(L.scale), f64x2.splat, local.set(L.vs),
  forRange(L.n, L.R, [
    rowAddr(L.dp, L.n, L.T, L.pdp), rowAddr(L.p, L.n, L.T, L.pp), rowAddr(L.ds, L.n, L.T, L.pds),
    pairs(L.j, L.t1, [addr8(L.t, L.j), addr8(L.pdp, L.j), v128.load(), addr8(L.pp, L.j), v128.load(), f64x2.mul, v128.store()]),
    local.get(L.t), local.get(L.T), i32.const(8), local.get(L.scratch), call(tsum), f64x2.splat, local.set(L.vd),
    pairs(L.j, L.t1, [addr8(L.pds, L.j), addr8(L.pp, L.j), v128.load(), addr8(L.pdp, L.j), v128.load(), local.get(L.vd), f64x2.sub,
      f64x2.mul, local.get(L.vs), f64x2.mul, v128.store()]),
  ]),
]);

// relu(h, out, n): out = np.maximum(h, 0): h where h > 0 or h is NaN, else +0 (branch-free:
// the JS loop's branch on random signs mispredicts half the time)
floatModule.func('relu', { params: 'h out n', locals: 'i n1 v:v128' }, (L) => [
  local.get(L.n), i32.const(1), i32.add, local.set(L.n1),
  pairs(L.i, L.n1, [addr8(L.out, L.i), addr8(L.h, L.i), v128.load(), local.tee(L.v), V128_ZERO,
    local.get(L.v), V128_ZERO, f64x2.gt, local.get(L.v), local.get(L.v), f64x2.ne, v128.or, v128.bitselect, v128.store()]),
]);
// reluBack(h, dy, out, n): out = h > 0 ? dy : +0
floatModule.func('reluBack', { params: 'h dy out n', locals: 'i n1' }, (L) => [
  local.get(L.n), i32.const(1), i32.add, local.set(L.n1),
  pairs(L.i, L.n1, [addr8(L.out, L.i), addr8(L.dy, L.i), v128.load(), V128_ZERO,
    addr8(L.h, L.i), v128.load(), V128_ZERO, f64x2.gt, v128.bitselect, v128.store()]),
]);

// the module's bytes
export const floatWasm = () => floatModule.bytes();
// the same module over an imported shared memory of at most maxPages (cpu/threads.js)
export const floatWasmShared = (maxPages) => floatModule.bytes({ sharedMaxPages: maxPages });

// byte offsets of consecutive f64 regions of the given lengths, each with 2 doubles of padding
// (the pair loops reach one past an odd end) and 16-byte aligned; the last entry is the end
const regions = (lengths) => {
  const out = [];
  let o = 0;
  for (const n of lengths) { out.push(o); o += (8 * (n + 2) + 15) & ~15; }
  out.push(o);
  return out;
};

const ensure = (mem, bytes) => {
  const grow = Math.ceil((bytes - mem.buffer.byteLength) / 65536);
  if (grow > 0) mem.grow(grow);
  return mem.buffer;
};

// -> the kernels {softmaxRows, rmsnormRows, rmsnormBackRows, softmaxBackRows, relu, reluBack,
// adamStep}, a new instance; throws why where WebAssembly SIMD is missing. Not yet trusted:
// engines.js gates them (through rowPieces and adamUpdate) against their JS twins.
export function createFloatKernels() {
  if (typeof WebAssembly === 'undefined') throw new Error('WebAssembly is not available');
  const bytes = floatWasm();
  if (!WebAssembly.validate(bytes)) throw new Error('WebAssembly SIMD is not supported here');
  if (!LITTLE_ENDIAN) throw new Error('the wasm float kernels assume a little-endian host');
  const ex = new WebAssembly.Instance(new WebAssembly.Module(bytes), {}).exports;
  return {
    // src (R*W) -> dst (R*W, written); returns a view of the row stats valid until the next call
    softmaxRows(src, R, W, causalT, divN, dst, pre = 1.0) {
      const n = R * W, oSrc = 0, oDst = 8 * (n + 4), oStats = 2 * oDst, oScratch = oStats + 16 * R;
      const buf = ensure(ex.mem, oScratch + 8 * W);
      new Float64Array(buf, oSrc, n).set(src);
      ex.softmaxRows(oSrc, oDst, oStats, oScratch, R, W, causalT, divN, pre);
      dst.set(new Float64Array(buf, oDst, n));
      return new Float64Array(buf, oStats, 2 * R);
    },
    // model.rmsnorm: x (N*C), g (C) -> y, xhat (N*C), r (N) written
    rmsnormRows(x, g, N, C, eps, y, xhat, r) {
      const [oX, oG, oY, oH, oR, oS, oQ, end] = regions([N * C, C, N * C, N * C, N, C, C]);
      const buf = ensure(ex.mem, end);
      new Float64Array(buf, oX, N * C).set(x); new Float64Array(buf, oG, C).set(g);
      ex.rmsnormRows(oX, oG, oY, oH, oR, N, C, oS, oQ, eps);
      y.set(new Float64Array(buf, oY, N * C)); xhat.set(new Float64Array(buf, oH, N * C)); r.set(new Float64Array(buf, oR, N));
    },
    // model.rmsnormBackward: dy, xhat (N*C), g (C), r (N) -> dx (N*C), dg (C) written
    rmsnormBackRows(dy, g, xhat, r, N, C, dx, dg) {
      const [oDy, oG, oH, oR, oDx, oDg, oP, oS, oD, oT, end] = regions([N * C, C, N * C, N, N * C, C, N * C, Math.max(N, C), C, C]);
      const buf = ensure(ex.mem, end);
      new Float64Array(buf, oDy, N * C).set(dy); new Float64Array(buf, oG, C).set(g);
      new Float64Array(buf, oH, N * C).set(xhat); new Float64Array(buf, oR, N).set(r);
      ex.rmsnormBackRows(oDy, oG, oH, oR, oDx, oDg, oP, N, C, oS, oD, oT);
      dx.set(new Float64Array(buf, oDx, N * C)); dg.set(new Float64Array(buf, oDg, C));
    },
    // model.softmaxBackward: dp, p (R*T) -> ds (R*T) written
    softmaxBackRows(dp, p, R, T, scale, ds) {
      const [oDp, oP, oDs, oS, oT, end] = regions([R * T, R * T, R * T, T, T]);
      const buf = ensure(ex.mem, end);
      new Float64Array(buf, oDp, R * T).set(dp); new Float64Array(buf, oP, R * T).set(p);
      ex.softmaxBackRows(oDp, oP, oDs, R, T, scale, oS, oT);
      ds.set(new Float64Array(buf, oDs, R * T));
    },
    // model's ReLU: h (n) -> out (n) written
    relu(h, out) {
      const n = h.length, [oH, oOut, end] = regions([n, n]);
      const buf = ensure(ex.mem, end);
      new Float64Array(buf, oH, n).set(h);
      ex.relu(oH, oOut, n);
      out.set(new Float64Array(buf, oOut, n));
    },
    // ReLU's backward: h, dy (n) -> out (n) written
    reluBack(h, dy, out) {
      const n = h.length, [oH, oDy, oOut, end] = regions([n, n, n]);
      const buf = ensure(ex.mem, end);
      new Float64Array(buf, oH, n).set(h); new Float64Array(buf, oDy, n).set(dy);
      ex.reluBack(oH, oDy, oOut, n);
      out.set(new Float64Array(buf, oOut, n));
    },
    // one tensor's Adam update in place: w, m, v (Float64Array n) updated, g read
    adamStep(w, g, m, v, lr, bc1, bc2) {
      const n = w.length, stride = 8 * (n + 2);
      const buf = ensure(ex.mem, 4 * stride);
      const W = new Float64Array(buf, 0, n), M = new Float64Array(buf, 2 * stride, n), Vv = new Float64Array(buf, 3 * stride, n);
      W.set(w); new Float64Array(buf, stride, n).set(g); M.set(m); Vv.set(v);
      ex.adamStep(0, stride, 2 * stride, 3 * stride, n + (n & 1), lr, bc1, bc2);
      w.set(W); m.set(M); v.set(Vv);
    },
  };
}

// kernels -> the row pieces in model.js's signatures (rmsnorm, rmsnormBackward, causalSoftmax,
// softmaxBackward, relu, reluBackward, crossEntropy), arrays from `mem` as there
export function rowPieces(k) {
  return {
    rmsnorm(x, g, N, C, mem = freshF64) {
      const y = mem.take(N * C), xhat = mem.take(N * C), r = mem.take(N);
      k.rmsnormRows(x, g, N, C, NORM_EPS, y, xhat, r);
      return [y, { xhat, r }];
    },
    rmsnormBackward(dy, g, cache, N, C, mem = freshF64) {
      const dx = mem.take(N * C), dg = mem.take(C);
      k.rmsnormBackRows(dy, g, cache.xhat, cache.r, N, C, dx, dg);
      return [dx, dg];
    },
    causalSoftmax(s, G, T, mem = freshF64, scale = 1.0) {
      const p = mem.take(G * T * T);
      k.softmaxRows(s, G * T, T, T, 0, p, scale);
      return p;
    },
    softmaxBackward(dp, p, G, T, scale, mem = freshF64) {
      const ds = mem.take(G * T * T);
      k.softmaxBackRows(dp, p, G * T, T, scale, ds);
      return ds;
    },
    relu(h, mem = freshF64) {
      const hr = mem.take(h.length);
      k.relu(h, hr);
      return hr;
    },
    reluBackward(dhr, h, mem = freshF64) {
      const dh = mem.take(h.length);
      k.reluBack(h, dhr, dh);
      return dh;
    },
    // the softmax rows give (e / z) / N and each row's m, z; the target's entry and the loss: model.js
    crossEntropy(logits, targets, N, V, mem = freshF64) {
      const lossN = mem.take(N), dlogits = mem.take(N * V);
      const stats = k.softmaxRows(logits, N, V, 0, N, dlogits);
      return crossEntropyTail(logits, targets, N, V, stats, dlogits, lossN);
    },
  };
}

// kernels -> optim.adamStep's signature on the wasm update, one tensor at a time
export function adamUpdate(k) {
  return function adamStep(params, grads, state, lr) {
    const t = state.t + 1;
    const bc1 = 1.0 - ADAM.powInt(ADAM.B1, t);
    const bc2 = 1.0 - ADAM.powInt(ADAM.B2, t);
    for (const name of Object.keys(params)) k.adamStep(params[name], grads[name], state.m[name], state.v[name], lr, bc1, bc2);
    state.t = t;
  };
}
