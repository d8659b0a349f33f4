// model.js splitHeads: part `part` of QKV (N, W) as (B, T, W / C, H, D) -> OUT (B, H, T, D), exact
// copies (W = 3C: the forward's q, k, v; W = C: backward's splitHeads3). One thread per output element. Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { B: u32, T: u32, H: u32, D: u32, part: u32, W: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> QKV: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> OUT: array<vec2<u32>>;
@group(0) @binding(2) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let e = gid.x + gid.y * nwg.x * WG;
  if (e >= P.B * P.H * P.T * P.D) { return; }
  let d = e % P.D;
  let t = (e / P.D) % P.T;
  let h = (e / (P.D * P.T)) % P.H;
  let b = e / (P.D * P.T * P.H);
  let C = P.H * P.D;
  OUT[e] = QKV[(b * P.T + t) * P.W + P.part * C + h * P.D + d];
}
