// The row pieces' shared operations in emulated float64 (docs/VERIFICATION.md §9.2): comparisons,
// rint, the detmath exp and log (frontend_js/detmath.js, operation for operation), and treeSum as
// a workgroup reduction. A library, not a kernel: frontend_js/gpu/resident.js prepends it (after
// kernels/f64_lib.wgsl) to every kernels/res_*.wgsl. The kernel declares `override WG` (its
// workgroup size) and `override TREE_N` (the tree's capacity: half the padded row, a power of two).

const F64_ZERO: vec2<u32> = vec2<u32>(0u, 0u);
const F64_ONE: vec2<u32> = vec2<u32>(0u, 0x3ff00000u);

fn f64_neg(a: vec2<u32>) -> vec2<u32> { return vec2<u32>(a.x, a.y ^ F64_SIGN); }
// a > 0 (false for NaN and both zeros)
fn f64_gt_zero(a: vec2<u32>) -> bool { return (a.y & F64_SIGN) == 0u && !f64_is_zero(a) && !f64_is_nan(a); }
// a < b in IEEE order (false when either is NaN; -0 == +0)
fn f64_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
  if (f64_is_nan(a) || f64_is_nan(b)) { return false; }
  if (f64_is_zero(a) && f64_is_zero(b)) { return false; }
  let na = (a.y & F64_SIGN) != 0u; let nb = (b.y & F64_SIGN) != 0u;
  if (na != nb) { return na; }
  if (na) { return u64_lt(f64_abs(b), f64_abs(a)); }
  return u64_lt(a, b);
}

// detmath.rint: round half to even by the 2^52 trick, the same additions as JS
const TWO52: vec2<u32> = vec2<u32>(0u, 0x43300000u);
fn f64_rint(x: vec2<u32>) -> vec2<u32> {
  if ((x.y & F64_SIGN) != 0u && !f64_is_zero(x) && !f64_is_nan(x)) {
    if (f64_lt(f64_neg(TWO52), x)) { return f64_neg(f64_sub(f64_sub(TWO52, x), TWO52)); }
    return x;
  }
  if (f64_is_zero(x) || f64_is_nan(x)) { return x; }
  if (f64_lt(x, TWO52)) { return f64_sub(f64_add(x, TWO52), TWO52); }
  return x;
}
// an integer-valued float64 with |k| < 2^31 -> i32 (exact)
fn f64_to_i32_exact(k: vec2<u32>) -> i32 {
  if (f64_is_zero(k)) { return 0; }
  let e = i32(f64_exp(k)) - 1023;
  var sig = f64_frac(k);
  sig.y = sig.y | 0x100000u;
  let m = u64_shr(sig, u32(52 - e)).x;
  return select(i32(m), -i32(m), (k.y & F64_SIGN) != 0u);
}
// 2^k for -1022 <= k <= 1023, from its bits (detmath POW2)
fn f64_pow2(k: i32) -> vec2<u32> { return vec2<u32>(0u, u32(k + 1023) << 20u); }

const LN2_HI: vec2<u32> = vec2<u32>(0xfee00000u, 0x3fe62e42u);
const LN2_LO: vec2<u32> = vec2<u32>(0x35793c76u, 0x3dea39efu);
const INV_LN2: vec2<u32> = vec2<u32>(0x652b82feu, 0x3ff71547u);
const EXP_MIN: vec2<u32> = vec2<u32>(0x0u, 0xc0862000u);     // -708
const EXP_MAX: vec2<u32> = vec2<u32>(0x0u, 0x40862800u);     // 709
const SQRT_HALF: vec2<u32> = vec2<u32>(0x667f3bcdu, 0x3fe6a09eu);
// detmath EXP_COEFFS (1/n!, n = 0..13) and LOG_COEFFS (1/(2n+1), n = 0..11), as JS computes them
const EXP_C = array<vec2<u32>, 14>(
  vec2<u32>(0x0u, 0x3ff00000u), vec2<u32>(0x0u, 0x3ff00000u), vec2<u32>(0x0u, 0x3fe00000u),
  vec2<u32>(0x55555555u, 0x3fc55555u), vec2<u32>(0x55555555u, 0x3fa55555u), vec2<u32>(0x11111111u, 0x3f811111u),
  vec2<u32>(0x16c16c17u, 0x3f56c16cu), vec2<u32>(0x1a01a01au, 0x3f2a01a0u), vec2<u32>(0x1a01a01au, 0x3efa01a0u),
  vec2<u32>(0xa556c734u, 0x3ec71de3u), vec2<u32>(0xb7789f5cu, 0x3e927e4fu), vec2<u32>(0x67f544e4u, 0x3e5ae645u),
  vec2<u32>(0xeff8d898u, 0x3e21eed8u), vec2<u32>(0x13a86d09u, 0x3de61246u));
