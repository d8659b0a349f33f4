// model.js reluBackward: DH[i] = H[i] > 0 ? DHR[i] : +0.
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> DHR: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> H: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> DH: array<vec2<u32>>;
@group(0) @binding(3) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= P.n) { return; }
  DH[i] = select(F64_ZERO, DHR[i], f64_gt_zero(H[i]));
}
