// Integer requantization between two GEMMs of a B2B chain (tests/gpu/b2b.js has the spec and
// the CPU mirror): for every int32 accumulator x of X (rows, N),
//   y = clamp((x + (1 << (s - 1))) >> s, -127, 127)      (>> arithmetic: round half up, 1 <= s <= 30)
//   y = max(y, 0) when RELU
// and packs four y per u32 (little-endian lanes, as packI8x4), each row zero-padded to N4 words,
// so the result is directly the packed A operand of the next gemm_*.wgsl. i32 only: exact.

struct Params { rows: u32, N: u32, N4: u32, shift: u32 }

@group(0) @binding(0) var<storage, read> X: array<i32>;          // (rows, N)
@group(0) @binding(1) var<storage, read_write> Q: array<u32>;    // (rows, N4)
@group(0) @binding(2) var<uniform> P: Params;

override WG: u32 = 64u;
override RELU: bool = true;

fn requant(x: i32) -> i32 {
  let half = 1i << (P.shift - 1u);
  var y = clamp((x + half) >> P.shift, -127i, 127i);
  if (RELU) { y = max(y, 0i); }
  return y;
}

@compute @workgroup_size(WG, 1, 1)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let word = g.x;
  let row = g.y;
  if (word >= P.N4 || row >= P.rows) { return; }
  var packed = 0u;
  for (var l = 0u; l < 4u; l++) {
    let col = 4u * word + l;
    if (col < P.N) { packed |= (bitcast<u32>(requant(X[row * P.N + col])) & 0xffu) << (8u * l); }
  }
  Q[row * P.N4 + word] = packed;
}
