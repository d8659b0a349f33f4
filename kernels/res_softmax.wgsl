// model.js causalSoftmax, one workgroup per row of S (G, T, T); row = (g, i), i = row % T:
//   x_j = s_j * scale (j <= i);  m = max x_j;  e_j = exp(x_j - m) (j <= i), +0 (j > i);
//   z = treeSum(e over all T columns);  p_j = e_j / z
// exp is detmath's (f64_rows.wgsl f64_exp_det). The maximum of a set does not depend on the scan
// order, and the sign of a zero maximum does not change any x - m (docs/VERIFICATION.md §9.2).
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { rows: u32, T: u32, _p0: u32, _p1: u32, scale: vec2<u32>, _p2: vec2<u32> }

@group(0) @binding(0) var<storage, read> S: array<vec2<u32>>;        // (G, T, T)
@group(0) @binding(1) var<storage, read_write> PR: array<vec2<u32>>; // (G, T, T)
@group(0) @binding(2) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 64u;
override TMAX: u32 = 128u;      // >= T

var<workgroup> mx: array<vec2<u32>, WG>;
var<workgroup> ev: array<vec2<u32>, TMAX>;   // the row's e_j (exp once per element: one copy of exp in the kernel)

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= P.rows) { return; }
  let t = lid.x;
  let T = P.T;
  let i = row % T;
  let o = row * T;
  // m = max over j <= i (each thread's part, then the workgroup's; JS starts from x_0)
  var m = f64_mul(S[o], P.scale);
  for (var j = t; j <= i; j += WG) { let x = f64_mul(S[o + j], P.scale); if (f64_lt(m, x)) { m = x; } }
  mx[t] = m;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s / 2u) {
    if (t < s && f64_lt(mx[t], mx[t + s])) { mx[t] = mx[t + s]; }
    workgroupBarrier();
  }
  m = mx[0];
  // e_j = exp(x_j - m) for j <= i, +0 past the diagonal
  for (var j = t; j < T; j += WG) {
    var e = F64_ZERO;
    if (j <= i) { e = f64_exp_det(f64_sub(f64_mul(S[o + j], P.scale), m)); }
    ev[j] = e;
  }
  workgroupBarrier();
  var z = ev[0];
  if (T >= 2u) {
    let p = tree_p(T);
    for (var k = t; k < p; k += WG) { tree[k] = f64_add(ev[k], select(F64_ZERO, ev[k + p], k + p < T)); }
    z = tree_finish(p, t);
  }
  for (var j = t; j < T; j += WG) { PR[o + j] = f64_div(ev[j], z); }
}
