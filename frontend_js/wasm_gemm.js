// The WebAssembly SIMD integer engine: the same exact int8 GEMM as units.cpuEngine, faster.
// The module is assembled here from opcodes (no build step, no toolchain). Its exports: mem; the
// float ends of the unit qrows, qcols, epi (below); audit and pack8 for the GPU engine's host
// (gpu.js, gated there); and the GEMM
//   gemm(aPtr, bPtr, cPtr, batch, M, N, Kp)
// over int16 operands in its memory, A (batch, M, Kp) and B^T (batch, N, Kp), K zero-padded to
// Kp (a multiple of 8), M even, N a multiple of 4; C (batch, M, N) int32. Inner step: 8 products
// by i32x4.dot_i16x8_s, accumulated in i32x4 lanes; a lane sum is exact because wasm i32 adds
// wrap mod 2^32 and the true total fits int32 (K <= MAX_K), so no float and no rounding anywhere.
// The engine is gated at creation against the scalar engine (random, ragged and extreme inputs)
// and is not offered when it disagrees or WebAssembly SIMD is missing.
import { cpuEngine, MAX_K, quantizeRows, quantizeCols, epilogue } from './units.js';

// --- a tiny assembler -------------------------------------------------------------------------
export const uleb = (n) => { const o = []; do { let b = n & 0x7f; n >>>= 7; if (n) b |= 0x80; o.push(b); } while (n); return o; };
export const sleb = (n) => {
  const o = [];
  for (;;) { const b = n & 0x7f; n >>= 7; if ((n === 0 && !(b & 0x40)) || (n === -1 && (b & 0x40))) { o.push(b); return o; } o.push(b | 0x80); }
};
export const str = (s) => [...uleb(s.length), ...[...s].map((c) => c.charCodeAt(0))];
export const section = (id, body) => [id, ...uleb(body.length), ...body];
export const vec = (items) => [...uleb(items.length), ...items.flat()];

export const I32 = 0x7f, V128 = 0x7b;
export const get = (l) => [0x20, ...uleb(l)], set = (l) => [0x21, ...uleb(l)];
export const i32c = (v) => [0x41, ...sleb(v)];
export const ADD = 0x6a, MUL = 0x6c, SHL = 0x74, LT_U = 0x49;
export const simd = (op, ...imm) => [0xfd, ...uleb(op), ...imm];
export const LOAD = simd(0x00, 4, 0), STORE = simd(0x0b, 4, 0);
const DOT = simd(0xba), VADD = simd(0xae);
const shuffle = (lanes32) => simd(0x0d, ...lanes32.flatMap((l) => [4 * l, 4 * l + 1, 4 * l + 2, 4 * l + 3]));
export const VZERO = simd(0x0c, ...new Array(16).fill(0));
const loop = (body) => [0x03, 0x40, ...body, 0x0b];

// locals: params 0..6, then i32 and v128 locals
const [aPtr, bPtr, cPtr, batch, M, N, Kp] = [0, 1, 2, 3, 4, 5, 6];
const [bi, i, j, k, pa0, pa1, pb0, pb1, pb2, pb3, rowB, aBase, bBase, cBase, cRow] = Array.from({ length: 15 }, (_, n) => 7 + n);
const acc = Array.from({ length: 8 }, (_, n) => 22 + n);    // acc[r*4 + c]: row r of 2, column c of 4
const va = [30, 31], vb = 32;

// hsum4(a, b, c, d) -> [sum a, sum b, sum c, sum d] (exact wrapping i32 adds)
const hsum4 = (a, b, c, d) => [
  ...get(a), ...get(b), ...shuffle([0, 1, 4, 5]), ...get(a), ...get(b), ...shuffle([2, 3, 6, 7]), ...VADD,
  ...get(c), ...get(d), ...shuffle([0, 1, 4, 5]), ...get(c), ...get(d), ...shuffle([2, 3, 6, 7]), ...VADD,
  ...set(33), ...set(34),   // 34 = s01, 33 = s23
  ...get(34), ...get(33), ...shuffle([0, 2, 4, 6]), ...get(34), ...get(33), ...shuffle([1, 3, 5, 7]), ...VADD,
];

