// The float64 row kernels of the step in WebAssembly SIMD — the softmax rows (attention's causal
// softmax, cross-entropy's) and Adam's update — the same float64 operations as model.js's JS versions on every element, so
// the same bits. One function over R rows of width W (f64, row-major, in its memory):
//   softmaxRows(src, dst, stats, scratch, R, W, causalT, divN, pre)
//     x  = src * pre                                  (attention's scale; 1 for cross-entropy)
//     n  = causalT ? (r % causalT) + 1 : W           the row's live columns
//     m  = running max of x[0..n) (m = x > m ? x : m, from x[0], in order: as the JS loop)
//     e  = exp(x[j] - m) for j < n (detmath.exp: Cody-Waite, Horner 13, 2^k from bits), +0 after
//     z  = detmath.tree_sum(e[0..W))
//     dst[j] = e[j] / z, then / divN when divN > 0   stats[2r] = m, stats[2r + 1] = z
// exp runs on f64x2 lanes: two independent IEEE float64 chains; a lane outside [EXP_MIN, EXP_MAX]
// (or NaN) takes exp's special value (0, +inf, the NaN) by select. The vector loops may read and
// write up to 3 elements past a row's live end; the next row (or the padding after the last) is
// written later, so nothing outside dst[0..R*W) survives. Gated at creation against the JS versions.
import { EXP_COEFFS, EXP_MIN, EXP_MAX, INV_LN2, LN2_HI, LN2_LO } from './detmath.js';
import * as ADAM from './optim.js';     // B1, OMB1, B2, OMB2, EPS (read at first use: optim.js imports us)
import {
  I32, F64, V128, ADD, MUL, SHL, LOAD, STORE, F64LOAD, F64STORE, VZERO, X2, simd, f64c, get, set, i32c,
  func, whileStep, forRange, addr8, section, vec, str, uleb, tee, F_LT, funcType, LE_HOST,
} from './wasm_gemm.js';

const SUB = 0x6b, REM_U = 0x70, EQZ = 0x45, SHR_U = 0x76, LT_U = 0x49, GT_S = 0x4a, F_GT = 0x64;
const FADD = 0xa0, FMUL = 0xa2, FDIV = 0xa3, FSQRT = 0x9f, F_OF_I32 = 0xb7, SELECT = 0x1b;
const IF = [0x04, 0x40], ELSE = 0x05, END = 0x0b;
const V = { add: simd(0xf0), sub: simd(0xf1), mul: simd(0xf2), div: simd(0xf3), nearest: simd(0x94),
  ne: simd(0x48), or: simd(0x50), le: simd(0x4b), ge: simd(0x4c), lt: simd(0x49), gt: simd(0x4a), and: simd(0x4e), bitselect: simd(0x52),
  sqrt: simd(0xef), truncZero: simd(0xfc), extendLow64: simd(0xc7), shl64: simd(0xcb), add64: simd(0xce), splat64: simd(0x12) };
const I64C = (v) => [0x42, ...uleb(v)];          // small non-negative i64 constants only
const splatF = (x) => [...f64c(x), ...X2.splat];

