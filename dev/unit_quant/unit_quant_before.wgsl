// The quantizer as it was before issue 26's second pass (one 64-thread workgroup per row, every
// code through the exact division): the baseline of dev/unit_quant/bench.mjs, not used by the app.
// kernels/unit_quant.wgsl is the mainline.
// The INT8 unit's quantizer on the GPU (docs/VERIFICATION.md §4 step 1, §9.1), bit for bit
// units.js quantizeRows/quantizeCols: for each row r of each batch b (a "row" is whatever the
// unit quantizes together: a row of A or a column of B, read through strides)
//   s = max(max_k |x_k|, 2^-60) / 127;  q_k = clamp(rint(x_k / s), -127, 127)
// and the codes packed four to a u32 (little-endian lanes), K zero-padded to K4 words: exactly
// the A (batch, M, K4) / B^T (batch, N, K4) operands of kernels/gemm_*.wgsl. Needs
// kernels/f64_lib.wgsl prepended. Non-finite inputs set Flags[0] bit 0 (the host then computes
// the call on the CPU: JS keeps NaN out of the max and stores NaN codes as 0, which the GPU does
// not mimic). One workgroup per row: workgroup_id = (row, batch).

struct Params { R: u32, K: u32, K4: u32, rowStride: u32, kStride: u32, batchStride: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> X: array<vec2<u32>>;          // the operand as stored
@group(0) @binding(1) var<storage, read_write> Q: array<u32>;          // (batch, R, K4)
@group(0) @binding(2) var<storage, read_write> S: array<vec2<u32>>;    // (batch, R) scales
@group(0) @binding(3) var<storage, read_write> Flags: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> P: Params;

override WG: u32 = 64u;      // a power of two (the max reduction halves it)

const FLOOR: vec2<u32> = vec2<u32>(0u, 0x3c300000u);     // 2^-60
const QMAX_F64: vec2<u32> = vec2<u32>(0u, 0x405fc000u);  // 127.0

var<workgroup> red: array<vec2<u32>, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let r = wid.x;
  let b = wid.y;
  let t = lid.x;
  let base = b * P.batchStride + r * P.rowStride;
  // max |x|: the maximum of a set does not depend on the scan order (no NaN: flagged instead),
  // and |x| compares as its bit pattern
  var m = vec2<u32>(0u, 0u);
  var bad = false;
  for (var k = t; k < P.K; k += WG) {
    let v = X[base + k * P.kStride];
    if (f64_exp(v) == 0x7ffu) { bad = true; }
    if (f64_abs_lt(m, v)) { m = f64_abs(v); }
  }
  if (bad) { atomicOr(&Flags[0], 1u); }
  red[t] = m;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s / 2u) {
    if (t < s && u64_lt(red[t], red[t + s])) { red[t] = red[t + s]; }
    workgroupBarrier();
  }
  var amax = red[0];
  if (!u64_lt(FLOOR, amax)) { amax = FLOOR; }            // amax > floor ? amax : floor
  let sc = f64_div(amax, QMAX_F64);
  if (t == 0u) { S[b * P.R + r] = sc; }
  for (var w = t; w < P.K4; w += WG) {
    var word = 0u;
    for (var l = 0u; l < 4u; l++) {
      let k = w * 4u + l;
      if (k < P.K) {
        let q = f64_rint_clamp127(f64_div(X[base + k * P.kStride], sc));
        word = word | ((bitcast<u32>(q) & 0xffu) << (8u * l));
      }
    }
    Q[(b * P.R + r) * P.K4 + w] = word;
  }
}
