// Deterministic float helpers from IEEE-754 basic operations only, mirroring daisy/detmath.py
// operation for operation (float64 everywhere). Never Math.exp/log/pow/tanh in the step:
// engines differ. Math.sqrt, + - * / are correctly rounded in every JS engine.

export const LN2_HI = 0.6931471803691238;      // 0x3fe62e42fee00000
export const LN2_LO = 1.9082149292705877e-10;  // 0x3dea39ef35793c76
export const INV_LN2 = 1.4426950408889634;
export const EXP_MIN = -708.0;
export const EXP_MAX = 709.0;
// 1/n! for n = 0..13 and 1/(2n+1) for n = 0..11: each one correctly rounded division, as in Python.
const FACT = [1, 1, 2, 6, 24, 120, 720, 5040, 40320, 362880, 3628800, 39916800, 479001600, 6227020800];
export const EXP_COEFFS = FACT.map((f) => 1.0 / f);
export const LOG_COEFFS = Array.from({ length: 12 }, (_, n) => 1.0 / (2 * n + 1));
export const SQRT_HALF = 0.7071067811865476;

const TWO52 = 2 ** 52;

// Round to nearest, ties to even (np.rint), sign of zero kept (rint(-0.3) = -0).
// For |x| < 2^52, (|x| + 2^52) - 2^52 rounds |x| to an integer in the default rounding mode.
export function rint(x) {
  if (x < 0) return x > -TWO52 ? -((TWO52 - x) - TWO52) : x;
  if (x === 0) return x;                                 // +0 and -0 unchanged
  return x < TWO52 ? (x + TWO52) - TWO52 : x;            // NaN falls through unchanged
}

// Bit access to one float64 (little- or big-endian host: DataView fixes the byte order).
const bitsView = new DataView(new ArrayBuffer(8));

// 2^k as a float64 built from its bits, for -1022 <= k <= 1023 (exact).
function pow2(k) {
  bitsView.setUint32(0, (k + 1023) << 20);     // big-endian high word: sign 0, exponent k+1023
  bitsView.setUint32(4, 0);
  return bitsView.getFloat64(0);
}

// 2^k for k = -1022..1023, built once from bits: exp's scaling is one table read and one multiply
const POW2 = Float64Array.from({ length: 2046 }, (_, i) => pow2(i - 1022));

// x * 2^n rounded once (musl scalbn): intermediate scalings are exact, only the last rounds.
export function ldexp(x, n) {
  let y = x;
  if (n > 1023) {
    y *= pow2(1023); n -= 1023;
    if (n > 1023) { y *= pow2(1023); n -= 1023; if (n > 1023) n = 1023; }
  } else if (n < -1022) {
    const down = pow2(-1022) * pow2(53);       // 2^-969, exact
    y *= down; n += 1022 - 53;
    if (n < -1022) { y *= down; n += 1022 - 53; if (n < -1022) n = -1022; }
  }
  return y * pow2(n);
}

// np.frexp: x = m 2^e, 0.5 <= |m| < 1; frexp(+-0) = (+-0, 0); inf and NaN give (x, 0).
// Writes m to out[0], e to out[1] (no allocation in the hot path).
export function frexp(x, out) {
  if (x === 0 || x !== x || x === Infinity || x === -Infinity) { out[0] = x; out[1] = 0; return out; }
  let bias = 0;
  bitsView.setFloat64(0, x);
  let hi = bitsView.getUint32(0);
  if (((hi >>> 20) & 0x7ff) === 0) {            // subnormal: scale up by 2^54 (exact) first
    bitsView.setFloat64(0, x * 18014398509481984);
    hi = bitsView.getUint32(0);
    bias = -54;
  }
  const E = (hi >>> 20) & 0x7ff;
  bitsView.setUint32(0, (hi & 0x800fffff) | (1022 << 20));   // same sign and mantissa, exponent -1
  out[0] = bitsView.getFloat64(0);
  out[1] = E - 1022 + bias;
  return out;
}

// e^x: x = k ln2 + r (Cody-Waite two-part ln2), Taylor degree 13 in Horner form, exact 2^k scaling.
export function exp(x) {
  if (x !== x) return x;                           // NaN stays NaN
  if (x < EXP_MIN) return 0.0;
  if (x > EXP_MAX) return Infinity;
  const k = rint(x * INV_LN2);                     // integer-valued, |k| <= 1023
  const r = (x - k * LN2_HI) - k * LN2_LO;
  const c = EXP_COEFFS;
  let p = c[13];
  for (let i = 12; i >= 0; i--) p = p * r + c[i];
  return p * POW2[k + 1022];                       // = ldexp(p, k), exact: the result stays normal
}