const kBody = [
  ...get(pa0), ...get(k), ADD, ...LOAD, ...set(va[0]),
  ...get(pa1), ...get(k), ADD, ...LOAD, ...set(va[1]),
  ...[pb0, pb1, pb2, pb3].flatMap((pb, c) => [
    ...get(pb), ...get(k), ADD, ...LOAD, ...set(vb),
    ...get(acc[c]), ...get(va[0]), ...get(vb), ...DOT, ...VADD, ...set(acc[c]),
    ...get(acc[4 + c]), ...get(va[1]), ...get(vb), ...DOT, ...VADD, ...set(acc[4 + c]),
  ]),
  ...get(k), ...i32c(16), ADD, ...set(k),
  ...get(k), ...get(rowB), LT_U, 0x0d, 0,                  // br_if k-loop
];
const jBody = [
  ...get(bBase), ...get(j), ...get(rowB), MUL, ADD, ...set(pb0),
  ...get(pb0), ...get(rowB), ADD, ...set(pb1),
  ...get(pb1), ...get(rowB), ADD, ...set(pb2),
  ...get(pb2), ...get(rowB), ADD, ...set(pb3),
  ...acc.flatMap((a) => [...VZERO, ...set(a)]),
  ...i32c(0), ...set(k),
  ...loop(kBody),
  ...get(cRow), ...get(j), ...i32c(2), SHL, ADD, ...hsum4(acc[0], acc[1], acc[2], acc[3]), ...STORE,
  ...get(cRow), ...get(N), ...get(j), ADD, ...i32c(2), SHL, ADD, ...hsum4(acc[4], acc[5], acc[6], acc[7]), ...STORE,
  ...get(j), ...i32c(4), ADD, ...set(j),
  ...get(j), ...get(N), LT_U, 0x0d, 0,
];
const iBody = [
  ...get(aBase), ...get(i), ...get(rowB), MUL, ADD, ...set(pa0),
  ...get(pa0), ...get(rowB), ADD, ...set(pa1),
  ...get(cBase), ...get(i), ...get(N), MUL, ...i32c(2), SHL, ADD, ...set(cRow),
  ...i32c(0), ...set(j),
  ...loop(jBody),
  ...get(i), ...i32c(2), ADD, ...set(i),
  ...get(i), ...get(M), LT_U, 0x0d, 0,
];
const bBody = [
  ...get(aPtr), ...get(bi), ...get(M), MUL, ...get(rowB), MUL, ADD, ...set(aBase),
  ...get(bPtr), ...get(bi), ...get(N), MUL, ...get(rowB), MUL, ADD, ...set(bBase),
  ...get(cPtr), ...get(bi), ...get(M), MUL, ...get(N), MUL, ...i32c(2), SHL, ADD, ...set(cBase),
  ...i32c(0), ...set(i),
  ...loop(iBody),
  ...get(bi), ...i32c(1), ADD, ...set(bi),
  ...get(bi), ...get(batch), LT_U, 0x0d, 0,
];
const body = [
  ...vec([[...uleb(15), I32], [...uleb(13), V128]]),
  ...get(Kp), ...i32c(1), SHL, ...set(rowB),
  ...i32c(0), ...set(bi),
  ...loop(bBody),
  0x0b,
];

// --- the float ends of the unit, also in wasm (IEEE-754 basic ops, correctly rounded, no FTZ,
// exactly the operations of units.quantizeRows / quantizeCols / epilogue on every element; the
// f64x2 lanes are two independent IEEE float64 operations, so SIMD changes no bit) ------------
export const F64 = 0x7c;
export const F64LOAD = [0x2b, 3, 0], F64STORE = [0x39, 3, 0], I32LOAD = [0x28, 2, 0], STORE16 = [0x3b, 1, 0];
const FABS = 0x99, FNEAREST = 0x9e, FMUL = 0xa2, FDIV = 0xa3, FMIN = 0xa4, FMAX = 0xa5, F_OF_I32 = 0xb7;
const GT_U = 0x4b;
const TRUNC_SAT = [0xfc, 0x02];
export const f64c = (x) => [0x44, ...new Uint8Array(new Float64Array([x]).buffer)];   // little-endian bytes
export const LE_HOST = new Uint8Array(new Float64Array([1]).buffer)[7] === 0x3f;
// pmin(a, b) = b < a ? b : a and pmax(a, b) = a < b ? b : a: the comparisons of units.js itself
// (amax: a > amax; clamp: v > 127, v < -127), one minpd/maxpd each
export const X2 = { splat: simd(0x14), abs: simd(0xec), mul: simd(0xf2), div: simd(0xf3), pmin: simd(0xf6),
  pmax: simd(0xf7), nearest: simd(0x94) };
const extract = (lane) => simd(0x21, lane);
const TRUNC_SAT_ZERO = simd(0xfc), CONVERT_LOW = simd(0xfe), NARROW16 = simd(0x85);
const LOAD64_ZERO = simd(0x5d, 3, 0);
const store16Lane = (lane) => simd(0x59, 1, 0, lane), store32Lane = (lane) => simd(0x5a, 2, 0, lane);

// a function body from named params and typed locals: build(L) gets name -> local index
export function func(params, locals, build) {
  const L = {};
  let n = 0;
  for (const name of params) L[name] = n++;
  const groups = locals.map(([type, names]) => { for (const name of names) L[name] = n++; return [...uleb(names.length), type]; });
  return { nParams: params.length, body: [...vec(groups), ...build(L), 0x0b] };
}
// while (i + step <= limit) { body; i += step }, i starting where it is (locals by index)
export const whileStep = (i, step, limit, body) => [0x02, 0x40, 0x03, 0x40,
  ...get(i), ...i32c(step), ADD, ...get(limit), GT_U, 0x0d, 1,
  ...body, ...get(i), ...i32c(step), ADD, ...set(i), 0x0c, 0, 0x0b, 0x0b];