// exp on one f64x2 as statements (each ends in a local.set), so two vectors' chains can be
// interleaved: the Horner chain is latency-bound, two in flight nearly double the rate.
// Locals of one vector: x (input), k, r, p, f (result), sp.
const expStatements = (x, k, r, p, f, sp) => [
  [...get(x), ...splatF(INV_LN2), ...V.mul, ...V.nearest, ...set(k)],                  // k = rint(x / ln2)
  [...get(x), ...get(k), ...splatF(LN2_HI), ...V.mul, ...V.sub,
    ...get(k), ...splatF(LN2_LO), ...V.mul, ...V.sub, ...set(r)],                      // r = (x - k hi) - k lo
  [...splatF(EXP_COEFFS[13]), ...get(r), ...V.mul, ...splatF(EXP_COEFFS[12]), ...V.add, ...set(p)],
  ...[11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0].map((c) => [...get(p), ...get(r), ...V.mul, ...splatF(EXP_COEFFS[c]), ...V.add, ...set(p)]),
  [...get(p), ...get(k), ...V.truncZero, ...V.extendLow64, ...I64C(1023), ...V.splat64, ...V.add64,
    ...i32c(52), ...V.shl64, ...V.mul, ...set(f)],                                     // p * 2^k (bits (k+1023) << 52)
  // special lanes: x > EXP_MAX -> +inf, x < EXP_MIN -> 0, NaN -> x (as detmath.exp)
  [...splatF(Infinity), ...get(x), ...get(x), ...splatF(EXP_MAX), ...V.gt, ...V.bitselect, ...set(sp)],
  [...VZERO, ...get(sp), ...get(x), ...splatF(EXP_MIN), ...V.lt, ...V.bitselect, ...set(sp)],
  [...get(f), ...get(sp), ...get(x), ...splatF(EXP_MIN), ...V.ge, ...get(x), ...splatF(EXP_MAX), ...V.le,
    ...V.and, ...V.bitselect, ...set(f)],
];
const interleave = (a, b) => a.flatMap((st, i) => [...st, ...b[i]]);

// tsum(ptr, n, strideBytes, scratch) -> f64: detmath.tree_sum of a[i] = f64 at ptr + i*strideBytes:
// padded with +0.0 to a power of two p, then s[i] = s[i] + s[i + p/2] until one is left (the
// first level reads the source; a pad adds +0.0 explicitly); n = 1 gives a[0], n = 0 gives +0.
const TSUM = 2, CALL_TSUM = [0x10, TSUM];
const tsumFn = func(['a', 'n', 'sb', 's'], [[I32, ['half', 'full', 'j']]], (L) => {
  const at = (j, off) => [...get(L.a), ...get(j), ...(off ? [...get(off), ADD] : []), ...get(L.sb), MUL, ADD];
  const sAt = (j, off) => [...get(L.s), ...get(j), ...(off ? [...get(off), ADD] : []), ...i32c(3), SHL, ADD];
  return [
    ...get(L.n), ...i32c(1), GT_S, EQZ, ...IF,
    ...get(L.n), EQZ, ...IF, ...f64c(0), 0x0f, END, ...get(L.a), ...F64LOAD, 0x0f, END,     // return
    ...i32c(1), ...set(L.half),
    0x02, 0x40, 0x03, 0x40, ...get(L.half), ...get(L.n), LT_U, EQZ, 0x0d, 1,
    ...get(L.half), ...i32c(1), SHL, ...set(L.half), 0x0c, 0, END, END,
    ...get(L.half), ...i32c(1), SHR_U, ...set(L.half),
    ...get(L.n), ...get(L.half), SUB, ...set(L.full),
    ...forRange(L.j, L.full, [...sAt(L.j), ...at(L.j), ...F64LOAD, ...at(L.j, L.half), ...F64LOAD, FADD, ...F64STORE]),
    ...whileStep(L.j, 1, L.half, [...sAt(L.j), ...at(L.j), ...F64LOAD, ...f64c(0), FADD, ...F64STORE]),
    0x02, 0x40, 0x03, 0x40, ...get(L.half), ...i32c(1), GT_S, EQZ, 0x0d, 1,
    ...get(L.half), ...i32c(1), SHR_U, ...set(L.half),
    ...forRange(L.j, L.half, [...sAt(L.j), ...sAt(L.j), ...F64LOAD, ...sAt(L.j, L.half), ...F64LOAD, FADD, ...F64STORE]),
    0x0c, 0, END, END,
    ...get(L.s), ...F64LOAD,
  ];
});

// pairs over j < n (reaching one past an odd end: every buffer has 2 doubles of padding)
const pairs = (j, n1, body) => [...i32c(0), ...set(j), ...whileStep(j, 2, n1, body)];
const rowAddr = (base, row, C, out) => [...get(base), ...get(row), ...get(C), MUL, ...i32c(3), SHL, ADD, ...set(out)];

