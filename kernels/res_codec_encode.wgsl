// exchange_codec.js quantize (the int8 exchange's message), one workgroup per block of 256 values:
//   m = max |x| over the block;  s = the smallest float32 >= m;  y = (x * 127) / s;  f = floor(y)
//   code = f + (uniform(key, offset + i) < y - f ? 1 : 0)   (unbiased stochastic rounding)
// written as the message's bytes, u32 words: per block [float32 s][256 codes, int8] (the last
// block's codes stop at n). A non-finite value or s >= 2^64 sets Flags[0]: the host then runs the
// JS codec, which refuses with its message. Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { n: u32, key: u32, offset: u32, _p0: u32 }

@group(0) @binding(0) var<storage, read> X: array<vec2<u32>>;         // (n,) float64
@group(0) @binding(1) var<storage, read_write> MSG: array<u32>;       // ceil((4 * blocks + n) / 4) words
@group(0) @binding(2) var<storage, read_write> Flags: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> P: Params;

override WG: u32 = 64u;          // 4 codes per thread: WG * 4 = 256, the block
override TREE_N: u32 = 1u;

var<workgroup> mx: array<vec2<u32>, WG>;
const MAX_SCALE_BITS: u32 = 0x5f800000u;     // float32 2^64

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let j = wid.x + wid.y * nwg.x;
  let nb = (P.n + 255u) / 256u;
  if (j >= nb) { return; }
  let t = lid.x;
  let i0 = j * 256u;
  let i1 = min(P.n, i0 + 256u);
  var m = F64_ZERO;
  for (var i = i0 + t; i < i1; i += WG) {
    let v = X[i];
    if (f64_exp(v) == 0x7ffu) { atomicOr(&Flags[0], 1u); }
    if (f64_abs_lt(m, v)) { m = f64_abs(v); }
  }
  mx[t] = m;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s / 2u) {
    if (t < s && u64_lt(mx[t], mx[t + s])) { mx[t] = mx[t + s]; }
    workgroupBarrier();
  }
  m = mx[0];
  var sb = f64_to_f32_bits(m);
  if (u64_lt(f32_bits_to_f64(sb), m)) { sb = sb + 1u; }     // the next float32 up
  if (sb >= MAX_SCALE_BITS) { atomicOr(&Flags[0], 2u); }
  let wbase = j * 65u;                                       // (4 + 256) / 4 words per block
  if (t == 0u) { MSG[wbase] = sb; }
  let s64 = f32_bits_to_f64(sb);
  var word = 0u;
  for (var l = 0u; l < 4u; l++) {
    let i = i0 + 4u * t + l;
    if (i < i1 && sb != 0u) {
      let y = f64_div(f64_mul(X[i], vec2<u32>(0u, 0x405fc000u)), s64);   // (x * 127) / s
      let f = f64_floor_i32(y);
      let u = prng_uniform(P.key, P.offset + i);
      let code = f + select(0, 1, f64_lt(u, f64_sub(y, f64_from_i32(f))));
      word = word | ((bitcast<u32>(code) & 0xffu) << (8u * l));
    }
  }
  if (i0 + 4u * t < i1) { MSG[wbase + 1u + t] = word; }
}
