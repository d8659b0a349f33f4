// The WebAssembly SIMD integer engine: the same exact int8 GEMM as units.cpuEngine, faster.
// The module is written with the assembler of wasm_asm.js (no build step, no toolchain). Its
// exports: mem; the float ends of the unit qrows, qcols, epi (below); audit and pack8 for the GPU
// engine's wasm host (gpu/wasm_host.js, gated there); and the GEMM
//   gemm(aPtr, bPtr, cPtr, batch, M, N, Kp)
// over int16 operands in its memory, A (batch, M, Kp) and B^T (batch, N, Kp), K zero-padded to
// Kp (a multiple of 8), M even, N a multiple of 4; C (batch, M, N) int32. Inner step: 8 products
// by i32x4.dot_i16x8_s, accumulated in i32x4 lanes; a lane sum is exact because wasm i32 adds
// wrap mod 2^32 and the true total fits int32 (K <= MAX_K), so no float and no rounding anywhere.
// engines.js gates it (gateEngine, gateUnit below: random, ragged and extreme inputs against
// the scalar engine) and does not offer it when it disagrees or WebAssembly SIMD is missing.
import { LITTLE_ENDIAN } from './host.js';
import { sameBits } from './bits.js';
import { cpuEngine, MAX_K, quantizeRows, quantizeCols, epilogue } from './units.js';
import {
  Module, local, loop, br_if, if_, return_, select, i32, f64, v128, V128_ZERO, i8x16, i16x8, i32x4, f64x2,
  whileStep, forRange, addr8,
} from './wasm_asm.js';

const gemmModule = new Module();

