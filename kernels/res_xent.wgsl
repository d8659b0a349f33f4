// model.js crossEntropy, one workgroup per row n of LOGITS (N, V):
//   m = max_v logit;  e_v = exp(logit_v - m);  z = treeSum(e);  loss_n = (m + log z) - logit[target]
//   dlogits_v = (e_v / z) / N, at the target ((e_t / z) - 1) / N
// The mean loss (treeSum(loss_n) / N) is the host's: one small read. exp and log are detmath's.
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { N: u32, V: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> LOGITS: array<vec2<u32>>;     // (N, V)
@group(0) @binding(1) var<storage, read> TARGETS: array<u32>;          // (N,)
@group(0) @binding(2) var<storage, read_write> DL: array<vec2<u32>>;   // (N, V)
@group(0) @binding(3) var<storage, read_write> LOSSN: array<vec2<u32>>; // (N,)
@group(0) @binding(4) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 256u;
override VMAX: u32 = 257u;      // >= V

var<workgroup> mx: array<vec2<u32>, WG>;
var<workgroup> ev: array<vec2<u32>, VMAX>;   // the row's e_v (exp once per element: one copy of exp in the kernel)

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let n = wid.x + wid.y * nwg.x;
  if (n >= P.N) { return; }
  let t = lid.x;
  let V = P.V;
  let o = n * V;
  var m = LOGITS[o];
  for (var v = t; v < V; v += WG) { if (f64_lt(m, LOGITS[o + v])) { m = LOGITS[o + v]; } }
  mx[t] = m;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s / 2u) {
    if (t < s && f64_lt(mx[t], mx[t + s])) { mx[t] = mx[t + s]; }
    workgroupBarrier();
  }
  m = mx[0];
  for (var v = t; v < V; v += WG) { ev[v] = f64_exp_det(f64_sub(LOGITS[o + v], m)); }
  workgroupBarrier();
  var z = ev[0];
  if (V >= 2u) {
    let p = tree_p(V);
    for (var k = t; k < p; k += WG) { tree[k] = f64_add(ev[k], select(F64_ZERO, ev[k + p], k + p < V)); }
    z = tree_finish(p, t);
  }
  let tgt = TARGETS[n];
  let nf = f64_from_i32(i32(P.N));
  if (t == 0u) { LOSSN[n] = f64_sub(f64_add(m, f64_log_det(z)), LOGITS[o + tgt]); }
  // dl = ((e / z) - [v = target]) / N: both divisions through one call site (a copy of the
  // division loop costs SwiftShader seconds to compile; the operations are the same)
  for (var v = t; v < V; v += WG) {
    var num = ev[v];
    var den = z;
    for (var k = 0u; k < 2u; k++) {
      let q = f64_div(num, den);
      num = select(q, f64_sub(q, F64_ONE), k == 0u && v == tgt);
      den = nf;
    }
    DL[o + v] = num;
  }
}
