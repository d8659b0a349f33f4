// BUG CORPUS (f64_lost_carry): a lost carry: the 128-bit product drops the carry out of its second word.
// A mutated copy of kernels/f64_lib.wgsl; the f64 gate (frontend_js/gpu/f64.js gateF64) must reject it.
// Float64 emulated with u32 integer operations (docs/VERIFICATION.md §9.1). A library, not a
// kernel: frontend_js/gpu/f64.js prepends it to every kernels/f64_*.wgsl and unit_*.wgsl
// (WGSL has no include). No float instruction is used anywhere: WGSL's f32 flushes subnormals
// and may fuse, so every bit here comes from u32 adds, shifts, compares and 16x16-bit products.
//
// A float64 is a vec2<u32> (x = low word, y = high word): exactly the two u32 words of a
// little-endian Float64Array element, so host buffers upload and read back unchanged.
// Rounding is IEEE-754 round to nearest, ties to even, with gradual underflow (subnormal inputs
// and results are handled exactly) and overflow to ±inf; the structure follows Berkeley
// SoftFloat 3 (roundPackToF64 with the exponent biased minus one and the significand's leading
// bit at bit 62, ten round bits). NaN results are the one quiet NaN 0x7ff8000000000000 (JS
// engines may return other payloads, so no caller may compare NaN bits; the unit refuses
// non-finite inputs instead, see unit_quant.wgsl).

const F64_SIGN: u32 = 0x80000000u;
const F64_NAN: vec2<u32> = vec2<u32>(0u, 0x7ff80000u);

// ---- 64-bit unsigned integers as vec2<u32> (x = low, y = high) --------------------------------
fn u64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let lo = a.x + b.x;
  return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));          // carry out of the low word
}
fn u64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));  // borrow from the high word
}
fn u64_lt(a: vec2<u32>, b: vec2<u32>) -> bool { return a.y < b.y || (a.y == b.y && a.x < b.x); }
fn u64_zero(a: vec2<u32>) -> bool { return (a.x | a.y) == 0u; }
fn u64_eq(a: vec2<u32>, b: vec2<u32>) -> bool { return a.x == b.x && a.y == b.y; }
// s in 0..63 (WGSL shifts by >= 32 are invalid, hence the branches)
fn u64_shl(a: vec2<u32>, s: u32) -> vec2<u32> {
  if (s == 0u) { return a; }
  if (s >= 32u) { return vec2<u32>(0u, a.x << (s - 32u)); }
  return vec2<u32>(a.x << s, (a.y << s) | (a.x >> (32u - s)));
}
fn u64_shr(a: vec2<u32>, s: u32) -> vec2<u32> {
  if (s == 0u) { return a; }
  if (s >= 32u) { return vec2<u32>(a.y >> (s - 32u), 0u); }
  return vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}
// shift right by any s, OR-ing "some 1 bit was shifted out" into bit 0 (the sticky bit)
fn u64_shr_jam(a: vec2<u32>, s: u32) -> vec2<u32> {
  if (s == 0u) { return a; }
  if (s >= 64u) { return vec2<u32>(select(0u, 1u, !u64_zero(a)), 0u); }
  var r = u64_shr(a, s);
  if (!u64_eq(u64_shl(r, s), a)) { r.x = r.x | 1u; }
  return r;
}
fn u64_clz(a: vec2<u32>) -> u32 {
  if (a.y != 0u) { return countLeadingZeros(a.y); }
  return 32u + countLeadingZeros(a.x);
}
// 32 x 32 -> 64 bits exactly, from four 16 x 16-bit products (each < 2^32)
fn mul32(a: u32, b: u32) -> vec2<u32> {
  let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
  let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
  let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);           // < 3 * 2^16
  return vec2<u32>((mid << 16u) | (p00 & 0xffffu), p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}
