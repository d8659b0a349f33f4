// The emulated float64 operations one at a time, for the boot gate and the tests
// (frontend_js/gpu/f64.js gateF64Ops): out[i] = op(a[i], b[i]). Needs kernels/f64_lib.wgsl
// prepended. Float64 values are (low, high) u32 words, as in a little-endian Float64Array.
//   op 0: a × b   1: a ÷ b   2: a + b   3: a − b   4: √a
//      5: float64(int32 a.x)   6: clamp(rint(a), −127, 127) as int32 in out.x (out.y = 0)

struct Params { n: u32, op: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> A: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> B: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> Out: array<vec2<u32>>;
@group(0) @binding(3) var<uniform> P: Params;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= P.n) { return; }
  let a = A[i];
  let b = B[i];
  var r = vec2<u32>(0u, 0u);
  switch P.op {
    case 0u: { r = f64_mul(a, b); }
    case 1u: { r = f64_div(a, b); }
    case 2u: { r = f64_add(a, b); }
    case 3u: { r = f64_sub(a, b); }
    case 4u: { r = f64_sqrt(a); }
    case 5u: { r = f64_from_i32(bitcast<i32>(a.x)); }
    case 6u: { r = vec2<u32>(bitcast<u32>(f64_rint_clamp127(a)), 0u); }
    default: { r = F64_NAN; }
  }
  Out[i] = r;
}