// --- the GEMM -----------------------------------------------------------------------------------
// shuffle32(lanes): of the 8 i32 lanes of the two vectors on the stack (0-3 the first, 4-7 the
// second), the 4 named by lanes
const shuffle32 = (lanes) => i8x16.shuffle(...lanes.flatMap((l) => [4 * l, 4 * l + 1, 4 * l + 2, 4 * l + 3]));
const ACC = ['acc0', 'acc1', 'acc2', 'acc3', 'acc4', 'acc5', 'acc6', 'acc7'];   // ACC[r*4 + c]: row r of 2, column c of 4
const PB = ['pb0', 'pb1', 'pb2', 'pb3'];                                          // B^T rows j..j+3
gemmModule.func('gemm', {
  params: 'aPtr bPtr cPtr batch M N Kp',
  locals: `bi i j k pa0 pa1 ${PB.join(' ')} rowB aBase bBase cBase cRow ${ACC.map((a) => `${a}:v128`).join(' ')}
    va0:v128 va1:v128 vb:v128 s23:v128 s01:v128`,
}, (L) => {
  const acc = ACC.map((a) => L[a]);
  // hsum4(a, b, c, d) -> [sum a, sum b, sum c, sum d] (exact wrapping i32 adds)
  const hsum4 = (a, b, c, d) => [
    local.get(a), local.get(b), shuffle32([0, 1, 4, 5]), local.get(a), local.get(b), shuffle32([2, 3, 6, 7]), i32x4.add,
    local.get(c), local.get(d), shuffle32([0, 1, 4, 5]), local.get(c), local.get(d), shuffle32([2, 3, 6, 7]), i32x4.add,
    local.set(L.s23), local.set(L.s01),
    local.get(L.s01), local.get(L.s23), shuffle32([0, 2, 4, 6]), local.get(L.s01), local.get(L.s23), shuffle32([1, 3, 5, 7]), i32x4.add,
  ];
  const kBody = [
    local.get(L.pa0), local.get(L.k), i32.add, v128.load(), local.set(L.va0),
    local.get(L.pa1), local.get(L.k), i32.add, v128.load(), local.set(L.va1),
    PB.map((pb, c) => [
      local.get(L[pb]), local.get(L.k), i32.add, v128.load(), local.set(L.vb),
      local.get(acc[c]), local.get(L.va0), local.get(L.vb), i32x4.dot_i16x8_s, i32x4.add, local.set(acc[c]),
      local.get(acc[4 + c]), local.get(L.va1), local.get(L.vb), i32x4.dot_i16x8_s, i32x4.add, local.set(acc[4 + c]),
    ]),
    local.get(L.k), i32.const(16), i32.add, local.set(L.k),
    local.get(L.k), local.get(L.rowB), i32.lt_u, br_if(0),
  ];
  const jBody = [
    local.get(L.bBase), local.get(L.j), local.get(L.rowB), i32.mul, i32.add, local.set(L.pb0),
    local.get(L.pb0), local.get(L.rowB), i32.add, local.set(L.pb1),
    local.get(L.pb1), local.get(L.rowB), i32.add, local.set(L.pb2),
    local.get(L.pb2), local.get(L.rowB), i32.add, local.set(L.pb3),
    acc.map((a) => [V128_ZERO, local.set(a)]),
    i32.const(0), local.set(L.k),
    loop(kBody),
    local.get(L.cRow), local.get(L.j), i32.const(2), i32.shl, i32.add, hsum4(acc[0], acc[1], acc[2], acc[3]), v128.store(),
    local.get(L.cRow), local.get(L.N), local.get(L.j), i32.add, i32.const(2), i32.shl, i32.add, hsum4(acc[4], acc[5], acc[6], acc[7]), v128.store(),
    local.get(L.j), i32.const(4), i32.add, local.set(L.j),
    local.get(L.j), local.get(L.N), i32.lt_u, br_if(0),
  ];
  const iBody = [
    local.get(L.aBase), local.get(L.i), local.get(L.rowB), i32.mul, i32.add, local.set(L.pa0),
    local.get(L.pa0), local.get(L.rowB), i32.add, local.set(L.pa1),
    local.get(L.cBase), local.get(L.i), local.get(L.N), i32.mul, i32.const(2), i32.shl, i32.add, local.set(L.cRow),
    i32.const(0), local.set(L.j),
    loop(jBody),
    local.get(L.i), i32.const(2), i32.add, local.set(L.i),
    local.get(L.i), local.get(L.M), i32.lt_u, br_if(0),
  ];
  const bBody = [
    local.get(L.aPtr), local.get(L.bi), local.get(L.M), i32.mul, local.get(L.rowB), i32.mul, i32.add, local.set(L.aBase),
    local.get(L.bPtr), local.get(L.bi), local.get(L.N), i32.mul, local.get(L.rowB), i32.mul, i32.add, local.set(L.bBase),
    local.get(L.cPtr), local.get(L.bi), local.get(L.M), i32.mul, local.get(L.N), i32.mul, i32.const(2), i32.shl, i32.add, local.set(L.cBase),
    i32.const(0), local.set(L.i),
    loop(iBody),
    local.get(L.bi), i32.const(1), i32.add, local.set(L.bi),
    local.get(L.bi), local.get(L.batch), i32.lt_u, br_if(0),
  ];
  return [
    local.get(L.Kp), i32.const(1), i32.shl, local.set(L.rowB),        // bytes per operand row
    i32.const(0), local.set(L.bi),
    loop(bBody),
  ];
});

// --- the float ends of the unit, also in wasm (IEEE-754 basic ops, correctly rounded, no FTZ,
// exactly the operations of units.quantizeRows / quantizeCols / epilogue on every element; the
// f64x2 lanes are two independent IEEE float64 operations, so SIMD changes no bit) ------------
// f64 / f64x2 on the stack, divided by s: clamp(nearest(x / s), -127, 127) as i32 / i16 lanes.
// f64x2.pmin(a, b) = b < a ? b : a and pmax(a, b) = a < b ? b : a: the comparisons of units.js
// itself (amax: a > amax; clamp: v > 127, v < -127), one minpd/maxpd each
const quantScalar = (s) => [local.get(s), f64.div, f64.nearest, f64.const(-127), f64.max, f64.const(127), f64.min, i32.trunc_sat_f64_s];
const quantPair = (lo, hi) => [f64x2.div, f64x2.nearest, local.get(lo), f64x2.pmax, local.get(hi), f64x2.pmin,
i32x4.trunc_sat_f64x2_s_zero, V128_ZERO, i16x8.narrow_i32x4_s];                    // i16 lanes 0, 1
// amax = amax < t ? t : amax with t = |x| (x f64 on the stack), the scalar twin of pmax: NaN never enters
const pmaxAbs = (amaxCode, t) => [f64.abs, local.tee(t), amaxCode, amaxCode, local.get(t), f64.lt, select];
const clampVectors = (lo, hi) => [f64.const(-127), f64x2.splat, local.set(lo), f64.const(127), f64x2.splat, local.set(hi)];

