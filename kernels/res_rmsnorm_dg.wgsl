// model.js rmsnormBackward's dg, one workgroup per column c of (N, C):
//   dg[c] = treeSum over rows n = 0..N-1 of dy[n, c] * xhat[n, c]
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended; TREE_N >= N / 2 (padded).

struct Params { N: u32, C: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> DY: array<vec2<u32>>;       // (N, C)
@group(0) @binding(1) var<storage, read> XHAT: array<vec2<u32>>;     // (N, C)
@group(0) @binding(2) var<storage, read_write> DG: array<vec2<u32>>; // (C,)
@group(0) @binding(3) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 2048u;

fn prod(n: u32, c: u32) -> vec2<u32> { let i = n * P.C + c; return f64_mul(DY[i], XHAT[i]); }

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let c = wid.x;
  if (c >= P.C) { return; }
  let t = lid.x;
  let N = P.N;
  var total = F64_ZERO;
  if (N >= 2u) {
    let p = tree_p(N);
    for (var i = t; i < p; i += WG) { tree[i] = f64_add(prod(i, c), select(F64_ZERO, prod(i + p, c), i + p < N)); }
    total = tree_finish(p, t);
  } else if (N == 1u) {
    total = prod(0u, c);
  }
  if (t == 0u) { DG[c] = total; }
}