struct U128 { hi: vec2<u32>, lo: vec2<u32> }
// 64 x 64 -> 128 bits exactly (schoolbook on 32-bit words)
fn u64_mul(a: vec2<u32>, b: vec2<u32>) -> U128 {
  let ll = mul32(a.x, b.x); let lh = mul32(a.x, b.y); let hl = mul32(a.y, b.x); let hh = mul32(a.y, b.y);
  let w1 = u64_add(u64_add(vec2<u32>(ll.y, 0u), vec2<u32>(lh.x, 0u)), vec2<u32>(hl.x, 0u));   // word 1 + carry (0..2)
  let w23 = u64_add(u64_add(u64_add(hh, vec2<u32>(lh.y, 0u)), vec2<u32>(hl.y, 0u)), vec2<u32>(0u, 0u));
  return U128(w23, vec2<u32>(ll.x, w1.x));
}

// ---- float64 fields ----------------------------------------------------------------------------
fn f64_exp(a: vec2<u32>) -> u32 { return (a.y >> 20u) & 0x7ffu; }
fn f64_frac(a: vec2<u32>) -> vec2<u32> { return vec2<u32>(a.x, a.y & 0xfffffu); }
fn f64_is_zero(a: vec2<u32>) -> bool { return (a.x | (a.y & 0x7fffffffu)) == 0u; }
fn f64_is_nan(a: vec2<u32>) -> bool { return f64_exp(a) == 0x7ffu && !u64_zero(f64_frac(a)); }
fn f64_abs(a: vec2<u32>) -> vec2<u32> { return vec2<u32>(a.x, a.y & 0x7fffffffu); }
fn f64_inf(sign: u32) -> vec2<u32> { return vec2<u32>(0u, sign | 0x7ff00000u); }
// |a| < |b| for non-NaN a, b: IEEE order of non-negative floats is the order of their bit patterns
fn f64_abs_lt(a: vec2<u32>, b: vec2<u32>) -> bool { return u64_lt(f64_abs(a), f64_abs(b)); }

// A finite non-zero operand: sign, biased exponent (<= 0 for a normalized subnormal), and the
// 53-bit significand with its leading 1 at bit 52.
struct F64Parts { sign: u32, exp: i32, sig: vec2<u32> }
fn f64_unpack(a: vec2<u32>) -> F64Parts {
  let e = f64_exp(a);
  var sig = f64_frac(a);
  if (e == 0u) {                                   // subnormal: normalize
    let shift = u64_clz(sig) - 11u;
    return F64Parts(a.y & F64_SIGN, 1 - i32(shift), u64_shl(sig, shift));
  }
  sig.y = sig.y | 0x100000u;
  return F64Parts(a.y & F64_SIGN, i32(e), sig);
}

// The one rounding step (SoftFloat roundPackToF64, near-even): the value is sig * 2^(exp - 1084),
// sig's leading 1 at bit 62 (or below, for results that end up subnormal), bits 0..9 the round
// bits (bit 9 the half, bits 0..8 with any sticky bit ORed in).
fn f64_round_pack(sign: u32, exp: i32, sig_in: vec2<u32>) -> vec2<u32> {
  var e = exp;
  var sig = sig_in;
  var round_bits = sig.x & 0x3ffu;
  if (e < 0) {                                     // tiny: denormalize, keeping a sticky bit
    sig = u64_shr_jam(sig, u32(-e));
    e = 0;
    round_bits = sig.x & 0x3ffu;
  } else if (e > 0x7fd || (e == 0x7fd && !u64_lt(u64_add(sig, vec2<u32>(0x200u, 0u)), vec2<u32>(0u, 0x80000000u)))) {
    return f64_inf(sign);                          // overflow
  }
  sig = u64_shr(u64_add(sig, vec2<u32>(0x200u, 0u)), 10u);
  if (round_bits == 0x200u) { sig.x = sig.x & ~1u; }   // exactly half: to even
  if (u64_zero(sig)) { e = 0; }
  // an addition, not an OR: a significand that rounded up to 2^53 carries into the exponent
  return u64_add(vec2<u32>(0u, sign | (u32(e) << 20u)), sig);
}