export const forRange = (i, limit, body) => [...i32c(0), ...set(i), ...whileStep(i, 1, limit, body)];
export const addr8 = (base, idx) => [...get(base), ...get(idx), ...i32c(3), SHL, ADD];
// f64 / f64x2 on the stack, divided by s: clamp(nearest(x / s), -127, 127) as i32 / i16 lanes
const quantScalar = (s) => [...get(s), FDIV, FNEAREST, ...f64c(-127), FMAX, ...f64c(127), FMIN, ...TRUNC_SAT];
const quantPair = (lo, hi) => [...X2.div, ...X2.nearest, ...get(lo), ...X2.pmax, ...get(hi), ...X2.pmin,
  ...TRUNC_SAT_ZERO, ...VZERO, ...NARROW16];                    // i16 lanes 0, 1
// amax = amax < t ? t : amax with t = |x| (x f64 on the stack), the scalar twin of pmax: NaN never enters
export const F_LT = 0x63, SELECT = 0x1b, tee = (l) => [0x22, ...uleb(l)];
const pmaxAbs = (amaxCode, t) => [FABS, ...tee(t), ...amaxCode, ...amaxCode, ...get(t), F_LT, SELECT];
const clampVectors = (lo, hi) => [...f64c(-127), ...X2.splat, ...set(lo), ...f64c(127), ...X2.splat, ...set(hi)];

// qrows(xPtr, qPtr, sPtr, batch, R, K, Rp, Kp): row (b, i) of x is the K contiguous f64 at
// x[(b*R + i)*K]; s[b*R + i] = max(max|x|, 2^-60) / 127; q[(b*Rp + i)*Kp + k] (i16) = quant(x / s)
const qrowsFn = func(['xPtr', 'qPtr', 'sPtr', 'batch', 'R', 'K', 'Rp', 'Kp'],
  [[I32, ['b', 'i', 'k', 'p', 'qrow']], [F64, ['amax', 's', 't']], [V128, ['vmax', 'vs', 'lo', 'hi']]], (L) => [
    ...clampVectors(L.lo, L.hi),
    ...forRange(L.b, L.batch, forRange(L.i, L.R, [
      ...get(L.xPtr), ...get(L.b), ...get(L.R), MUL, ...get(L.i), ADD, ...get(L.K), MUL, ...i32c(3), SHL, ADD, ...set(L.p),
      ...VZERO, ...set(L.vmax), ...i32c(0), ...set(L.k),
      ...whileStep(L.k, 2, L.K, [...get(L.vmax), ...addr8(L.p, L.k), ...LOAD, ...X2.abs, ...X2.pmax, ...set(L.vmax)]),
      ...get(L.vmax), ...extract(0), ...get(L.vmax), ...extract(1), FMAX, ...set(L.amax),
      ...whileStep(L.k, 1, L.K, [...addr8(L.p, L.k), ...F64LOAD, ...pmaxAbs(get(L.amax), L.t), ...set(L.amax)]),
      ...get(L.amax), ...f64c(2 ** -60), FMAX, ...f64c(127), FDIV, ...set(L.s),
      ...get(L.sPtr), ...get(L.b), ...get(L.R), MUL, ...get(L.i), ADD, ...i32c(3), SHL, ADD, ...get(L.s), ...F64STORE,
      ...get(L.s), ...X2.splat, ...set(L.vs),
      ...get(L.qPtr), ...get(L.b), ...get(L.Rp), MUL, ...get(L.i), ADD, ...get(L.Kp), MUL, ...i32c(1), SHL, ADD, ...set(L.qrow),
      ...i32c(0), ...set(L.k),
      ...whileStep(L.k, 2, L.K, [...get(L.qrow), ...get(L.k), ...i32c(1), SHL, ADD,
        ...addr8(L.p, L.k), ...LOAD, ...get(L.vs), ...quantPair(L.lo, L.hi), ...store32Lane(0)]),
      ...whileStep(L.k, 1, L.K, [...get(L.qrow), ...get(L.k), ...i32c(1), SHL, ADD,
        ...addr8(L.p, L.k), ...F64LOAD, ...quantScalar(L.s), ...STORE16]),
    ])),
  ]);

