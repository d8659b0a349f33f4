// exchange_codec.js decode of an int8 message, one thread per value: out[i] = (q * s) / 127 with
// q the block's int8 code and s its float32 scale. A malformed block (a scale with the sign bit
// set or >= 2^64, code -128, a non-zero code under scale 0) sets Flags[0]: the host then runs the
// JS decode, which refuses with its message. Needs kernels/f64_lib.wgsl and f64_rows.wgsl prepended.

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> MSG: array<u32>;
@group(0) @binding(1) var<storage, read_write> OUT: array<vec2<u32>>;  // (n,) float64
@group(0) @binding(2) var<storage, read_write> Flags: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> P: Params;

override WG: u32 = 64u;
override TREE_N: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * WG;
  if (i >= P.n) { return; }
  let j = i / 256u;
  let k = i % 256u;
  let sb = MSG[j * 65u];
  let qb = (MSG[j * 65u + 1u + k / 4u] >> (8u * (k % 4u))) & 0xffu;
  let q = bitcast<i32>(qb << 24u) >> 24u;                    // sign-extended
  if ((sb >> 31u) != 0u || sb >= 0x5f800000u || q == -128 || (sb == 0u && q != 0)) { atomicOr(&Flags[0], 1u); }
  OUT[i] = f64_div(f64_mul(f64_from_i32(q), f32_bits_to_f64(sb)), vec2<u32>(0u, 0x405fc000u));
}