fn f64_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let sign = (a.y ^ b.y) & F64_SIGN;
  if (f64_is_nan(a) || f64_is_nan(b)) { return F64_NAN; }
  let a_inf = f64_exp(a) == 0x7ffu; let b_inf = f64_exp(b) == 0x7ffu;
  if (a_inf || b_inf) {
    if (f64_is_zero(a) || f64_is_zero(b)) { return F64_NAN; }   // inf * 0
    return f64_inf(sign);
  }
  if (f64_is_zero(a) || f64_is_zero(b)) { return vec2<u32>(0u, sign); }
  let pa = f64_unpack(a); let pb = f64_unpack(b);
  var e = pa.exp + pb.exp - 0x3ff;
  let p = u64_mul(u64_shl(pa.sig, 10u), u64_shl(pb.sig, 11u));   // in [2^125, 2^127)
  var sig = p.hi;
  if (!u64_zero(p.lo)) { sig.x = sig.x | 1u; }                    // sticky
  if (sig.y < 0x40000000u) { e = e - 1; sig = u64_shl(sig, 1u); }
  return f64_round_pack(sign, e, sig);
}

// Restoring long division, one quotient bit per step: 63 bits (leading 1 at bit 62), then the
// remainder's "non-zero" as the sticky bit.
fn f64_div(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let sign = (a.y ^ b.y) & F64_SIGN;
  if (f64_is_nan(a) || f64_is_nan(b)) { return F64_NAN; }
  let a_inf = f64_exp(a) == 0x7ffu; let b_inf = f64_exp(b) == 0x7ffu;
  if (a_inf) { if (b_inf) { return F64_NAN; } return f64_inf(sign); }
  if (b_inf) { return vec2<u32>(0u, sign); }
  if (f64_is_zero(b)) { if (f64_is_zero(a)) { return F64_NAN; } return f64_inf(sign); }
  if (f64_is_zero(a)) { return vec2<u32>(0u, sign); }
  let pa = f64_unpack(a); let pb = f64_unpack(b);
  var e = pa.exp - pb.exp + 0x3fe;
  var rem = pa.sig;
  if (u64_lt(rem, pb.sig)) { e = e - 1; rem = u64_shl(rem, 1u); }  // quotient's leading bit first
  var q = vec2<u32>(0u, 0u);
  for (var i = 0u; i < 63u; i++) {
    q = u64_shl(q, 1u);
    if (!u64_lt(rem, pb.sig)) { rem = u64_sub(rem, pb.sig); q.x = q.x | 1u; }
    rem = u64_shl(rem, 1u);
  }
  if (!u64_zero(rem)) { q.x = q.x | 1u; }                         // sticky
  return f64_round_pack(sign, e, q);
}

// int32 -> float64, exact (32 significant bits at most)
fn f64_from_i32(v: i32) -> vec2<u32> {
  if (v == 0) { return vec2<u32>(0u, 0u); }
  let u = bitcast<u32>(v);
  let m = select(u, 0u - u, v < 0);               // |v| as u32 (2^31 included)
  let lz = countLeadingZeros(m);
  let sig = u64_shl(vec2<u32>(m, 0u), 21u + lz);  // leading 1 at bit 52
  // exponent field 1023 + 31 - lz, minus one: the leading bit adds the one back
  return u64_add(vec2<u32>(0u, select(0u, F64_SIGN, v < 0) | ((1053u - lz) << 20u)), sig);
}

// clamp(rint(x), -127, 127) for non-NaN x, rint rounding half to even (§5 rint): the integer part
// and the remainder split exactly at the binary point, no float operation.
fn f64_rint_clamp127(x: vec2<u32>) -> i32 {
  let e = i32(f64_exp(x)) - 1023;                  // unbiased; zero and subnormals: -1023
  var n = 0u;
  if (e >= 7) {
    n = 127u;                                      // |x| >= 128 (infinities included)
  } else if (e >= -1) {                            // |x| in [0.5, 128)
    var sig = f64_frac(x);
    sig.y = sig.y | 0x100000u;
    let sh = u32(52 - e);                          // 46 ..= 53 fraction bits
    let ip = u64_shr(sig, sh);                     // integer part < 128
    let rem = u64_sub(sig, u64_shl(ip, sh));
    let half = u64_shl(vec2<u32>(1u, 0u), sh - 1u);
    let up = u64_lt(half, rem) || (u64_eq(rem, half) && (ip.x & 1u) == 1u);
    n = min(ip.x + select(0u, 1u, up), 127u);
  }                                                // |x| < 0.5: 0
  return select(i32(n), -i32(n), (x.y & F64_SIGN) != 0u);
}