const LOG_C = array<vec2<u32>, 12>(
  vec2<u32>(0x0u, 0x3ff00000u), vec2<u32>(0x55555555u, 0x3fd55555u), vec2<u32>(0x9999999au, 0x3fc99999u),
  vec2<u32>(0x92492492u, 0x3fc24924u), vec2<u32>(0x1c71c71cu, 0x3fbc71c7u), vec2<u32>(0x745d1746u, 0x3fb745d1u),
  vec2<u32>(0x13b13b14u, 0x3fb3b13bu), vec2<u32>(0x11111111u, 0x3fb11111u), vec2<u32>(0x1e1e1e1eu, 0x3fae1e1eu),
  vec2<u32>(0xbca1af28u, 0x3faaf286u), vec2<u32>(0x18618618u, 0x3fa86186u), vec2<u32>(0x590b2164u, 0x3fa642c8u));

// detmath.exp: x = k ln2 + r (Cody-Waite), Taylor degree 13 by Horner, times 2^k
fn f64_exp_det(x: vec2<u32>) -> vec2<u32> {
  if (f64_is_nan(x)) { return x; }
  if (f64_lt(x, EXP_MIN)) { return F64_ZERO; }
  if (f64_lt(EXP_MAX, x)) { return f64_inf(0u); }
  let k = f64_rint(f64_mul(x, INV_LN2));
  let r = f64_sub(f64_sub(x, f64_mul(k, LN2_HI)), f64_mul(k, LN2_LO));
  var p = EXP_C[13];
  for (var i = 12; i >= 0; i--) { p = f64_add(f64_mul(p, r), EXP_C[i]); }
  return f64_mul(p, f64_pow2(f64_to_i32_exact(k)));
}

// detmath.log for a positive normal x: frexp, m in [sqrt(1/2), sqrt(2)), 2 atanh((m-1)/(m+1))
fn f64_log_det(x: vec2<u32>) -> vec2<u32> {
  var m = vec2<u32>(x.x, (x.y & 0x800fffffu) | (1022u << 20u));
  var e = i32(f64_exp(x)) - 1022;
  if (f64_lt(m, SQRT_HALF)) { m = f64_mul(m, vec2<u32>(0u, 0x40000000u)); e = e - 1; }
  let f = f64_div(f64_sub(m, F64_ONE), f64_add(m, F64_ONE));
  let f2 = f64_mul(f, f);
  var s = LOG_C[11];
  for (var i = 10; i >= 0; i--) { s = f64_add(f64_mul(s, f2), LOG_C[i]); }
  let lnm = f64_mul(f64_mul(f, vec2<u32>(0u, 0x40000000u)), s);
  let ef = f64_from_i32(e);
  return f64_add(f64_mul(ef, LN2_HI), f64_add(f64_mul(ef, LN2_LO), lnm));
}

