// model.js rmsnormBackward's dx, one workgroup per row n of (N, C):
//   dxhat = dy * g;  dot = treeSum(dxhat * xhat) / C;  dx = (dxhat - xhat * dot) * r
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { N: u32, C: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> DY: array<vec2<u32>>;       // (N, C)
@group(0) @binding(1) var<storage, read> G: array<vec2<u32>>;        // (C,)
@group(0) @binding(2) var<storage, read> XHAT: array<vec2<u32>>;     // (N, C)
@group(0) @binding(3) var<storage, read> R: array<vec2<u32>>;        // (N,)
@group(0) @binding(4) var<storage, read_write> DX: array<vec2<u32>>; // (N, C)
@group(0) @binding(5) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 64u;

fn term(o: u32, c: u32) -> vec2<u32> { return f64_mul(f64_mul(DY[o + c], G[c]), XHAT[o + c]); }

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let n = wid.x + wid.y * nwg.x;
  if (n >= P.N) { return; }
  let t = lid.x;
  let C = P.C;
  let o = n * C;
  var total = F64_ZERO;
  if (C >= 2u) {
    let p = tree_p(C);
    for (var i = t; i < p; i += WG) { tree[i] = f64_add(term(o, i), select(F64_ZERO, term(o, i + p), i + p < C)); }
    total = tree_finish(p, t);
  } else if (C == 1u) {
    total = term(o, 0u);
  }
  let dot = f64_div(total, f64_from_i32(i32(C)));
  let rn = R[n];
  for (var c = t; c < C; c += WG) {
    let dxhat = f64_mul(DY[o + c], G[c]);
    DX[o + c] = f64_mul(f64_sub(dxhat, f64_mul(XHAT[o + c], dot)), rn);
  }
}
