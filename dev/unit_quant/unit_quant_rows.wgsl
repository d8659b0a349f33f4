// A variant of kernels/unit_quant.wgsl (issue 26 §3): ROWS short rows per workgroup, WG / ROWS
// threads each, instead of one 64-thread workgroup per row (on the H200 the quantizers took 77 %
// of the GPU's time, most of it one workgroup per short attention row of K = 16..32). Same
// operations per element, the same max (a set's maximum: order-free), so the same bits: validated
// by dev/unit_quant/validate.py against units.js, timed by dev/unit_quant/bench.mjs on a GPU.
// workgroup_id = (group of ROWS rows, batch). Needs kernels/f64_lib.wgsl prepended.

struct Params { R: u32, K: u32, K4: u32, rowStride: u32, kStride: u32, batchStride: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> X: array<vec2<u32>>;          // the operand as stored
@group(0) @binding(1) var<storage, read_write> Q: array<u32>;          // (batch, R, K4)
@group(0) @binding(2) var<storage, read_write> S: array<vec2<u32>>;    // (batch, R) scales
@group(0) @binding(3) var<storage, read_write> Flags: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> P: Params;

override WG: u32 = 64u;      // a power of two (the max reduction halves it)
override ROWS: u32 = 4u;     // rows per workgroup, a power of two dividing WG

const FLOOR: vec2<u32> = vec2<u32>(0u, 0x3c300000u);     // 2^-60
const QMAX_F64: vec2<u32> = vec2<u32>(0u, 0x405fc000u);  // 127.0

var<workgroup> red: array<vec2<u32>, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let TPR = WG / ROWS;                     // threads per row
  let r = wid.x * ROWS + lid.x / TPR;
  let b = wid.y;
  let t = lid.x % TPR;
  let live = r < P.R;                      // a workgroup's last rows may be past R (barriers still run)
  let base = b * P.batchStride + r * P.rowStride;
  var m = vec2<u32>(0u, 0u);
  var bad = false;
  if (live) {
    for (var k = t; k < P.K; k += TPR) {
      let v = X[base + k * P.kStride];
      if (f64_exp(v) == 0x7ffu) { bad = true; }
      if (f64_abs_lt(m, v)) { m = f64_abs(v); }
    }
  }
  if (bad) { atomicOr(&Flags[0], 1u); }
  red[lid.x] = m;
  workgroupBarrier();
  for (var s = TPR / 2u; s > 0u; s = s / 2u) {
    if (t < s && u64_lt(red[lid.x], red[lid.x + s])) { red[lid.x] = red[lid.x + s]; }
    workgroupBarrier();
  }
  if (!live) { return; }
  var amax = red[lid.x - t];
  if (!u64_lt(FLOOR, amax)) { amax = FLOOR; }            // amax > floor ? amax : floor
  let sc = f64_div(amax, QMAX_F64);
  if (t == 0u) { S[b * P.R + r] = sc; }
  for (var w = t; w < P.K4; w += TPR) {
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