// treeSum (detmath.tree_sum) as a workgroup reduction. The kernel writes the first level into
// tree[0 .. tree_p(n)): tree[i] = a[i] + (i + p < n ? a[i + p] : +0) (the pad adds +0
// explicitly: -0 + +0 = +0), then every thread of the workgroup calls tree_finish(p, t) (the
// halving levels in the same pairs as JS). n >= 2 (n = 1 is a[0] itself, n = 0 is +0).
var<workgroup> tree: array<vec2<u32>, TREE_N>;
fn tree_p(n: u32) -> u32 { var p = 1u; while (p < n) { p = p * 2u; } return p / 2u; }
fn tree_finish(p_first: u32, t: u32) -> vec2<u32> {
  workgroupBarrier();
  var p = p_first;
  while (p > 1u) {
    p = p / 2u;
    for (var i = t; i < p; i += WG) { tree[i] = f64_add(tree[i], tree[i + p]); }
    workgroupBarrier();
  }
  let r = tree[0];
  workgroupBarrier();
  return r;
}

// ---- float32 <-> float64 and the PRNG, for the int8 exchange codec (exchange_codec.js) ----------
// float32 bits -> the float64 of the same value (exact); NaN bits are not passed here
fn f32_bits_to_f64(b: u32) -> vec2<u32> {
  let ef = (b >> 23u) & 0xffu;
  let mant = b & 0x7fffffu;
  let sign = b & F64_SIGN;
  if (ef == 0u) {                                  // zero or subnormal: mant * 2^-149, exact
    if (mant == 0u) { return vec2<u32>(0u, sign); }
    let v = f64_mul(f64_from_i32(i32(mant)), vec2<u32>(0u, 0x36a00000u));   // 2^-149
    return vec2<u32>(v.x, v.y | sign);
  }
  if (ef == 0xffu) { return f64_inf(sign); }
  return vec2<u32>(mant << 29u, sign | ((ef + 896u) << 20u) | (mant >> 3u));
}
// a finite float64 m >= 0 -> the bits of the float32 nearest to it (ties to even; past the
// largest float32: +inf), as a Float32Array store rounds
fn f64_to_f32_bits(m: vec2<u32>) -> u32 {
  if (f64_is_zero(m)) { return 0u; }
  let p = f64_unpack(m);
  let e = p.exp - 1023;
  if (e > 127) { return 0x7f800000u; }
  var sh = 29u;
  var ebits = 0u;
  if (e >= -126) { ebits = u32(e + 126); } else { sh = u32(-97 - e); }
  if (sh >= 64u) { return 0u; }
  let q = u64_shr(p.sig, sh);
  let rem = u64_sub(p.sig, u64_shl(q, sh));
  let half = u64_shl(vec2<u32>(1u, 0u), sh - 1u);
  let up = u64_lt(half, rem) || (u64_eq(rem, half) && (q.x & 1u) == 1u);
  return (ebits << 23u) + q.x + select(0u, 1u, up);     // a carry moves into the exponent, to +inf at most
}
// prng.js mix32 and uniform(k, i) = (draw(k, i) >>> 8) * 2^-24 (u32 products wrap, as Math.imul)
fn mix32(x0: u32) -> u32 {
  var x = x0;
  x = x ^ (x >> 16u); x = x * 0x7feb352du; x = x ^ (x >> 15u); x = x * 0x846ca68bu; x = x ^ (x >> 16u);
  return x;
}
fn prng_uniform(k: u32, i: u32) -> vec2<u32> {
  let d = mix32(mix32(i ^ k) + 0x632be5abu);
  return f64_mul(f64_from_i32(i32(d >> 8u)), vec2<u32>(0u, 0x3e700000u));     // 2^-24
}
// floor(y) for a finite |y| < 2^31, as an i32
fn f64_floor_i32(y: vec2<u32>) -> i32 {
  let neg = (y.y & F64_SIGN) != 0u;
  if (f64_is_zero(y)) { return 0; }
  let e = i32(f64_exp(y)) - 1023;
  if (e < 0) { return select(0, -1, neg); }
  var sig = f64_frac(y);
  sig.y = sig.y | 0x100000u;
  let sh = u32(52 - e);
  let ip = u64_shr(sig, sh);
  let exact = u64_eq(u64_shl(ip, sh), sig);
  if (!neg) { return i32(ip.x); }
  return -i32(ip.x) - select(1, 0, exact);
}