// qrows(xPtr, qPtr, sPtr, batch, R, K, Rp, Kp): row (b, i) of x is the K contiguous f64 at
// x[(b*R + i)*K]; s[b*R + i] = max(max|x|, 2^-60) / 127; q[(b*Rp + i)*Kp + k] (i16) = quant(x / s)
gemmModule.func('qrows', {
params: 'xPtr qPtr sPtr batch R K Rp Kp',
locals: 'b i k p qrow amax:f64 s:f64 t:f64 vmax:v128 vs:v128 lo:v128 hi:v128',
}, (L) => [
  clampVectors(L.lo, L.hi),
  forRange(L.b, L.batch, forRange(L.i, L.R, [
    local.get(L.xPtr), local.get(L.b), local.get(L.R), i32.mul, local.get(L.i), i32.add, local.get(L.K), i32.mul, i32.const(3), i32.shl, i32.add, local.set(L.p),
    V128_ZERO, local.set(L.vmax), i32.const(0), local.set(L.k),
    whileStep(L.k, 2, L.K, [local.get(L.vmax), addr8(L.p, L.k), v128.load(), f64x2.abs, f64x2.pmax, local.set(L.vmax)]),
    local.get(L.vmax), f64x2.extract_lane(0), local.get(L.vmax), f64x2.extract_lane(1), f64.max, local.set(L.amax),
    whileStep(L.k, 1, L.K, [addr8(L.p, L.k), f64.load(), pmaxAbs(local.get(L.amax), L.t), local.set(L.amax)]),
    local.get(L.amax), f64.const(2 ** -60), f64.max, f64.const(127), f64.div, local.set(L.s),
    local.get(L.sPtr), local.get(L.b), local.get(L.R), i32.mul, local.get(L.i), i32.add, i32.const(3), i32.shl, i32.add, local.get(L.s), f64.store(),
    local.get(L.s), f64x2.splat, local.set(L.vs),
    local.get(L.qPtr), local.get(L.b), local.get(L.Rp), i32.mul, local.get(L.i), i32.add, local.get(L.Kp), i32.mul, i32.const(1), i32.shl, i32.add, local.set(L.qrow),
    i32.const(0), local.set(L.k),
    whileStep(L.k, 2, L.K, [local.get(L.qrow), local.get(L.k), i32.const(1), i32.shl, i32.add,
      addr8(L.p, L.k), v128.load(), local.get(L.vs), quantPair(L.lo, L.hi), v128.store32_lane(0)]),
    whileStep(L.k, 1, L.K, [local.get(L.qrow), local.get(L.k), i32.const(1), i32.shl, i32.add,
      addr8(L.p, L.k), f64.load(), quantScalar(L.s), i32.store16()]),
  ])),
]);