// value = sig * 2^(exp - 1084) for any non-zero sig whose top bit is clear: shift the leading 1
// to bit 62, then round (SoftFloat normRoundPackToF64)
fn f64_norm_round_pack(sign: u32, exp: i32, sig: vec2<u32>) -> vec2<u32> {
  let shift = u64_clz(sig) - 1u;
  return f64_round_pack(sign, exp - i32(shift), u64_shl(sig, shift));
}

// a + b. Both significands move to bit 61 (nine guard bits below the 53), the smaller is
// shifted right with a sticky bit; a carry lands on bit 62 at most.
fn f64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  if (f64_is_nan(a) || f64_is_nan(b)) { return F64_NAN; }
  let a_inf = f64_exp(a) == 0x7ffu; let b_inf = f64_exp(b) == 0x7ffu;
  if (a_inf && b_inf) { if (((a.y ^ b.y) & F64_SIGN) != 0u) { return F64_NAN; } return a; }
  if (a_inf) { return a; }
  if (b_inf) { return b; }
  if (f64_is_zero(a)) { if (f64_is_zero(b)) { return vec2<u32>(0u, a.y & b.y & F64_SIGN); } return b; }
  if (f64_is_zero(b)) { return a; }
  var x = a; var y = b;
  if (f64_abs_lt(x, y)) { x = b; y = a; }          // |x| >= |y|
  let px = f64_unpack(x); let py = f64_unpack(y);
  let sx = u64_shl(px.sig, 9u);
  let sy = u64_shr_jam(u64_shl(py.sig, 9u), u32(px.exp - py.exp));
  if (px.sign == py.sign) { return f64_norm_round_pack(px.sign, px.exp, u64_add(sx, sy)); }
  let d = u64_sub(sx, sy);
  if (u64_zero(d)) { return vec2<u32>(0u, 0u); }   // exact cancellation: +0 when rounding to nearest
  return f64_norm_round_pack(px.sign, px.exp, d);
}
fn f64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> { return f64_add(a, vec2<u32>(b.x, b.y ^ F64_SIGN)); }

// sqrt: digit-by-digit integer square root, 55 root bits (leading 1 at bit 54) from the
// significand scaled to an even exponent, the remainder's "non-zero" as the sticky bit.
fn f64_sqrt(a: vec2<u32>) -> vec2<u32> {
  if (f64_is_nan(a)) { return F64_NAN; }
  if (f64_is_zero(a)) { return a; }                // sqrt(±0) = ±0
  if ((a.y & F64_SIGN) != 0u) { return F64_NAN; }
  if (f64_exp(a) == 0x7ffu) { return a; }          // +inf
  let p = f64_unpack(a);
  let e_unb = p.exp - 1023;
  var m = p.sig;                                   // 54 radicand bits, bits 53..0
  var e_even = e_unb;
  if ((e_unb & 1) != 0) { m = u64_shl(m, 1u); e_even = e_unb - 1; }
  var rem = vec2<u32>(0u, 0u);
  var root = vec2<u32>(0u, 0u);
  for (var i = 0u; i < 55u; i++) {
    var pair = 0u;
    if (i < 27u) { pair = u64_shr(m, 52u - 2u * i).x & 3u; }   // then zero pairs
    rem = u64_add(u64_shl(rem, 2u), vec2<u32>(pair, 0u));
    let trial = u64_add(u64_shl(root, 2u), vec2<u32>(1u, 0u));
    root = u64_shl(root, 1u);
    if (!u64_lt(rem, trial)) { rem = u64_sub(rem, trial); root.x = root.x | 1u; }
  }
  var sig = u64_shl(root, 8u);
  if (!u64_zero(rem)) { sig.x = sig.x | 1u; }
  return f64_round_pack(0u, e_even / 2 + 1022, sig);
}
