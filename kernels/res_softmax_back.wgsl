// model.js softmaxBackward, one workgroup per row of (G, T, T):
//   tr = treeSum(dp * p);  ds = (p * (dp - tr)) * scale
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { rows: u32, T: u32, _p0: u32, _p1: u32, scale: vec2<u32>, _p2: vec2<u32> }

@group(0) @binding(0) var<storage, read> DP: array<vec2<u32>>;       // (G, T, T)
@group(0) @binding(1) var<storage, read> PR: array<vec2<u32>>;       // (G, T, T)
@group(0) @binding(2) var<storage, read_write> DS: array<vec2<u32>>; // (G, T, T)
@group(0) @binding(3) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 64u;

fn prod(i: u32) -> vec2<u32> { return f64_mul(DP[i], PR[i]); }

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= P.rows) { return; }
  let t = lid.x;
  let T = P.T;
  let o = row * T;
  var tr = F64_ZERO;
  if (T >= 2u) {
    let p = tree_p(T);
    for (var k = t; k < p; k += WG) { tree[k] = f64_add(prod(o + k), select(F64_ZERO, prod(o + k + p), k + p < T)); }
    tr = tree_finish(p, t);
  } else {
    tr = prod(o);
  }
  for (var j = t; j < T; j += WG) { DS[o + j] = f64_mul(f64_mul(PR[o + j], f64_sub(DP[o + j], tr)), P.scale); }
}