// rmsnormRows(x, g, y, xhat, r, N, C, scratch, sq, eps): model.rmsnorm on N rows of C
//   sq = x*x; r = 1 / sqrt(tree_sum(sq)/C + eps); xhat = x*r; y = xhat*g
const rmsnormFn = func(['x', 'g', 'y', 'xhat', 'r', 'N', 'C', 'scratch', 'sq', 'eps'],
  [[I32, ['n', 'c', 'px', 'py', 'ph', 'c1']], [F64, ['rn']], [V128, ['vx', 'vr', 'vh']]], (L) => [
    ...get(L.C), ...i32c(1), ADD, ...set(L.c1),
    ...forRange(L.n, L.N, [
      ...rowAddr(L.x, L.n, L.C, L.px), ...rowAddr(L.y, L.n, L.C, L.py), ...rowAddr(L.xhat, L.n, L.C, L.ph),
      ...pairs(L.c, L.c1, [...addr8(L.sq, L.c), ...addr8(L.px, L.c), ...LOAD, ...tee(L.vx), ...get(L.vx), ...V.mul, ...STORE]),
      ...f64c(1), ...get(L.sq), ...get(L.C), ...i32c(8), ...get(L.scratch), ...CALL_TSUM,
      ...get(L.C), F_OF_I32, FDIV, ...get(L.eps), FADD, FSQRT, FDIV, ...set(L.rn),
      ...addr8(L.r, L.n), ...get(L.rn), ...F64STORE,
      ...get(L.rn), ...X2.splat, ...set(L.vr),
      ...pairs(L.c, L.c1, [...addr8(L.px, L.c), ...LOAD, ...get(L.vr), ...V.mul, ...set(L.vh),
        ...addr8(L.ph, L.c), ...get(L.vh), ...STORE,
        ...addr8(L.py, L.c), ...get(L.vh), ...addr8(L.g, L.c), ...LOAD, ...V.mul, ...STORE]),
    ]),
  ]);

// rmsnormBackRows(dy, g, xhat, r, dx, dg, prod, N, C, scratch, dxh, t): model.rmsnormBackward
//   prod = dy*xhat; dg[c] = tree_sum over rows of prod[., c]; per row: dxh = dy*g, t = dxh*xhat,
//   d = tree_sum(t)/C, dx = (dxh - xhat*d) * r
const rmsnormBackFn = func(['dy', 'g', 'xhat', 'r', 'dx', 'dg', 'prod', 'N', 'C', 'scratch', 'dxh', 't'],
  [[I32, ['n', 'c', 'pdy', 'ph', 'pdx', 'nc1', 'c1']], [F64, ['d']], [V128, ['vd', 'vr', 'vg']]], (L) => [
    ...get(L.N), ...get(L.C), MUL, ...i32c(1), ADD, ...set(L.nc1), ...get(L.C), ...i32c(1), ADD, ...set(L.c1),
    ...pairs(L.c, L.nc1, [...addr8(L.prod, L.c), ...addr8(L.dy, L.c), ...LOAD, ...addr8(L.xhat, L.c), ...LOAD, ...V.mul, ...STORE]),
    ...forRange(L.c, L.C, [...addr8(L.dg, L.c), ...addr8(L.prod, L.c), ...get(L.N), ...get(L.C), ...i32c(3), SHL,
      ...get(L.scratch), ...CALL_TSUM, ...F64STORE]),
    ...forRange(L.n, L.N, [
      ...rowAddr(L.dy, L.n, L.C, L.pdy), ...rowAddr(L.xhat, L.n, L.C, L.ph), ...rowAddr(L.dx, L.n, L.C, L.pdx),
      ...pairs(L.c, L.c1, [...addr8(L.dxh, L.c), ...addr8(L.pdy, L.c), ...LOAD, ...addr8(L.g, L.c), ...LOAD, ...V.mul, ...tee(L.vg), ...STORE,
        ...addr8(L.t, L.c), ...get(L.vg), ...addr8(L.ph, L.c), ...LOAD, ...V.mul, ...STORE]),
      ...get(L.t), ...get(L.C), ...i32c(8), ...get(L.scratch), ...CALL_TSUM, ...get(L.C), F_OF_I32, FDIV, ...X2.splat, ...set(L.vd),
      ...addr8(L.r, L.n), ...F64LOAD, ...X2.splat, ...set(L.vr),
      ...pairs(L.c, L.c1, [...addr8(L.pdx, L.c), ...addr8(L.dxh, L.c), ...LOAD, ...addr8(L.ph, L.c), ...LOAD, ...get(L.vd), ...V.mul,
        ...V.sub, ...get(L.vr), ...V.mul, ...STORE]),
    ]),
  ]);

