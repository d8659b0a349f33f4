// The resident step's self-audit of one unit call (frontend_js/gpu/resident.js residentForward):
// for each sampled result element e = (batch, i, j), row i of A (K values), column j of B (K
// values) and the element itself, copied word for word into this call's audit buffer, which the
// step reads back with its gradients; the host recomputes each element from its row and column
// (f64.js unitElement) and compares all 64 bits. Float64 values as vec2<u32>; A and B are read
// with the strides of their layouts (transposed or not), so the copy is the values the unit read.
// Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended (unused here: every resident kernel gets them).

const MAX_SAMPLES: u32 = 4u;

// head: (K, samples, 0, 0); at[s]: (A's first index, A's stride, B's first index, B's stride);
// elem[s].x: the result element's index
struct Params { head: vec4<u32>, at: array<vec4<u32>, 4>, elem: array<vec4<u32>, 4> }

@group(0) @binding(0) var<storage, read> A: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> B: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> R: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> OUT: array<vec2<u32>>;
@group(0) @binding(4) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

// OUT: per sample [row of A (K)][column of B (K)][the element (1)]
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let g = gid.x + gid.y * nwg.x * WG;
  let K = P.head.x;
  let per = 2u * K + 1u;
  if (g >= P.head.y * per) { return; }
  let s = g / per;
  let w = g % per;
  let at = P.at[s];
  if (w < K) {
    OUT[g] = A[at.x + w * at.y];
  } else if (w < 2u * K) {
    OUT[g] = B[at.z + (w - K) * at.w];
  } else {
    OUT[g] = R[P.elem[s].x];
  }
}
