// model.js rmsnorm, one workgroup per row n of X (N, C):
//   r = 1 / sqrt(treeSum(x*x) / C + eps);  xhat = x * r;  y = xhat * g
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended (treeSum as the workgroup's tree).

struct Params { N: u32, C: u32, _p0: u32, _p1: u32, eps: vec2<u32>, _p2: vec2<u32> }

@group(0) @binding(0) var<storage, read> X: array<vec2<u32>>;        // (N, C)
@group(0) @binding(1) var<storage, read> G: array<vec2<u32>>;        // (C,)
@group(0) @binding(2) var<storage, read_write> Y: array<vec2<u32>>;  // (N, C)
@group(0) @binding(3) var<storage, read_write> XHAT: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> R: array<vec2<u32>>;  // (N,)
@group(0) @binding(5) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 64u;     // >= half the row padded to a power of two

fn sq(o: u32, c: u32) -> vec2<u32> { let v = X[o + c]; return f64_mul(v, v); }

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let n = wid.x + wid.y * nwg.x;
  if (n >= P.N) { return; }                 // a whole workgroup: uniform
  let t = lid.x;
  let C = P.C;
  let o = n * C;
  var total = F64_ZERO;
  if (C >= 2u) {
    let p = tree_p(C);
    for (var i = t; i < p; i += WG) { tree[i] = f64_add(sq(o, i), select(F64_ZERO, sq(o, i + p), i + p < C)); }
    total = tree_finish(p, t);
  } else if (C == 1u) {
    total = sq(o, 0u);
  }
  let ms = f64_div(total, f64_from_i32(i32(C)));
  let rn = f64_div(F64_ONE, f64_sqrt(f64_add(ms, P.eps)));
  if (t == 0u) { R[n] = rn; }
  for (var c = t; c < C; c += WG) {
    let xh = f64_mul(X[o + c], rn);
    XHAT[o + c] = xh;
    Y[o + c] = f64_mul(xh, G[c]);
  }
}
