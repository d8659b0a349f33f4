// model.js embeddingBackward: dwte[v, c] = +0 + dx[n, c] for every n with idx[n] = v, n ascending
// (the JS loop's order for each element). One thread per output element, no float atomics.
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { V: u32, N: u32, C: u32, _p0: u32 }

@group(0) @binding(0) var<storage, read> DX: array<vec2<u32>>;         // (N, C)
@group(0) @binding(1) var<storage, read> IDX: array<u32>;              // (N,)
@group(0) @binding(2) var<storage, read_write> DW: array<vec2<u32>>;   // (V, C)
@group(0) @binding(3) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = gid.x + gid.y * nwg.x * WG;
  if (e >= P.V * P.C) { return; }
  let v = e / P.C;
  let c = e % P.C;
  var acc = F64_ZERO;
  for (var n = 0u; n < P.N; n++) {
    if (IDX[n] == v) { acc = f64_add(acc, DX[n * P.C + c]); }
  }
  DW[e] = acc;
}
