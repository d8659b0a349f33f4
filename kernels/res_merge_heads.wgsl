// model.js mergeHeads: YH (B, H, T, D) -> OUT (N, W) at column col0 + h*D + d, exact copies.
// One thread per input element. Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { B: u32, T: u32, H: u32, D: u32, W: u32, col0: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> YH: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> OUT: array<vec2<u32>>;
@group(0) @binding(2) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = gid.x + gid.y * nwg.x * WG;
  if (e >= P.B * P.H * P.T * P.D) { return; }
  let d = e % P.D;
  let t = (e / P.D) % P.T;
  let h = (e / (P.D * P.T)) % P.H;
  let b = e / (P.D * P.T * P.H);
  OUT[(b * P.T + t) * P.W + P.col0 + h * P.D + d] = YH[e];
}