// dst[dOff + j] = exp(src[sOff + j] - m) for j < n: the same operations as exp() per element,
// with the Horner chain unrolled on constants and two elements in flight (their chains are
// independent, so the CPU overlaps them); any element outside [EXP_MIN, EXP_MAX] (or NaN) takes exp().
const [E0, E1, E2, E3, E4, E5, E6, E7, E8, E9, E10, E11, E12, E13] = EXP_COEFFS;
export function expShiftedInto(src, sOff, n, m, dst, dOff) {
  let j = 0;
  for (; j + 1 < n; j += 2) {
    const x0 = src[sOff + j] - m, x1 = src[sOff + j + 1] - m;
    if (!(x0 >= EXP_MIN && x0 <= EXP_MAX && x1 >= EXP_MIN && x1 <= EXP_MAX)) {
      dst[dOff + j] = exp(x0); dst[dOff + j + 1] = exp(x1); continue;
    }
    const k0 = rint(x0 * INV_LN2), k1 = rint(x1 * INV_LN2);
    const r0 = (x0 - k0 * LN2_HI) - k0 * LN2_LO, r1 = (x1 - k1 * LN2_HI) - k1 * LN2_LO;
    let p0 = E13 * r0 + E12, p1 = E13 * r1 + E12;
    p0 = p0 * r0 + E11; p1 = p1 * r1 + E11;
    p0 = p0 * r0 + E10; p1 = p1 * r1 + E10;
    p0 = p0 * r0 + E9; p1 = p1 * r1 + E9;
    p0 = p0 * r0 + E8; p1 = p1 * r1 + E8;
    p0 = p0 * r0 + E7; p1 = p1 * r1 + E7;
    p0 = p0 * r0 + E6; p1 = p1 * r1 + E6;
    p0 = p0 * r0 + E5; p1 = p1 * r1 + E5;
    p0 = p0 * r0 + E4; p1 = p1 * r1 + E4;
    p0 = p0 * r0 + E3; p1 = p1 * r1 + E3;
    p0 = p0 * r0 + E2; p1 = p1 * r1 + E2;
    p0 = p0 * r0 + E1; p1 = p1 * r1 + E1;
    p0 = p0 * r0 + E0; p1 = p1 * r1 + E0;
    dst[dOff + j] = p0 * POW2[k0 + 1022]; dst[dOff + j + 1] = p1 * POW2[k1 + 1022];
  }
  if (j < n) dst[dOff + j] = exp(src[sOff + j] - m);
  return dst;
}

const frexpOut = new Float64Array(2);

// ln x for positive normal x: m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(f), f = (m-1)/(m+1).
export function log(x) {
  frexp(x, frexpOut);
  let m = frexpOut[0], e = frexpOut[1];
  if (m < SQRT_HALF) { m = m * 2.0; e = e - 1; }
  const f = (m - 1.0) / (m + 1.0);
  const f2 = f * f;
  const c = LOG_COEFFS;
  let s = c[11];
  for (let i = 10; i >= 0; i--) s = s * f2 + c[i];
  const lnm = (f * 2.0) * s;
  return e * LN2_HI + (e * LN2_LO + lnm);
}

// The one float reduction (detmath.tree_sum): n values a[offset + i*stride], padded with +0.0 to
// a power of two p, then repeatedly s[i] = s[i] + s[i + p/2] until one is left. The first level
// reads the source directly (a pad adds +0.0 explicitly: -0 + +0 = +0 must happen).
let scratch = new Float64Array(1024);
export function treeSum(a, offset = 0, n = a.length, stride = 1) {
  if (n <= 1) return n === 1 ? a[offset] : 0.0;
  let p = 1;
  while (p < n) p *= 2;
  p >>= 1;
  if (scratch.length < p) scratch = new Float64Array(p);
  const s = scratch, full = n - p;
  if (stride === 1) {
    for (let i = 0; i < full; i++) s[i] = a[offset + i] + a[offset + i + p];
    for (let i = full; i < p; i++) s[i] = a[offset + i] + 0.0;
  } else {
    for (let i = 0; i < full; i++) s[i] = a[offset + i * stride] + a[offset + (i + p) * stride];
    for (let i = full; i < p; i++) s[i] = a[offset + i * stride] + 0.0;
  }
  while (p > 1) {
    p >>= 1;
    for (let i = 0; i < p; i++) s[i] = s[i] + s[i + p];
  }
  return s[0];
}