// qcols(xPtr, qPtr, sPtr, batch, R, K, Rp, Kp): x per batch stored (K, R) row-major, logical row
// j = stored column j. Walked row by row (contiguous reads): first the column maxima into s, then
// s[b*R + j] = max(amax, 2^-60) / 127, then q[(b*Rp + j)*Kp + k] (i16) = quant(x[k, j] / s[j])
const ROWS = ['r0', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'r7'];
const qcolsBody = (ldName) => (L) => {
  const rowAddr = [local.get(L.xPtr), local.get(L.b), local.get(L.K), i32.mul, local.get(L.k), i32.add, local.get(L[ldName]), i32.mul, i32.const(3), i32.shl, i32.add, local.set(L.row)];
  const qkAddr = [local.get(L.qPtr), local.get(L.b), local.get(L.Rp), i32.mul, local.get(L.Kp), i32.mul, local.get(L.k), i32.add, i32.const(1), i32.shl, i32.add, local.set(L.qk)];
  return [
    clampVectors(L.lo, L.hi),
    local.get(L.Kp), i32.const(1), i32.shl, local.set(L.qstride), local.get(L[ldName]), i32.const(3), i32.shl, local.set(L.rstride),
    forRange(L.b, L.batch, [
      local.get(L.sPtr), local.get(L.b), local.get(L.R), i32.mul, i32.const(3), i32.shl, i32.add, local.set(L.sb),
      forRange(L.j, L.R, [addr8(L.sb, L.j), f64.const(0), f64.store()]),
      forRange(L.k, L.K, [
        rowAddr, i32.const(0), local.set(L.j),
        whileStep(L.j, 2, L.R, [addr8(L.sb, L.j), addr8(L.sb, L.j), v128.load(), addr8(L.row, L.j), v128.load(), f64x2.abs, f64x2.pmax, v128.store()]),
        whileStep(L.j, 1, L.R, [addr8(L.sb, L.j), addr8(L.row, L.j), f64.load(), pmaxAbs([addr8(L.sb, L.j), f64.load()], L.t), f64.store()]),
      ]),
      forRange(L.j, L.R, [addr8(L.sb, L.j), addr8(L.sb, L.j), f64.load(), f64.const(2 ** -60), f64.max, f64.const(127), f64.div, f64.store()]),
      // blocks of 8 rows k: each logical row j gets its 8 codes as one 16-byte store (the
      // strided 2-byte stores below thrash the cache when Kp*2 is a large power of two)
      i32.const(0), local.set(L.k),
      whileStep(L.k, 8, L.K, [
        rowAddr, ROWS.flatMap((r, kk) => [local.get(L.row), local.get(L.rstride), i32.const(kk), i32.mul, i32.add, local.set(L[r])]),
        qkAddr, i32.const(0), local.set(L.j),
        whileStep(L.j, 2, L.R, [
          ROWS.flatMap((r, kk) => [
            addr8(L[r], L.j), v128.load(), addr8(L.sb, L.j), v128.load(), quantPair(L.lo, L.hi), local.set(L.v),
            local.get(L.vj), local.get(L.v), i16x8.extract_lane_s(0), i16x8.replace_lane(kk), local.set(L.vj),
            local.get(L.vj1), local.get(L.v), i16x8.extract_lane_s(1), i16x8.replace_lane(kk), local.set(L.vj1)]),
          local.get(L.qk), local.get(L.j), local.get(L.qstride), i32.mul, i32.add, local.get(L.vj), v128.store(),
          local.get(L.qk), local.get(L.j), i32.const(1), i32.add, local.get(L.qstride), i32.mul, i32.add, local.get(L.vj1), v128.store(),
        ]),
        whileStep(L.j, 1, L.R, [
          ROWS.flatMap((r, kk) => [local.get(L.vj),
            addr8(L[r], L.j), f64.load(), addr8(L.sb, L.j), f64.load(), f64.div, f64.nearest,
            f64.const(-127), f64.max, f64.const(127), f64.min, i32.trunc_sat_f64_s, i16x8.replace_lane(kk), local.set(L.vj)]),
          local.get(L.qk), local.get(L.j), local.get(L.qstride), i32.mul, i32.add, local.get(L.vj), v128.store(),
        ]),
      ]),
      whileStep(L.k, 1, L.K, [
        rowAddr, qkAddr, i32.const(0), local.set(L.j),
        whileStep(L.j, 2, L.R, [
          addr8(L.row, L.j), v128.load(), addr8(L.sb, L.j), v128.load(), quantPair(L.lo, L.hi), local.set(L.v),
          local.get(L.qk), local.get(L.j), local.get(L.qstride), i32.mul, i32.add, local.get(L.v), v128.store16_lane(0),
          local.get(L.qk), local.get(L.j), i32.const(1), i32.add, local.get(L.qstride), i32.mul, i32.add, local.get(L.v), v128.store16_lane(1),
        ]),
        whileStep(L.j, 1, L.R, [local.get(L.qk), local.get(L.j), local.get(L.qstride), i32.mul, i32.add,
          addr8(L.row, L.j), f64.load(), addr8(L.sb, L.j), f64.load(), f64.div, f64.nearest,
          f64.const(-127), f64.max, f64.const(127), f64.min, i32.trunc_sat_f64_s, i32.store16()]),
      ]),
    ]),
  ];
};
const QCOLS_LOCALS = `b j k row sb qk qstride rstride ${ROWS.join(' ')} t:f64 v:v128 lo:v128 hi:v128 vj:v128 vj1:v128`;
gemmModule.func('qcols', { params: 'xPtr qPtr sPtr batch R K Rp Kp', locals: QCOLS_LOCALS }, qcolsBody('R'));

