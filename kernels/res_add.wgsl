// The residual add of model.js (addInPlace): X[i] = X[i] + Y[i], in place, float64 on u32 words.
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended (frontend_js/gpu/resident.js).

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read_write> X: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> Y: array<vec2<u32>>;
@group(0) @binding(2) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= P.n) { return; }
  X[i] = f64_add(X[i], Y[i]);
}