// qcols(xPtr, qPtr, sPtr, batch, R, K, Rp, Kp): x per batch stored (K, R) row-major, logical row
// j = stored column j. Walked row by row (contiguous reads): first the column maxima into s, then
// s[b*R + j] = max(amax, 2^-60) / 127, then q[(b*Rp + j)*Kp + k] (i16) = quant(x[k, j] / s[j])
const ROWS = ['r0', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'r7'];
const I16_LANE = (lane) => simd(0x18, lane), I16_REPLACE = (lane) => simd(0x1a, lane);
const qcolsFn = func(['xPtr', 'qPtr', 'sPtr', 'batch', 'R', 'K', 'Rp', 'Kp'],
  [[I32, ['b', 'j', 'k', 'row', 'sb', 'qk', 'qstride', 'rstride', ...ROWS]], [F64, ['t']], [V128, ['v', 'lo', 'hi', 'vj', 'vj1']]], (L) => {
    const rowAddr = [...get(L.xPtr), ...get(L.b), ...get(L.K), MUL, ...get(L.k), ADD, ...get(L.R), MUL, ...i32c(3), SHL, ADD, ...set(L.row)];
    const qkAddr = [...get(L.qPtr), ...get(L.b), ...get(L.Rp), MUL, ...get(L.Kp), MUL, ...get(L.k), ADD, ...i32c(1), SHL, ADD, ...set(L.qk)];
    return [
      ...clampVectors(L.lo, L.hi),
      ...get(L.Kp), ...i32c(1), SHL, ...set(L.qstride), ...get(L.R), ...i32c(3), SHL, ...set(L.rstride),
      ...forRange(L.b, L.batch, [
        ...get(L.sPtr), ...get(L.b), ...get(L.R), MUL, ...i32c(3), SHL, ADD, ...set(L.sb),
        ...forRange(L.j, L.R, [...addr8(L.sb, L.j), ...f64c(0), ...F64STORE]),
        ...forRange(L.k, L.K, [
          ...rowAddr, ...i32c(0), ...set(L.j),
          ...whileStep(L.j, 2, L.R, [...addr8(L.sb, L.j), ...addr8(L.sb, L.j), ...LOAD, ...addr8(L.row, L.j), ...LOAD, ...X2.abs, ...X2.pmax, ...STORE]),
          ...whileStep(L.j, 1, L.R, [...addr8(L.sb, L.j), ...addr8(L.row, L.j), ...F64LOAD, ...pmaxAbs([...addr8(L.sb, L.j), ...F64LOAD], L.t), ...F64STORE]),
        ]),
        ...forRange(L.j, L.R, [...addr8(L.sb, L.j), ...addr8(L.sb, L.j), ...F64LOAD, ...f64c(2 ** -60), FMAX, ...f64c(127), FDIV, ...F64STORE]),
        // blocks of 8 rows k: each logical row j gets its 8 codes as one 16-byte store (the
        // strided 2-byte stores below thrash the cache when Kp*2 is a large power of two)
        ...i32c(0), ...set(L.k),
        ...whileStep(L.k, 8, L.K, [
          ...rowAddr, ...ROWS.flatMap((r, kk) => [...get(L.row), ...get(L.rstride), ...i32c(kk), MUL, ADD, ...set(L[r])]),
          ...qkAddr, ...i32c(0), ...set(L.j),
          ...whileStep(L.j, 2, L.R, [
            ...ROWS.flatMap((r, kk) => [
              ...addr8(L[r], L.j), ...LOAD, ...addr8(L.sb, L.j), ...LOAD, ...quantPair(L.lo, L.hi), ...set(L.v),
              ...get(L.vj), ...get(L.v), ...I16_LANE(0), ...I16_REPLACE(kk), ...set(L.vj),
              ...get(L.vj1), ...get(L.v), ...I16_LANE(1), ...I16_REPLACE(kk), ...set(L.vj1)]),
            ...get(L.qk), ...get(L.j), ...get(L.qstride), MUL, ADD, ...get(L.vj), ...STORE,
            ...get(L.qk), ...get(L.j), ...i32c(1), ADD, ...get(L.qstride), MUL, ADD, ...get(L.vj1), ...STORE,
          ]),
          ...whileStep(L.j, 1, L.R, [
            ...ROWS.flatMap((r, kk) => [...get(L.vj),
              ...addr8(L[r], L.j), ...F64LOAD, ...addr8(L.sb, L.j), ...F64LOAD, FDIV, FNEAREST,
              ...f64c(-127), FMAX, ...f64c(127), FMIN, ...TRUNC_SAT, ...I16_REPLACE(kk), ...set(L.vj)]),
            ...get(L.qk), ...get(L.j), ...get(L.qstride), MUL, ADD, ...get(L.vj), ...STORE,
          ]),
        ]),
        ...whileStep(L.k, 1, L.K, [
          ...rowAddr, ...qkAddr, ...i32c(0), ...set(L.j),
          ...whileStep(L.j, 2, L.R, [
            ...addr8(L.row, L.j), ...LOAD, ...addr8(L.sb, L.j), ...LOAD, ...quantPair(L.lo, L.hi), ...set(L.v),
            ...get(L.qk), ...get(L.j), ...get(L.qstride), MUL, ADD, ...get(L.v), ...store16Lane(0),
            ...get(L.qk), ...get(L.j), ...i32c(1), ADD, ...get(L.qstride), MUL, ADD, ...get(L.v), ...store16Lane(1),
          ]),
          ...whileStep(L.j, 1, L.R, [...get(L.qk), ...get(L.j), ...get(L.qstride), MUL, ADD,
            ...addr8(L.row, L.j), ...F64LOAD, ...addr8(L.sb, L.j), ...F64LOAD, FDIV, FNEAREST,
            ...f64c(-127), FMAX, ...f64c(127), FMIN, ...TRUNC_SAT, ...STORE16]),
        ]),
      ]),
    ];
  });