// epi(cPtr, srPtr, scPtr, outPtr, batch, M, N, Mp, Np):
// out[(b*M + i)*N + j] = (f64(c[(b*Mp + i)*Np + j]) * sr[b*M + i]) * sc[b*N + j]
gemmModule.func('epi', {
  params: 'cPtr srPtr scPtr outPtr batch M N Mp Np',
  locals: 'b i j crow orow sc0 sr:f64 vsr:v128',
}, (L) => [
  forRange(L.b, L.batch, [
    local.get(L.scPtr), local.get(L.b), local.get(L.N), i32.mul, i32.const(3), i32.shl, i32.add, local.set(L.sc0),
    forRange(L.i, L.M, [
      local.get(L.srPtr), local.get(L.b), local.get(L.M), i32.mul, local.get(L.i), i32.add, i32.const(3), i32.shl, i32.add, f64.load(), local.set(L.sr),
      local.get(L.sr), f64x2.splat, local.set(L.vsr),
      local.get(L.cPtr), local.get(L.b), local.get(L.Mp), i32.mul, local.get(L.i), i32.add, local.get(L.Np), i32.mul, i32.const(2), i32.shl, i32.add, local.set(L.crow),
      local.get(L.outPtr), local.get(L.b), local.get(L.M), i32.mul, local.get(L.i), i32.add, local.get(L.N), i32.mul, i32.const(3), i32.shl, i32.add, local.set(L.orow),
      i32.const(0), local.set(L.j),
      whileStep(L.j, 2, L.N, [addr8(L.orow, L.j),
        local.get(L.crow), local.get(L.j), i32.const(2), i32.shl, i32.add, v128.load64_zero(), f64x2.convert_low_i32x4_s, local.get(L.vsr), f64x2.mul,
        addr8(L.sc0, L.j), v128.load(), f64x2.mul, v128.store()]),
      whileStep(L.j, 1, L.N, [addr8(L.orow, L.j),
        local.get(L.crow), local.get(L.j), i32.const(2), i32.shl, i32.add, i32.load(), f64.convert_i32_s, local.get(L.sr), f64.mul,
        addr8(L.sc0, L.j), f64.load(), f64.mul, f64.store()]),
    ]),
  ]),
]);