// softmaxBackRows(dp, p, ds, R, T, scale, scratch, t): model.softmaxBackward on R rows of T
//   t = dp*p; d = tree_sum(t); ds = (p * (dp - d)) * scale
const softmaxBackFn = func(['dp', 'p', 'ds', 'R', 'T', 'scale', 'scratch', 't'],
  [[I32, ['n', 'j', 'pdp', 'pp', 'pds', 't1']], [V128, ['vd', 'vs']]], (L) => [
    ...get(L.T), ...i32c(1), ADD, ...set(L.t1), ...get(L.scale), ...X2.splat, ...set(L.vs),
    ...forRange(L.n, L.R, [
      ...rowAddr(L.dp, L.n, L.T, L.pdp), ...rowAddr(L.p, L.n, L.T, L.pp), ...rowAddr(L.ds, L.n, L.T, L.pds),
      ...pairs(L.j, L.t1, [...addr8(L.t, L.j), ...addr8(L.pdp, L.j), ...LOAD, ...addr8(L.pp, L.j), ...LOAD, ...V.mul, ...STORE]),
      ...get(L.t), ...get(L.T), ...i32c(8), ...get(L.scratch), ...CALL_TSUM, ...X2.splat, ...set(L.vd),
      ...pairs(L.j, L.t1, [...addr8(L.pds, L.j), ...addr8(L.pp, L.j), ...LOAD, ...addr8(L.pdp, L.j), ...LOAD, ...get(L.vd), ...V.sub,
        ...V.mul, ...get(L.vs), ...V.mul, ...STORE]),
    ]),
  ]);

const softmaxFn = func(['src', 'dst', 'stats', 'scratch', 'R', 'W', 'causalT', 'divN', 'pre'],
  [[I32, ['r', 'n', 'j', 'p', 'q', 'n1', 'w1']], [F64, ['m', 't', 'z', 'dn']],
    [V128, ['x0', 'k0', 'r0', 'p0', 'f0', 's0', 'x1', 'k1', 'r1', 'p1', 'f1', 's1', 'vm', 'vz', 'vd', 'vpre']]], (L) => [
    ...get(L.pre), ...X2.splat, ...set(L.vpre),
    ...get(L.divN), F_OF_I32, ...set(L.dn),
    ...get(L.dn), ...X2.splat, ...set(L.vd),
    ...get(L.W), ...i32c(1), ADD, ...set(L.w1),
    ...forRange(L.r, L.R, [
      ...get(L.src), ...get(L.r), ...get(L.W), MUL, ...i32c(3), SHL, ADD, ...set(L.p),
      ...get(L.dst), ...get(L.r), ...get(L.W), MUL, ...i32c(3), SHL, ADD, ...set(L.q),
      ...get(L.causalT), EQZ, ...IF, ...get(L.W), ...set(L.n), ELSE,
      ...get(L.r), ...get(L.causalT), REM_U, ...i32c(1), ADD, ...set(L.n), END,
      // m: the running max, in column order
      ...get(L.p), ...F64LOAD, ...get(L.pre), FMUL, ...set(L.m), ...i32c(1), ...set(L.j),
      ...whileStep(L.j, 1, L.n, [...addr8(L.p, L.j), ...F64LOAD, ...get(L.pre), FMUL, ...tee(L.t), ...get(L.m), ...get(L.t), ...get(L.m), F_GT, SELECT, ...set(L.m)]),
      // e = exp(x - m) for j < n, four at a time (two vectors in flight; up to 3 past the end)
      ...get(L.n), ...i32c(3), ADD, ...set(L.n1), ...i32c(0), ...set(L.j), ...get(L.m), ...X2.splat, ...set(L.vm),
      ...whileStep(L.j, 4, L.n1, [
        ...addr8(L.p, L.j), ...LOAD, ...get(L.vpre), ...V.mul, ...get(L.vm), ...V.sub, ...set(L.x0),
        ...addr8(L.p, L.j), ...i32c(16), ADD, ...LOAD, ...get(L.vpre), ...V.mul, ...get(L.vm), ...V.sub, ...set(L.x1),
        ...interleave(expStatements(L.x0, L.k0, L.r0, L.p0, L.f0, L.s0), expStatements(L.x1, L.k1, L.r1, L.p1, L.f1, L.s1)),
        ...addr8(L.q, L.j), ...get(L.f0), ...STORE,
        ...addr8(L.q, L.j), ...i32c(16), ADD, ...get(L.f1), ...STORE]),
      ...get(L.n), ...set(L.j),
      ...whileStep(L.j, 1, L.W, [...addr8(L.q, L.j), ...f64c(0), ...F64STORE]),
      // z = tree_sum(e[0..W))
      ...get(L.q), ...get(L.W), ...i32c(8), ...get(L.scratch), ...CALL_TSUM, ...set(L.z),
      ...get(L.stats), ...get(L.r), ...i32c(4), SHL, ADD, ...get(L.m), ...F64STORE,
      ...get(L.stats), ...get(L.r), ...i32c(4), SHL, ADD, ...i32c(8), ADD, ...get(L.z), ...F64STORE,
      // dst = e / z (then / divN)
      ...get(L.z), ...X2.splat, ...set(L.vz), ...i32c(0), ...set(L.j),
      ...whileStep(L.j, 2, L.w1, [...addr8(L.q, L.j), ...LOAD, ...get(L.vz), ...V.div, ...set(L.x0),
        ...get(L.divN), ...IF, ...get(L.x0), ...get(L.vd), ...V.div, ...set(L.x0), END,
        ...addr8(L.q, L.j), ...get(L.x0), ...STORE]),
    ]),
  ]);

