// model.js forward's embedding: X[n, c] = WTE[idx[n], c] + WPE[n % T, c]. One thread per element.
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { N: u32, T: u32, C: u32, _p0: u32 }

@group(0) @binding(0) var<storage, read> WTE: array<vec2<u32>>;       // (V, C)
@group(0) @binding(1) var<storage, read> WPE: array<vec2<u32>>;       // (T, C)
@group(0) @binding(2) var<storage, read> IDX: array<u32>;             // (N,)
@group(0) @binding(3) var<storage, read_write> X: array<vec2<u32>>;   // (N, C)
@group(0) @binding(4) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = gid.x + gid.y * nwg.x * WG;
  if (e >= P.N * P.C) { return; }
  let n = e / P.C;
  let c = e % P.C;
  X[e] = f64_add(WTE[IDX[n] * P.C + c], WPE[(n % P.T) * P.C + c]);
}