// --- the audit of a GEMM result computed elsewhere (the GPU engine's, gpu/engine.js) ------------
// The checks of gpu_gates.js checksumAuditView on the unit's padded operands, the same float64
// arithmetic: every product and partial sum there is an integer below 2^53 (freivaldsVector's R
// sees to it), so every one is exact and f64x2 lanes or any order give the same sums.
// audit(aPtr, bPtr, cPtr, rPtr, brPtr, batch, M, N, K, Kp, Mp, Np) -> 0 when every checked row
// passes, else 1 + (b*M + i) for the first row (b, i) where some |C[b, i, j]| > K * 128^2 (bound)
// or C r != A (B r) (Freivalds). A (batch, Mp, Kp) and B^T (batch, Np, Kp) int16 codes, C
// (batch, Mp, Np) int32, r (N) f64; br: scratch for Kp f64. Rows i < M, columns j < N.
gemmModule.func('audit', {
  params: 'aPtr bPtr cPtr rPtr brPtr batch M N K Kp Mp Np', result: 'i32',
  locals: 'b i j k row lhs:f64 rhs:f64 x:f64 bound:f64 vacc:v128 vrj:v128 vbound:v128 v:v128 vmax:v128',
}, (L) => {
  const rowNumber = [local.get(L.b), local.get(L.M), i32.mul, local.get(L.i), i32.add, i32.const(1), i32.add];   // 1 + b*M + i
  const addr4 = (base, idx) => [local.get(base), local.get(idx), i32.const(2), i32.shl, i32.add];
  const addr2 = (base, idx) => [local.get(base), local.get(idx), i32.const(1), i32.shl, i32.add];
  const codePair = (base, idx) => [addr2(base, idx), v128.load32_zero(), i32x4.extend_low_i16x8_s, f64x2.convert_low_i32x4_s];   // 2 int16 -> f64x2
  const laneSum = (v) => [local.get(v), f64x2.extract_lane(0), local.get(v), f64x2.extract_lane(1), f64.add];
  return [
    local.get(L.K), f64.convert_i32_u, f64.const(16384), f64.mul, local.tee(L.bound), f64x2.splat, local.set(L.vbound),
    forRange(L.b, L.batch, [
      i32.const(0), local.set(L.k), whileStep(L.k, 2, L.Kp, [addr8(L.brPtr, L.k), V128_ZERO, v128.store()]),
      // br[k] = sum_j B[k, j] r[j], walking B^T's rows (k contiguous; Kp is even)
      forRange(L.j, L.N, [
        addr8(L.rPtr, L.j), f64.load(), f64x2.splat, local.set(L.vrj),
        local.get(L.bPtr), local.get(L.b), local.get(L.Np), i32.mul, local.get(L.j), i32.add, local.get(L.Kp), i32.mul, i32.const(1), i32.shl, i32.add, local.set(L.row),
        i32.const(0), local.set(L.k),
        whileStep(L.k, 2, L.Kp, [addr8(L.brPtr, L.k), addr8(L.brPtr, L.k), v128.load(),
          codePair(L.row, L.k), local.get(L.vrj), f64x2.mul, f64x2.add, v128.store()]),
      ]),
      forRange(L.i, L.M, [
        // lhs = C[b, i, :] r, with every |C| checked against the bound on the way
        local.get(L.cPtr), local.get(L.b), local.get(L.Mp), i32.mul, local.get(L.i), i32.add, local.get(L.Np), i32.mul, i32.const(2), i32.shl, i32.add, local.set(L.row),
        V128_ZERO, local.set(L.vacc), V128_ZERO, local.set(L.vmax), f64.const(0), local.set(L.lhs), i32.const(0), local.set(L.j),
        whileStep(L.j, 2, L.N, [
          addr4(L.row, L.j), v128.load64_zero(), f64x2.convert_low_i32x4_s, local.tee(L.v),
          f64x2.abs, local.get(L.vmax), f64x2.pmax, local.set(L.vmax),
          local.get(L.vacc), local.get(L.v), addr8(L.rPtr, L.j), v128.load(), f64x2.mul, f64x2.add, local.set(L.vacc),
        ]),
        local.get(L.vmax), local.get(L.vbound), f64x2.gt, v128.any_true, if_([rowNumber, return_]),
        whileStep(L.j, 1, L.N, [
          addr4(L.row, L.j), i32.load(), f64.convert_i32_s, local.tee(L.x),
          f64.abs, local.get(L.bound), f64.gt, if_([rowNumber, return_]),
          local.get(L.lhs), local.get(L.x), addr8(L.rPtr, L.j), f64.load(), f64.mul, f64.add, local.set(L.lhs),
        ]),
        local.get(L.lhs), laneSum(L.vacc), f64.add, local.set(L.lhs),
        // rhs = A[b, i, :] br
        local.get(L.aPtr), local.get(L.b), local.get(L.Mp), i32.mul, local.get(L.i), i32.add, local.get(L.Kp), i32.mul, i32.const(1), i32.shl, i32.add, local.set(L.row),
        V128_ZERO, local.set(L.vacc), i32.const(0), local.set(L.k),
        whileStep(L.k, 2, L.Kp, [local.get(L.vacc), codePair(L.row, L.k), addr8(L.brPtr, L.k), v128.load(), f64x2.mul, f64x2.add, local.set(L.vacc)]),
        laneSum(L.vacc), local.set(L.rhs),
        local.get(L.lhs), local.get(L.rhs), f64.ne, if_([rowNumber, return_]),
      ]),
    ]),
    i32.const(0),
  ];
});

