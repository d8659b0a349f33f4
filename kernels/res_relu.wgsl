// model.js relu: HR[i] = H[i] where H[i] > 0 or NaN, else +0 (np.maximum(h, 0)).
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> H: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> HR: array<vec2<u32>>;
@group(0) @binding(2) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= P.n) { return; }
  let h = H[i];
  HR[i] = select(F64_ZERO, h, f64_gt_zero(h) || f64_is_nan(h));
}
