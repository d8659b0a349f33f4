// The packed GEMM's 4-lane dot product, prepended to kernels/gemm_int8.wgsl: a and b are four
// int8 lanes each (little-endian in a u32) -> their dot product, by the WGSL builtin, which needs
// the language feature packed_4x8_integer_dot_product.
fn dot4(a: u32, b: u32) -> i32 { return dot4I8Packed(a, b); }