// pack8(srcPtr, dstPtr, n): n int16 codes in [-127, 127] -> n int8 (the GPU kernels' int8x4 words:
// byte k of the run = code k, little-endian lanes); n a multiple of 8. No code saturates.
gemmModule.func('pack8', { params: 'src dst n', locals: 'k' }, (L) => [
  i32.const(0), local.set(L.k),
  whileStep(L.k, 16, L.n, [local.get(L.dst), local.get(L.k), i32.add,
    local.get(L.src), local.get(L.k), i32.const(1), i32.shl, i32.add, v128.load(),
    local.get(L.src), local.get(L.k), i32.const(1), i32.shl, i32.add, i32.const(16), i32.add, v128.load(), i8x16.narrow_i16x8_s, v128.store()]),
  whileStep(L.k, 8, L.n, [local.get(L.dst), local.get(L.k), i32.add,
    local.get(L.src), local.get(L.k), i32.const(1), i32.shl, i32.add, v128.load(), V128_ZERO, i8x16.narrow_i16x8_s, v128.store64_lane(0)]),
]);


// qcolsLd(..., ld): qcols over R columns of a wider (K, ld) store (x at its first column): the
// same operations per logical row, so a worker thread can quantize a slice of the columns
gemmModule.func('qcolsLd', { params: 'xPtr qPtr sPtr batch R K Rp Kp ld', locals: QCOLS_LOCALS }, qcolsBody('ld'));

export const GEMM_WASM = gemmModule.bytes();
// the same module over an imported shared memory of at most maxPages (cpu/threads.js)
export const gemmWasmShared = (maxPages) => gemmModule.bytes({ sharedMaxPages: maxPages });

// --- the engine -------------------------------------------------------------------------------