// relu(h, out, n): out = np.maximum(h, 0): h where h > 0 or h is NaN, else +0 (branch-free:
// the JS loop's branch on random signs mispredicts half the time)
const reluFn = func(['h', 'out', 'n'], [[I32, ['i', 'n1']], [V128, ['v']]], (L) => [
  ...get(L.n), ...i32c(1), ADD, ...set(L.n1),
  ...pairs(L.i, L.n1, [...addr8(L.out, L.i), ...addr8(L.h, L.i), ...LOAD, ...tee(L.v), ...VZERO,
    ...get(L.v), ...VZERO, ...V.gt, ...get(L.v), ...get(L.v), ...V.ne, ...V.or, ...V.bitselect, ...STORE]),
]);
// reluBack(h, dy, out, n): out = h > 0 ? dy : +0
const reluBackFn = func(['h', 'dy', 'out', 'n'], [[I32, ['i', 'n1']]], (L) => [
  ...get(L.n), ...i32c(1), ADD, ...set(L.n1),
  ...pairs(L.i, L.n1, [...addr8(L.out, L.i), ...addr8(L.dy, L.i), ...LOAD, ...VZERO,
    ...addr8(L.h, L.i), ...LOAD, ...VZERO, ...V.gt, ...V.bitselect, ...STORE]),
]);

