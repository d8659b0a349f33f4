// The INT8 unit's epilogue on the GPU (docs/VERIFICATION.md §4 step 3, §9.1), bit for bit
// units.js epilogue: out[b, i, j] = (float64(acc[b, i, j]) × sA[b, i]) × sB[b, j], two correctly
// rounded products in this order, acc the sum of kernels/unit_gemm.wgsl's P.splits partials (exact
// int32 sums, any order). Needs kernels/f64_lib.wgsl prepended.
// workgroup_id = (chunk of WG outputs of one (M, N) matrix, batch).

struct Params { M: u32, N: u32, splits: u32, stride: u32 }          // stride = batch * M * N

@group(0) @binding(0) var<storage, read> C: array<i32>;                // (splits, batch, M, N)
@group(0) @binding(1) var<storage, read> SA: array<vec2<u32>>;         // (batch, M)
@group(0) @binding(2) var<storage, read> SB: array<vec2<u32>>;         // (batch, N)
@group(0) @binding(3) var<storage, read_write> Out: array<vec2<u32>>;  // (batch, M, N) float64
@group(0) @binding(4) var<uniform> P: Params;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let idx = wid.x * WG + lid.x;
  if (idx >= P.M * P.N) { return; }
  let b = wid.y;
  let i = idx / P.N;
  let j = idx % P.N;
  let o = b * P.M * P.N + idx;
  var acc = C[o];
  for (var sp = 1u; sp < P.splits; sp++) { acc += C[sp * P.stride + o]; }
  Out[o] = f64_mul(f64_mul(f64_from_i32(acc), SA[b * P.M + i]), SB[b * P.N + j]);
}
