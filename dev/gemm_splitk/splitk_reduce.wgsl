// The split-K GEMM's reduce (dev/gemm_splitk/gemm_packed_splitk.wgsl): C[i] = sum over the SPLITS
// partials of i, in slice order (int32: exact in any order). One thread per output element.

struct Params { total: u32, splits: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> Parts: array<i32>;       // (SPLITS, batch, M, N)
@group(0) @binding(1) var<storage, read_write> C: array<i32>;      // (batch, M, N)
@group(0) @binding(2) var<uniform> P: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= P.total) { return; }
  var acc = 0;
  for (var s = 0u; s < P.splits; s++) { acc += Parts[s * P.total + i]; }
  C[i] = acc;
}
