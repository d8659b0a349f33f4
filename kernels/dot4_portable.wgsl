// The portable GEMM's 4-lane dot product, prepended to kernels/gemm_int8.wgsl: a and b are four
// int8 lanes each (little-endian in a u32) -> their dot product, in plain i32 arithmetic (no WGSL
// language feature needed).
// lane l of w as int8: shift the byte to the top, then an arithmetic shift right sign-extends it
fn lane(w: u32, l: u32) -> i32 { return bitcast<i32>(w << (24u - 8u * l)) >> 24u; }
fn dot4(a: u32, b: u32) -> i32 {
  return lane(a, 0u) * lane(b, 0u) + lane(a, 1u) * lane(b, 1u) + lane(a, 2u) * lane(b, 2u)
       + lane(a, 3u) * lane(b, 3u);
}