// epi(cPtr, srPtr, scPtr, outPtr, batch, M, N, Mp, Np):
// out[(b*M + i)*N + j] = (f64(c[(b*Mp + i)*Np + j]) * sr[b*M + i]) * sc[b*N + j]
const epiFn = func(['cPtr', 'srPtr', 'scPtr', 'outPtr', 'batch', 'M', 'N', 'Mp', 'Np'],
  [[I32, ['b', 'i', 'j', 'crow', 'orow', 'sc0']], [F64, ['sr']], [V128, ['vsr']]], (L) => [
    ...forRange(L.b, L.batch, [
      ...get(L.scPtr), ...get(L.b), ...get(L.N), MUL, ...i32c(3), SHL, ADD, ...set(L.sc0),
      ...forRange(L.i, L.M, [
        ...get(L.srPtr), ...get(L.b), ...get(L.M), MUL, ...get(L.i), ADD, ...i32c(3), SHL, ADD, ...F64LOAD, ...set(L.sr),
        ...get(L.sr), ...X2.splat, ...set(L.vsr),
        ...get(L.cPtr), ...get(L.b), ...get(L.Mp), MUL, ...get(L.i), ADD, ...get(L.Np), MUL, ...i32c(2), SHL, ADD, ...set(L.crow),
        ...get(L.outPtr), ...get(L.b), ...get(L.M), MUL, ...get(L.i), ADD, ...get(L.N), MUL, ...i32c(3), SHL, ADD, ...set(L.orow),
        ...i32c(0), ...set(L.j),
        ...whileStep(L.j, 2, L.N, [...addr8(L.orow, L.j),
          ...get(L.crow), ...get(L.j), ...i32c(2), SHL, ADD, ...LOAD64_ZERO, ...CONVERT_LOW, ...get(L.vsr), ...X2.mul,
          ...addr8(L.sc0, L.j), ...LOAD, ...X2.mul, ...STORE]),
        ...whileStep(L.j, 1, L.N, [...addr8(L.orow, L.j),
          ...get(L.crow), ...get(L.j), ...i32c(2), SHL, ADD, ...I32LOAD, F_OF_I32, ...get(L.sr), FMUL,
          ...addr8(L.sc0, L.j), ...F64LOAD, FMUL, ...F64STORE]),
      ]),
    ]),
  ]);

// --- the audit of a GEMM result computed elsewhere (the GPU engine's results, gpu.js) -----------
// The checks of gpu_gates.js checksumAuditView on the unit's padded operands, the same float64
// arithmetic: every product and partial sum there is an integer below 2^53 (freivaldsVector's R
// sees to it), so every one is exact and f64x2 lanes or any order give the same sums.
// audit(aPtr, bPtr, cPtr, rPtr, brPtr, batch, M, N, K, Kp, Mp, Np) -> 0 when every checked row
// passes, else 1 + (b*M + i) for the first row (b, i) where some |C[b, i, j]| > K * 128^2 (bound)
// or C r != A (B r) (Freivalds). A (batch, Mp, Kp) and B^T (batch, Np, Kp) int16 codes, C
// (batch, Mp, Np) int32, r (N) f64; br: scratch for Kp f64. Rows i < M, columns j < N.
const LOAD32_ZERO = simd(0x5c, 2, 0), EXTEND16 = simd(0xa7), VADD2 = simd(0xf0), VGT2 = simd(0x4a), ANY_TRUE = simd(0x53);
const FADD = 0xa0, F_GT = 0x64, F_NE = 0x62, F_OF_U32 = 0xb8, RETURN = 0x0f;
const when = (cond, body) => [...cond, 0x04, 0x40, ...body, 0x0b];
const auditFn = func(['aPtr', 'bPtr', 'cPtr', 'rPtr', 'brPtr', 'batch', 'M', 'N', 'K', 'Kp', 'Mp', 'Np'],
  [[I32, ['b', 'i', 'j', 'k', 'row']], [F64, ['lhs', 'rhs', 'x', 'bound']], [V128, ['vacc', 'vrj', 'vbound', 'v', 'vmax']]], (L) => {
    const rowNumber = [...get(L.b), ...get(L.M), MUL, ...get(L.i), ADD, ...i32c(1), ADD];   // 1 + b*M + i
    const addr4 = (base, idx) => [...get(base), ...get(idx), ...i32c(2), SHL, ADD];
    const addr2 = (base, idx) => [...get(base), ...get(idx), ...i32c(1), SHL, ADD];
    const codePair = (base, idx) => [...addr2(base, idx), ...LOAD32_ZERO, ...EXTEND16, ...CONVERT_LOW];   // 2 int16 -> f64x2
    const laneSum = (v) => [...get(v), ...extract(0), ...get(v), ...extract(1), FADD];
    return [
      ...get(L.K), F_OF_U32, ...f64c(16384), FMUL, ...tee(L.bound), ...X2.splat, ...set(L.vbound),
      ...forRange(L.b, L.batch, [
        ...i32c(0), ...set(L.k), ...whileStep(L.k, 2, L.Kp, [...addr8(L.brPtr, L.k), ...VZERO, ...STORE]),
        // br[k] = sum_j B[k, j] r[j], walking B^T's rows (k contiguous; Kp is even)
        ...forRange(L.j, L.N, [
          ...addr8(L.rPtr, L.j), ...F64LOAD, ...X2.splat, ...set(L.vrj),
          ...get(L.bPtr), ...get(L.b), ...get(L.Np), MUL, ...get(L.j), ADD, ...get(L.Kp), MUL, ...i32c(1), SHL, ADD, ...set(L.row),
          ...i32c(0), ...set(L.k),
          ...whileStep(L.k, 2, L.Kp, [...addr8(L.brPtr, L.k), ...addr8(L.brPtr, L.k), ...LOAD,
            ...codePair(L.row, L.k), ...get(L.vrj), ...X2.mul, ...VADD2, ...STORE]),
        ]),
        ...forRange(L.i, L.M, [
          // lhs = C[b, i, :] r, with every |C| checked against the bound on the way
          ...get(L.cPtr), ...get(L.b), ...get(L.Mp), MUL, ...get(L.i), ADD, ...get(L.Np), MUL, ...i32c(2), SHL, ADD, ...set(L.row),
          ...VZERO, ...set(L.vacc), ...VZERO, ...set(L.vmax), ...f64c(0), ...set(L.lhs), ...i32c(0), ...set(L.j),
          ...whileStep(L.j, 2, L.N, [
            ...addr4(L.row, L.j), ...LOAD64_ZERO, ...CONVERT_LOW, ...tee(L.v),
            ...X2.abs, ...get(L.vmax), ...X2.pmax, ...set(L.vmax),
            ...get(L.vacc), ...get(L.v), ...addr8(L.rPtr, L.j), ...LOAD, ...X2.mul, ...VADD2, ...set(L.vacc),
          ]),
          ...get(L.vmax), ...get(L.vbound), ...VGT2, ...ANY_TRUE, ...when([], [...rowNumber, RETURN]),
          ...whileStep(L.j, 1, L.N, [
            ...addr4(L.row, L.j), ...I32LOAD, F_OF_I32, ...tee(L.x),
            FABS, ...get(L.bound), F_GT, ...when([], [...rowNumber, RETURN]),
            ...get(L.lhs), ...get(L.x), ...addr8(L.rPtr, L.j), ...F64LOAD, FMUL, FADD, ...set(L.lhs),
          ]),
          ...get(L.lhs), ...laneSum(L.vacc), FADD, ...set(L.lhs),
          // rhs = A[b, i, :] br
          ...get(L.aPtr), ...get(L.b), ...get(L.Mp), MUL, ...get(L.i), ADD, ...get(L.Kp), MUL, ...i32c(1), SHL, ADD, ...set(L.row),
          ...VZERO, ...set(L.vacc), ...i32c(0), ...set(L.k),
          ...whileStep(L.k, 2, L.Kp, [...get(L.vacc), ...codePair(L.row, L.k), ...addr8(L.brPtr, L.k), ...LOAD, ...X2.mul, ...VADD2, ...set(L.vacc)]),
          ...laneSum(L.vacc), ...set(L.rhs),
          ...when([...get(L.lhs), ...get(L.rhs), F_NE], [...rowNumber, RETURN]),
        ]),
      ]),
      ...i32c(0),
    ];
  });

