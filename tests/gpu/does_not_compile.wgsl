// Not part of the bug corpus: a kernel with a syntax error, for the test that a shader compile
// error leaves the engine on the CPU with the compiler's message as the reason.
@compute @workgroup_size(1)
fn main() {
  let x: i32 = 1 +;
}
