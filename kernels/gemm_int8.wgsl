// int8 GEMM: C (batch, M, N) i32 = A (batch, M, K) i8 @ B (batch, K, N) i8, exact.
// Operands arrive packed four int8 to a u32 (little-endian lanes, frontend_js/units.js packI8x4),
// both with K innermost and zero-padded to K4 = ceil(K / 4) words per row:
//   A  (batch, M, K4) words: row i of A
//   Bt (batch, N, K4) words: column j of B (the engine transposes B on the CPU before packing)
// Zero padding makes the padded lanes contribute 0, so any K works. The 4-lane dot product
// dot4(a, b) -> i32 is prepended (frontend_js/gpu/gemm_kernel.js gemmSource), one file per
// variant: kernels/dot4_packed.wgsl (dot4I8Packed, needs the WGSL language feature
// packed_4x8_integer_dot_product) or kernels/dot4_portable.wgsl (plain i32 lane arithmetic).
// i32 sums are exact while |acc| <= K*127^2 < 2^31.
//
// Tiling: a workgroup of WG_X x WG_Y threads owns a (WG_Y*RM) x (WG_X*RN) tile of C; each thread
// owns RM x RN outputs, strided by WG_Y rows / WG_X columns (conflict-free shared reads).
// K is staged through workgroup memory TK words at a time.
//
// Split-K: K is cut into P.splits slices (the host's choice: 1 for the measured route's calls,
// frontend_js/gpu/gemm_kernel.js; f64.js gemmSplits for the INT8 unit, whose weight gradients have
// K = B*T, 4096 at the largest settings, and few output tiles). Each slice gets its own workgroups
// (workgroup_id.z = batch * splits + slice) and writes its own partial C (splits, batch, M, N);
// kernels/unit_epilogue.wgsl adds the partials: int32 sums are exact, so their order changes no bit.

struct Params { M: u32, N: u32, K4: u32, batch: u32, splits: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> A: array<u32>;          // (batch, M, K4)
@group(0) @binding(1) var<storage, read> Bt: array<u32>;         // (batch, N, K4)
@group(0) @binding(2) var<storage, read_write> C: array<i32>;    // (splits, batch, M, N) partials
@group(0) @binding(3) var<uniform> P: Params;

override WG_X: u32 = 8u;     // threads along N
override WG_Y: u32 = 8u;     // threads along M
override RM: u32 = 4u;       // outputs per thread along M (<= MAX_R)
override RN: u32 = 4u;       // outputs per thread along N (<= MAX_R)
override TK: u32 = 4u;       // K words staged per step
const MAX_R: u32 = 8u;       // register arrays need a constant size

var<workgroup> As: array<u32, WG_Y * RM * TK>;   // [kw][r]
var<workgroup> Bs: array<u32, WG_X * RN * TK>;   // [kw][c]

@compute @workgroup_size(WG_X, WG_Y, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let tileM = WG_Y * RM;
  let tileN = WG_X * RN;
  let b = wid.z / P.splits;
  let sp = wid.z % P.splits;
  let chunk = ((P.K4 + P.splits - 1u) / P.splits + TK - 1u) / TK * TK;   // words per slice, a multiple of TK
  let kLo = sp * chunk;
  let kHi = min(P.K4, kLo + chunk);                                      // kLo >= kHi: an empty slice, zeros
  let row0 = wid.y * tileM;
  let col0 = wid.x * tileN;
  let t = lid.y * WG_X + lid.x;
  let nT = WG_X * WG_Y;
  let aBase = b * P.M * P.K4;
  let bBase = b * P.N * P.K4;
  var acc: array<i32, MAX_R * MAX_R>;     // zero-initialised
  var a: array<u32, MAX_R>;
  var w: array<u32, MAX_R>;
  for (var k0 = kLo; k0 < kHi; k0 += TK) {
    for (var i = t; i < tileM * TK; i += nT) {
      let r = i / TK;
      let kw = i % TK;
      var v = 0u;
      if (row0 + r < P.M && k0 + kw < kHi) { v = A[aBase + (row0 + r) * P.K4 + k0 + kw]; }
      As[kw * tileM + r] = v;
    }
    for (var i = t; i < tileN * TK; i += nT) {
      let c = i / TK;
      let kw = i % TK;
      var v = 0u;
      if (col0 + c < P.N && k0 + kw < kHi) { v = Bt[bBase + (col0 + c) * P.K4 + k0 + kw]; }
      Bs[kw * tileN + c] = v;
    }
    workgroupBarrier();
    for (var kw = 0u; kw < TK; kw++) {
      for (var i = 0u; i < RM; i++) { a[i] = As[kw * tileM + lid.y + i * WG_Y]; }
      for (var j = 0u; j < RN; j++) { w[j] = Bs[kw * tileN + lid.x + j * WG_X]; }
      for (var i = 0u; i < RM; i++) {
        for (var j = 0u; j < RN; j++) {
          acc[i * MAX_R + j] += dot4(a[i], w[j]);
        }
      }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < RM; i++) {
    let r = row0 + lid.y + i * WG_Y;
    for (var j = 0u; j < RN; j++) {
      let c = col0 + lid.x + j * WG_X;
      if (r < P.M && c < P.N) { C[((sp * P.batch + b) * P.M + r) * P.N + c] = acc[i * MAX_R + j]; }
    }
  }
}