// pack8(srcPtr, dstPtr, n): n int16 codes in [-127, 127] -> n int8 (the GPU kernels' int8x4 words:
// byte k of the run = code k, little-endian lanes); n a multiple of 8. No code saturates.
const NARROW8 = simd(0x65), store64Lane = (lane) => simd(0x5b, 3, 0, lane);
const pack8Fn = func(['src', 'dst', 'n'], [[I32, ['k']]], (L) => [
  ...i32c(0), ...set(L.k),
  ...whileStep(L.k, 16, L.n, [...get(L.dst), ...get(L.k), ADD,
    ...get(L.src), ...get(L.k), ...i32c(1), SHL, ADD, ...LOAD,
    ...get(L.src), ...get(L.k), ...i32c(1), SHL, ADD, ...i32c(16), ADD, ...LOAD, ...NARROW8, ...STORE]),
  ...whileStep(L.k, 8, L.n, [...get(L.dst), ...get(L.k), ADD,
    ...get(L.src), ...get(L.k), ...i32c(1), SHL, ADD, ...LOAD, ...VZERO, ...NARROW8, ...store64Lane(0)]),
]);

export const funcType = (n, results = []) => [0x60, ...vec(new Array(n).fill([I32])), ...vec(results)];
export const GEMM_WASM = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
  ...section(1, vec([funcType(7), funcType(qrowsFn.nParams), funcType(epiFn.nParams), funcType(auditFn.nParams, [I32]), funcType(3)])),
  ...section(3, vec([[0x00], [0x01], [0x01], [0x02], [0x03], [0x04]])),         // gemm, qrows, qcols, epi, audit, pack8
  ...section(5, vec([[0x00, 0x01]])),                                           // memory 0: min 1 page
  ...section(7, vec([[...str('mem'), 0x02, 0x00], [...str('gemm'), 0x00, 0x00],
    [...str('qrows'), 0x00, 0x01], [...str('qcols'), 0x00, 0x02], [...str('epi'), 0x00, 0x03], [...str('audit'), 0x00, 0x04],
    [...str('pack8'), 0x00, 0x05]])),
  ...section(10, vec([body, qrowsFn.body, qcolsFn.body, epiFn.body, auditFn.body, pack8Fn.body].map((b) => [...uleb(b.length), ...b]))),
]);

// --- the engine -------------------------------------------------------------------------------

