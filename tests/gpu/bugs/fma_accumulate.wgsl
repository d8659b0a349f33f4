// BUG CORPUS (deliberately wrong; never used for training): fma_accumulate
// Failure class modelled: FMA contraction in a float path (fused on the H200, unfused on SwiftShader; inexact above 2^24 either way)
// Derived from kernels/gemm_portable.wgsl by one edit: the products are accumulated with fma() in f32
// Caught by: gate (K=4096 at +-127)
//
struct Params { M: u32, N: u32, K4: u32, batch: u32 }

@group(0) @binding(0) var<storage, read> A: array<u32>;          // (batch, M, K4)
@group(0) @binding(1) var<storage, read> Bt: array<u32>;         // (batch, N, K4)
@group(0) @binding(2) var<storage, read_write> C: array<i32>;    // (batch, M, N)
@group(0) @binding(3) var<uniform> P: Params;

override WG_X: u32 = 8u;     // threads along N
override WG_Y: u32 = 8u;     // threads along M
override RM: u32 = 4u;       // outputs per thread along M (<= MAX_R)
override RN: u32 = 4u;       // outputs per thread along N (<= MAX_R)
override TK: u32 = 4u;       // K words staged per step
const MAX_R: u32 = 8u;       // register arrays need a constant size

// lane l of w as int8: shift the byte to the top, then an arithmetic shift right sign-extends it
fn lane(w: u32, l: u32) -> i32 { return bitcast<i32>(w << (24u - 8u * l)) >> 24u; }
fn dot4(a: u32, b: u32) -> i32 {
  return lane(a, 0u) * lane(b, 0u) + lane(a, 1u) * lane(b, 1u) + lane(a, 2u) * lane(b, 2u)
       + lane(a, 3u) * lane(b, 3u);
}

var<workgroup> As: array<u32, WG_Y * RM * TK>;   // [kw][r]
var<workgroup> Bs: array<u32, WG_X * RN * TK>;   // [kw][c]

@compute @workgroup_size(WG_X, WG_Y, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let tileM = WG_Y * RM;
  let tileN = WG_X * RN;
  let b = wid.z;
  let row0 = wid.y * tileM;
  let col0 = wid.x * tileN;
  let t = lid.y * WG_X + lid.x;
  let nT = WG_X * WG_Y;
  let aBase = b * P.M * P.K4;
  let bBase = b * P.N * P.K4;
  var acc: array<f32, MAX_R * MAX_R>;     // BUG: float accumulator
  var a: array<u32, MAX_R>;
  var w: array<u32, MAX_R>;
  for (var k0 = 0u; k0 < P.K4; k0 += TK) {
    for (var i = t; i < tileM * TK; i += nT) {
      let r = i / TK;
      let kw = i % TK;
      var v = 0u;
      if (row0 + r < P.M && k0 + kw < P.K4) { v = A[aBase + (row0 + r) * P.K4 + k0 + kw]; }
      As[kw * tileM + r] = v;
    }
    for (var i = t; i < tileN * TK; i += nT) {
      let c = i / TK;
      let kw = i % TK;
      var v = 0u;
      if (col0 + c < P.N && k0 + kw < P.K4) { v = Bt[bBase + (col0 + c) * P.K4 + k0 + kw]; }
      Bs[kw * tileN + c] = v;
    }
    workgroupBarrier();
    for (var kw = 0u; kw < TK; kw++) {
      for (var i = 0u; i < RM; i++) { a[i] = As[kw * tileM + lid.y + i * WG_Y]; }
      for (var j = 0u; j < RN; j++) { w[j] = Bs[kw * tileN + lid.x + j * WG_X]; }
      for (var i = 0u; i < RM; i++) {
        for (var j = 0u; j < RN; j++) {
          for (var l = 0u; l < 4u; l++) { acc[i * MAX_R + j] = fma(f32(lane(a[i], l)), f32(lane(w[j], l)), acc[i * MAX_R + j]); }   // BUG: fma
        }
      }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < RM; i++) {
    let r = row0 + lid.y + i * WG_Y;
    for (var j = 0u; j < RN; j++) {
      let c = col0 + lid.x + j * WG_X;
      if (r < P.M && c < P.N) { C[(b * P.M + r) * P.N + c] = i32(acc[i * MAX_R + j]); }
    }
  }
}
