// The INT8 unit's quantizer on the GPU (docs/VERIFICATION.md §4 step 1, §9.1), bit for bit
// units.js quantizeRows/quantizeCols: for each row r of each batch b (a "row" is whatever the
// unit quantizes together: a row of A or a column of B, read through strides)
//   s = max(max_k |x_k|, 2^-60) / 127;  q_k = clamp(rint(x_k / s), -127, 127)
// and the codes packed four to a u32 (little-endian lanes), K zero-padded to K4 words: exactly
// the A (batch, M, K4) / B^T (batch, N, K4) operands of kernels/unit_gemm.wgsl. Needs
// kernels/f64_lib.wgsl prepended. Non-finite inputs set Flags[0] bit 0 (the host then computes
// the call on the CPU: JS keeps NaN out of the max and stores NaN codes as 0, which the GPU does
// not mimic).
// Rows per workgroup: P.TPR threads per row (a power of two dividing WG, chosen by the host from K:
// frontend_js/gpu/f64.js quantThreads), WG / TPR rows per workgroup, so short rows (attention's
// K = 16) keep every thread busy. workgroup_id = (group of WG / TPR rows, batch).
// The quotient (quantCode): the exact float64 division (f64_div, a 63-step loop) only where it can
// change the code. A float32 estimate of x / s from the two significands' top 24 bits decides it
// everywhere else; see quantCode for why that gives the code of the exact quotient.

struct Params { R: u32, K: u32, K4: u32, rowStride: u32, kStride: u32, batchStride: u32, TPR: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> X: array<vec2<u32>>;          // the operand as stored
@group(0) @binding(1) var<storage, read_write> Q: array<u32>;          // (batch, R, K4)
@group(0) @binding(2) var<storage, read_write> S: array<vec2<u32>>;    // (batch, R) scales
@group(0) @binding(3) var<storage, read_write> Flags: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> P: Params;

override WG: u32 = 64u;      // a power of two (the max reduction halves it)

const FLOOR: vec2<u32> = vec2<u32>(0u, 0x3c300000u);     // 2^-60
const QMAX_F64: vec2<u32> = vec2<u32>(0u, 0x405fc000u);  // 127.0
// how close to a half-integer the estimate may come before the exact division decides (the
// estimate's error is below 2^-13.8, see quantCode: a factor of 7 to spare)
const MARGIN: f32 = 0.00048828125;                        // 2^-11

var<workgroup> red: array<vec2<u32>, WG>;

// clamp(rint(x / s), -127, 127) for a finite x and the row's scale s (positive and normal:
// s >= 2^-60 / 127), equal to f64_rint_clamp127(f64_div(x, s)) for every such pair:
// - x zero or subnormal: |x / s| < 2^-1022 / 2^-67 < 1/2, so the code is 0.
// - d = exp(x) - exp(s): |x / s| = (mx / ms) 2^d with significands mx, ms in [1, 2), so
//   |x / s| < 2^(d+1) <= 1/2 for d <= -2 (code 0: a quotient rounded up to 1/2 is a tie, to even)
//   and |x / s| > 2^(d-1) >= 128 for d >= 8 (code +-127).
// - else the estimate y = (fx / fs) 2^d, fx and fs the significands cut to 24 bits (each within
//   a factor 1 - 2^-23 of the true one, so fx / fs within 2^-22 of mx / ms < 2), the float32
//   division within 2.5 ULP (WGSL, Vulkan: 2.5 2^-23 here) and the power of two exact, with d <= 7:
//   |y - fl(x / s)| < 2^7 (2^-22 + 2.5 2^-23) + 2^-45 < 2^-13.8.
//   Where y is more than MARGIN from every half-integer, fl(x / s) lies on the same side of each
//   as y and on none, so its rint is y's nearest integer. Within MARGIN (about 0.1 % of codes)
//   the exact division decides. The sign is x's.
fn quantCode(x: vec2<u32>, s: vec2<u32>) -> i32 {
  let ex = i32(f64_exp(x));
  if (ex == 0) { return 0; }
  let d = ex - i32(f64_exp(s));
  if (d <= -2) { return 0; }
  var n = 127u;
  if (d < 8) {
    let fx = bitcast<f32>(0x3f800000u | ((x.y & 0xfffffu) << 3u) | (x.x >> 29u));
    let fs = bitcast<f32>(0x3f800000u | ((s.y & 0xfffffu) << 3u) | (s.x >> 29u));
    let y = (fx / fs) * bitcast<f32>(u32(127 + d) << 23u);
    let ip = floor(y);
    let fr = y - ip;                                       // exact (y < 2^8)
    if (abs(fr - 0.5) <= MARGIN) { return f64_rint_clamp127(f64_div(x, s)); }
    n = min(u32(ip) + select(0u, 1u, fr > 0.5), 127u);
  }
  return select(i32(n), -i32(n), (x.y & F64_SIGN) != 0u);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let tpr = P.TPR;
  let t = lid.x % tpr;                     // this thread's place in its row
  let slot = lid.x - t;                    // its row's first slot in red
  let r = wid.x * (WG / tpr) + lid.x / tpr;
  let b = wid.y;
  let live = r < P.R;                      // a workgroup's last rows may be past R (barriers still run)
  let base = b * P.batchStride + r * P.rowStride;
  // max |x|: the maximum of a set does not depend on the scan order (no NaN: flagged instead),
  // and |x| compares as its bit pattern
  var m = vec2<u32>(0u, 0u);
  var bad = false;
  if (live) {
    for (var k = t; k < P.K; k += tpr) {
      let v = X[base + k * P.kStride];
      if (f64_exp(v) == 0x7ffu) { bad = true; }
      if (f64_abs_lt(m, v)) { m = f64_abs(v); }
    }
  }
  if (bad) { atomicOr(&Flags[0], 1u); }
  red[lid.x] = m;
  workgroupBarrier();
  for (var h = tpr / 2u; h > 0u; h = h / 2u) {
    if (t < h && u64_lt(red[lid.x], red[lid.x + h])) { red[lid.x] = red[lid.x + h]; }
    workgroupBarrier();
  }
  if (!live) { return; }
  var amax = red[slot];
  if (!u64_lt(FLOOR, amax)) { amax = FLOOR; }            // amax > floor ? amax : floor
  let sc = f64_div(amax, QMAX_F64);
  if (t == 0u) { S[b * P.R + r] = sc; }
  for (var w = t; w < P.K4; w += tpr) {
    var word = 0u;
    for (var l = 0u; l < 4u; l++) {
      let k = w * 4u + l;
      if (k < P.K) {
        word = word | ((bitcast<u32>(quantCode(X[base + k * P.kStride], sc)) & 0xffu) << (8u * l));
      }
    }
    Q[(b * P.R + r) * P.K4 + w] = word;
  }
}