// -> an engine {name, gemm, gemmBT}, or throws (no WebAssembly / no SIMD / failed compile)
export function createWasmEngine() {
  if (typeof WebAssembly === 'undefined') throw new Error('WebAssembly is not available');
  if (!WebAssembly.validate(GEMM_WASM)) throw new Error('WebAssembly SIMD is not supported here');
  if (!LE_HOST) throw new Error('the wasm engine assumes a little-endian host');
  const inst = new WebAssembly.Instance(new WebAssembly.Module(GEMM_WASM), {});
  const { mem, gemm: kernel, qrows, qcols, epi } = inst.exports;
  const ensure = (bytes) => {
    const need = Math.ceil((bytes - mem.buffer.byteLength) / 65536);
    if (need > 0) mem.grow(need);
  };
  const al = (n) => (n + 15) & ~15;                 // 16-byte aligned region sizes
  const engine = {
    name: 'wasm-simd',
    // int8 (batch, M, K) @ (int8 (batch, N, K))^T -> Int32Array (batch, M, N)
    gemmBT(qa, qbT, nb, m, kk, n) {
      if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
      const kp = (kk + 7) & ~7, mp = m + (m & 1), np = (n + 3) & ~3;
      const aBytes = al(nb * mp * kp * 2), bBytes = al(nb * np * kp * 2), cBytes = nb * mp * np * 4;
      ensure(aBytes + bBytes + cBytes);
      const A = new Int16Array(mem.buffer, 0, aBytes / 2);
      const B = new Int16Array(mem.buffer, aBytes, bBytes / 2);
      if (kp !== kk || mp !== m) A.fill(0);
      if (kp !== kk || np !== n) B.fill(0);
      for (let b = 0; b < nb; b++) {
        if (kp === kk) {
          A.set(qa.subarray(b * m * kk, (b + 1) * m * kk), b * mp * kp);
          B.set(qbT.subarray(b * n * kk, (b + 1) * n * kk), b * np * kp);
        } else {
          for (let r = 0; r < m; r++) A.set(qa.subarray((b * m + r) * kk, (b * m + r + 1) * kk), (b * mp + r) * kp);
          for (let r = 0; r < n; r++) B.set(qbT.subarray((b * n + r) * kk, (b * n + r + 1) * kk), (b * np + r) * kp);
        }
      }
      kernel(0, aBytes, aBytes + bBytes, nb, mp, np, kp);
      const Cw = new Int32Array(mem.buffer, aBytes + bBytes, cBytes / 4);
      if (mp === m && np === n) return Cw.slice();
      const c = new Int32Array(nb * m * n);
      for (let b = 0; b < nb; b++) {
        for (let r = 0; r < m; r++) c.set(Cw.subarray((b * mp + r) * np, (b * mp + r) * np + n), (b * m + r) * n);
      }
      return c;
    },
    // The whole unit in wasm: units.qmatmulT's contract (a holds A or A^T, b holds B or B^T),
    // the same float operations as quantizeRows/quantizeCols/epilogue, the same integer GEMM.
    // The result is copied out of wasm memory into `out` when given, else into a fresh array.
    qmatmulT(a, transA, b, transB, nb, m, kk, n, out = undefined) {
      if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
      const kp = (kk + 7) & ~7, mp = m + (m & 1), np = (n + 3) & ~3;
      const oXa = 0, oXb = oXa + al(a.length * 8), oA = oXb + al(b.length * 8);
      const oB = oA + al(nb * mp * kp * 2), oSa = oB + al(nb * np * kp * 2), oSb = oSa + al(nb * m * 8);
      const oC = oSb + al(nb * n * 8), oOut = oC + al(nb * mp * np * 4), end = oOut + nb * m * n * 8;
      ensure(end);
      const buf = mem.buffer;
      new Float64Array(buf, oXa, a.length).set(a);
      new Float64Array(buf, oXb, b.length).set(b);
      if (kp !== kk || mp !== m) new Int16Array(buf, oA, nb * mp * kp).fill(0);
      if (kp !== kk || np !== n) new Int16Array(buf, oB, nb * np * kp).fill(0);
      // A's logical row i: stored row i of (M, K), or stored column i of (K, M)
      (transA ? qcols : qrows)(oXa, oA, oSa, nb, m, kk, mp, kp);
      // B's logical column j: stored row j of (N, K), or stored column j of (K, N)
      (transB ? qrows : qcols)(oXb, oB, oSb, nb, n, kk, np, kp);
      kernel(oA, oB, oC, nb, mp, np, kp);
      epi(oC, oSa, oSb, oOut, nb, m, n, mp, np);
      const result = new Float64Array(buf, oOut, nb * m * n);
      if (!out) return result.slice();
      out.set(result);
      return out;
    },
    gemm(qa, qb, nb, m, kk, n) {
      const qbT = new Int8Array(nb * n * kk);
      for (let b = 0; b < nb; b++) {
        const o = b * kk * n;
        for (let r = 0; r < kk; r++) for (let c = 0; c < n; c++) qbT[o + c * kk + r] = qb[o + r * n + c];
      }
      return this.gemmBT(qa, qbT, nb, m, kk, n);
    },
  };
  const bad = gateEngine(engine) || gateUnit(engine);
  if (bad) throw new Error(`wasm-simd gemm failed its gate: ${bad}`);
  return engine;
}