// -> an engine {name, gemm, gemmBT, qmatmulT}, not yet gated; throws (no WebAssembly / no SIMD /
// failed compile)
export function createWasmEngine() {
  if (typeof WebAssembly === 'undefined') throw new Error('WebAssembly is not available');
  if (!WebAssembly.validate(GEMM_WASM)) throw new Error('WebAssembly SIMD is not supported here');
  if (!LITTLE_ENDIAN) throw new Error('the wasm engine assumes a little-endian host');
  const inst = new WebAssembly.Instance(new WebAssembly.Module(GEMM_WASM), {});
  const { mem, gemm: kernel, qrows, qcols, qcolsLd, epi } = inst.exports;
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
    // r0, r1: only A's logical rows [r0, r1) of every batch, so the result is (nb, r1 - r0, N) —
    // each row's codes, scale and products are the whole unit's (every step is per row or exact),
    // which cpu/unit_workers.js's slices rely on. The result is copied out of wasm memory into `out`
    // when given, else into a fresh array.
    qmatmulT(a, transA, b, transB, nb, m, kk, n, out = undefined, r0 = 0, r1 = m) {
      if (kk > MAX_K) throw new Error(`K=${kk} could overflow int32`);
      if (!(Number.isInteger(r0) && Number.isInteger(r1) && r0 >= 0 && r0 <= r1 && r1 <= m)) throw new RangeError(`rows [${r0}, ${r1}) of ${m}`);
      if (r0 === r1) return out || new Float64Array(0);
      const rows = r1 - r0, kp = (kk + 7) & ~7, mp = rows + (rows & 1), np = (n + 3) & ~3;
      // A's part in wasm memory: its rows [r0, r1) alone as (nb, rows, K) when A is stored by
      // rows; all of A^T (K, M) otherwise, its columns picked by qcolsLd (stride M)
      const aPart = rows === m || transA ? a.length : nb * rows * kk;
      const oXa = 0, oXb = oXa + al(aPart * 8), oA = oXb + al(b.length * 8);
      const oB = oA + al(nb * mp * kp * 2), oSa = oB + al(nb * np * kp * 2), oSb = oSa + al(nb * rows * 8);
      const oC = oSb + al(nb * n * 8), oOut = oC + al(nb * mp * np * 4), end = oOut + nb * rows * n * 8;
      ensure(end);
      const buf = mem.buffer, xa = new Float64Array(buf, oXa, aPart);
      if (aPart === a.length) xa.set(a);
      else for (let bi = 0; bi < nb; bi++) xa.set(a.subarray((bi * m + r0) * kk, (bi * m + r1) * kk), bi * rows * kk);
      new Float64Array(buf, oXb, b.length).set(b);
      if (kp !== kk || mp !== rows) new Int16Array(buf, oA, nb * mp * kp).fill(0);
      if (kp !== kk || np !== n) new Int16Array(buf, oB, nb * np * kp).fill(0);
      // A's logical row i: stored row i of (M, K), or stored column i of (K, M)
      if (!transA) qrows(oXa, oA, oSa, nb, rows, kk, mp, kp);
      else if (rows === m) qcols(oXa, oA, oSa, nb, m, kk, mp, kp);
      else for (let bi = 0; bi < nb; bi++) qcolsLd(oXa + (bi * kk * m + r0) * 8, oA + bi * mp * kp * 2, oSa + bi * rows * 8, 1, rows, kk, mp, kp, m);
      // B's logical column j: stored row j of (N, K), or stored column j of (K, N)
      (transB ? qrows : qcols)(oXb, oB, oSb, nb, n, kk, np, kp);
      kernel(oA, oB, oC, nb, mp, np, kp);
      epi(oC, oSa, oSb, oOut, nb, rows, n, mp, np);
      const result = new Float64Array(buf, oOut, nb * rows * n);
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

// The unit gate's cases, all four transpose cases per shape: [what, qmatmulT's arguments, the JS
// unit's result (units.js quantizers, scalar GEMM, epilogue)]
function* unitGateCases() {
  const shapes = [[1, 1, 1, 1], [1, 3, 5, 7], [2, 5, 9, 3], [4, 8, 8, 8], [1, 17, 33, 9], [3, 2, 16, 5]];
  let seed = 1;
  for (const [nb, m, kk, n] of shapes) {
    const A = unitValues(nb * m * kk, seed++), B = unitValues(nb * kk * n, seed++);
    const qa = quantizeRows(A, nb, m, kk), qb = quantizeCols(B, nb, kk, n);
    const want = epilogue(cpuEngine.gemm(qa.q, qb.q, nb, m, kk, n), qa.s, qb.s, nb, m, n);
    for (const ta of [false, true]) for (const tb of [false, true]) {
      yield [`unit (${nb}, ${m}, ${kk}, ${n}) transA=${ta} transB=${tb}`,
        [ta ? transposeF64(A, nb, m, kk) : A, ta, tb ? transposeF64(B, nb, kk, n) : B, tb, nb, m, kk, n], want];
    }
  }
}
const unitMismatch = (what, got, want) => {
  for (let x = 0; x < want.length; x++) if (!sameBits(got[x], want[x])) return `${what} index ${x}: ${got[x]} vs JS ${want[x]}`;
  return null;
};

// The fused wasm unit against the JS unit. -> null, or the first mismatch in words.
export function gateUnit(engine) {
  for (const [what, args, want] of unitGateCases()) {
    const bad = unitMismatch(what, engine.qmatmulT(...args), want);
    if (bad) return bad;
  }
  return null;
}

// the same gate for an engine whose qmatmulT answers later (cpu/unit_workers.js)
export async function gateUnitAsync(engine) {
  for (const [what, args, want] of unitGateCases()) {
    const bad = unitMismatch(what, await engine.qmatmulT(...args), want);
    if (bad) return bad;
  }
  return null;
}
