// optim.js adamStep on one flat tensor, in place, operation for operation:
//   m = B1*m + OMB1*g;  v = B2*v + OMB2*(g*g);  w = w - lr*((m / bc1) / (sqrt(v / bc2) + EPS))
// bc1 = 1 - B1^t and bc2 = 1 - B2^t come from the host (optim.js powInt, the same bits).
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32,
  b1: vec2<u32>, omb1: vec2<u32>, b2: vec2<u32>, omb2: vec2<u32>, eps: vec2<u32>, lr: vec2<u32>, bc1: vec2<u32>, bc2: vec2<u32> }

@group(0) @binding(0) var<storage, read_write> W: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> G: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> M: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> V: array<vec2<u32>>;
@group(0) @binding(4) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= P.n) { return; }
  let g = G[i];
  let mi = f64_add(f64_mul(P.b1, M[i]), f64_mul(P.omb1, g));
  let vi = f64_add(f64_mul(P.b2, V[i]), f64_mul(P.omb2, f64_mul(g, g)));
  M[i] = mi;
  V[i] = vi;
  let step = f64_div(f64_div(mi, P.bc1), f64_add(f64_sqrt(f64_div(vi, P.bc2)), P.eps));
  W[i] = f64_sub(W[i], f64_mul(P.lr, step));
}
