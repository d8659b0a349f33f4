// model.js backward's position gradient: dwpe[i] = treeSum over b = 0..B-1 of dx[b * T*C + i], i in
// (T*C); one thread per element running detmath.treeSum's padded pairwise tree in registers
// (B <= 32: the first level's 16 sums). Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { B: u32, TC: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> DX: array<vec2<u32>>;         // (B, T, C)
@group(0) @binding(1) var<storage, read_write> DW: array<vec2<u32>>;   // (T, C)
@group(0) @binding(2) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= P.TC) { return; }
  let n = P.B;
  if (n == 1u) { DW[i] = DX[i]; return; }
  var p = 1u;
  while (p < n) { p = p * 2u; }
  p = p / 2u;
  var s: array<vec2<u32>, 16>;
  for (var k = 0u; k < p; k++) {
    s[k] = f64_add(DX[k * P.TC + i], select(F64_ZERO, DX[(k + p) * P.TC + i], k + p < n));
  }
  while (p > 1u) {
    p = p / 2u;
    for (var k = 0u; k < p; k++) { s[k] = f64_add(s[k], s[k + p]); }
  }
  DW[i] = s[0];
}