// adamStep(w, g, m, v, n, lr, bc1, bc2): optim.adamStep on n elements (f64x2 lanes; n padded to
// even by the caller), the same operations in the same order:
//   m = B1*m + OMB1*g;  v = B2*v + OMB2*(g*g);  w = w - lr * ((m / bc1) / (sqrt(v / bc2) + EPS))
const adamFn = () => func(['w', 'g', 'm', 'v', 'n', 'lr', 'bc1', 'bc2'],
  [[I32, ['i', 'o']], [V128, ['gi', 'mi', 'vi', 'vlr', 'vb1', 'vb2']]], (L) => [
    ...get(L.lr), ...X2.splat, ...set(L.vlr), ...get(L.bc1), ...X2.splat, ...set(L.vb1),
    ...get(L.bc2), ...X2.splat, ...set(L.vb2), ...i32c(0), ...set(L.i),
    ...whileStep(L.i, 2, L.n, [
      ...get(L.i), ...i32c(3), SHL, ...set(L.o),
      ...get(L.g), ...get(L.o), ADD, ...LOAD, ...set(L.gi),
      ...splatF(ADAM.B1), ...get(L.m), ...get(L.o), ADD, ...LOAD, ...V.mul,
      ...splatF(ADAM.OMB1), ...get(L.gi), ...V.mul, ...V.add, ...set(L.mi),
      ...splatF(ADAM.B2), ...get(L.v), ...get(L.o), ADD, ...LOAD, ...V.mul,
      ...splatF(ADAM.OMB2), ...get(L.gi), ...get(L.gi), ...V.mul, ...V.mul, ...V.add, ...set(L.vi),
      ...get(L.m), ...get(L.o), ADD, ...get(L.mi), ...STORE,
      ...get(L.v), ...get(L.o), ADD, ...get(L.vi), ...STORE,
      ...get(L.w), ...get(L.o), ADD,
      ...get(L.w), ...get(L.o), ADD, ...LOAD,
      ...get(L.vlr), ...get(L.mi), ...get(L.vb1), ...V.div,
      ...get(L.vi), ...get(L.vb2), ...V.div, ...V.sqrt, ...splatF(ADAM.EPS), ...V.add, ...V.div, ...V.mul,
      ...V.sub, ...STORE,
    ]),
  ]);

const typeOf = (params, results = []) => [0x60, ...vec(params.map((t) => [t])), ...vec(results.map((t) => [t]))];
// the module's bytes (built at first use, after optim.js has its constants)
export const floatWasm = () => new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
  ...section(1, vec([typeOf([...new Array(8).fill(I32), F64]), typeOf([I32, I32, I32, I32, I32, F64, F64, F64]),
    typeOf([I32, I32, I32, I32], [F64]), typeOf([...new Array(9).fill(I32), F64]), funcType(rmsnormBackFn.nParams),
    typeOf([I32, I32, I32, I32, I32, F64, I32, I32]), funcType(3), funcType(4)])),
  ...section(3, vec([[0x00], [0x01], [0x02], [0x03], [0x04], [0x05], [0x06], [0x07]])),   // function i has type i
  ...section(5, vec([[0x00, 0x01]])),                                           // memory 0: min 1 page
  ...section(7, vec([[...str('mem'), 0x02, 0x00], [...str('softmaxRows'), 0x00, 0x00], [...str('adamStep'), 0x00, 0x01],
    [...str('rmsnormRows'), 0x00, 0x03], [...str('rmsnormBackRows'), 0x00, 0x04], [...str('softmaxBackRows'), 0x00, 0x05],
    [...str('relu'), 0x00, 0x06], [...str('reluBack'), 0x00, 0x07]])),
  ...section(10, vec([softmaxFn.body, adamFn().body, tsumFn.body, rmsnormFn.body, rmsnormBackFn.body, softmaxBackFn.body, reluFn.body, reluBackFn.body]
    .map((b) => [...uleb(b.length), ...b]))),
]);

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

let instance;                                 // undefined: not tried; null: unavailable
export let floatKernelsUnavailable = null;    // why (null when available)

// -> the kernels {softmaxRows, adamStep}, or null (no WebAssembly SIMD here). Each user gates
// the kernel it uses against its JS version before trusting it (model.js, optim.js).
export function floatKernels() {
  if (instance !== undefined) return instance;
  instance = null;
  try {
    if (typeof WebAssembly === 'undefined') throw new Error('WebAssembly is not available');
    const bytes = floatWasm();
    if (!WebAssembly.validate(bytes)) throw new Error('WebAssembly SIMD is not supported here');
    if (!LE_HOST) throw new Error('the wasm float kernels assume a little-endian host');
    const ex = new WebAssembly.Instance(new WebAssembly.Module(bytes), {}).exports;
    instance = {
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
  } catch (e) {
    instance = null; floatKernelsUnavailable = e.message;
  }
  return instance;
}