// Counter-based int8 values for the gate (no Math.random): a 32-bit LCG
function int8Values(n, seed, lo = -128, hi = 127) {
  const q = new Int8Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; q[i] = lo + ((s >>> 8) % (hi - lo + 1)); }
  return q;
}

// Compare an engine's gemmBT and gemm with the scalar engine over ragged shapes, random values,
// +-127 extremes and accumulators at the int32 bound. -> null, or the first mismatch in words.
export function gateEngine(engine) {
  const cases = [];
  const shapes = [[1, 1, 1, 1], [1, 3, 5, 7], [2, 2, 9, 5], [1, 7, 17, 13], [3, 5, 8, 4], [1, 33, 31, 9],
    [4, 32, 8, 32], [1, 64, 257, 33], [2, 31, 16, 30]];
  shapes.forEach(([nb, m, kk, n], s) => {
    cases.push([nb, m, kk, n, int8Values(nb * m * kk, 11 + s), int8Values(nb * n * kk, 97 + s)]);
    cases.push([nb, m, kk, n, int8Values(nb * m * kk, 5 + s, 127, 127), int8Values(nb * n * kk, 7 + s, -127, -127)]);
  });
  const big = MAX_K;                                                     // |acc| = K*127^2 < 2^31
  cases.push([1, 2, big, 3, new Int8Array(2 * big).fill(127), new Int8Array(3 * big).fill(127)]);
  cases.push([1, 2, big, 3, new Int8Array(2 * big).fill(-127), new Int8Array(3 * big).fill(127)]);
  for (const [nb, m, kk, n, qa, qbT] of cases) {
    const want = cpuEngine.gemmBT(qa, qbT, nb, m, kk, n);
    const got = engine.gemmBT(qa, qbT, nb, m, kk, n);
    for (let x = 0; x < want.length; x++) {
      if (got[x] !== want[x]) return `shape (${nb}, ${m}, ${kk}, ${n}) index ${x}: ${got[x]} vs scalar ${want[x]}`;
    }
    const qb = new Int8Array(nb * kk * n);                             // the (K, N) entry point too
    for (let b = 0; b < nb; b++) for (let r = 0; r < kk; r++) for (let c = 0; c < n; c++) qb[(b * kk + r) * n + c] = qbT[(b * n + c) * kk + r];
    const got2 = engine.gemm(qa, qb, nb, m, kk, n);
    for (let x = 0; x < want.length; x++) {
      if (got2[x] !== want[x]) return `gemm shape (${nb}, ${m}, ${kk}, ${n}) index ${x}: ${got2[x]} vs scalar ${want[x]}`;
    }
  }
  return null;
}

// float64 test values for the unit gate: normals of many magnitudes, exact ties x/s = n + 1/2,
// zeros of both signs, subnormals, values below the scale floor, huge values
function unitValues(n, seed) {
  const x = new Float64Array(n);
  let s = seed >>> 0;
  const next = () => { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; return s; };
  const special = [0, -0, 5e-324, -5e-324, 1e-300, 2 ** -70, 1e300, -1e300, 127, -127, 0.5, 1.5, -2.5, 63.5, -126.5];
  for (let i = 0; i < n; i++) {
    const r = next();
    if (r % 7 === 0) x[i] = special[next() % special.length];
    else x[i] = ((next() >>> 8) * 2 ** -24 - 0.5) * 2 ** ((r >>> 4) % 40 - 20);
  }
  return x;
}

const transposeF64 = (x, nb, R, Cc) => {
  const t = new Float64Array(x.length);
  for (let b = 0; b < nb; b++) for (let i = 0; i < R; i++) for (let j = 0; j < Cc; j++) t[b * R * Cc + j * R + i] = x[b * R * Cc + i * Cc + j];
  return t;
};
const sameBits = (x, y) => x === y && (x !== 0 || Object.is(x, y)) || (x !== x && y !== y);

// The fused wasm unit against the JS unit (units.js quantizers, scalar GEMM, epilogue), all four
// transpose cases. -> null, or the first mismatch in words.
export function gateUnit(engine) {
  const shapes = [[1, 1, 1, 1], [1, 3, 5, 7], [2, 5, 9, 3], [4, 8, 8, 8], [1, 17, 33, 9], [3, 2, 16, 5]];
  let seed = 1;
  for (const [nb, m, kk, n] of shapes) {
    const A = unitValues(nb * m * kk, seed++), B = unitValues(nb * kk * n, seed++);
    const qa = quantizeRows(A, nb, m, kk), qb = quantizeCols(B, nb, kk, n);
    const want = epilogue(cpuEngine.gemm(qa.q, qb.q, nb, m, kk, n), qa.s, qb.s, nb, m, n);
    for (const ta of [false, true]) for (const tb of [false, true]) {
      const got = engine.qmatmulT(ta ? transposeF64(A, nb, m, kk) : A, ta, tb ? transposeF64(B, nb, kk, n) : B, tb, nb, m, kk, n);
      for (let x = 0; x < want.length; x++) {
        if (!sameBits(got[x], want[x])) return `unit (${nb}, ${m}, ${kk}, ${n}) transA=${ta} transB=${tb} index ${x}: ${got[x]} vs JS ${want[x]}`;
      }
    }
  }
  return null;
}
