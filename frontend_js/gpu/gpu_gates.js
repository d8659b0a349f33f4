// Boot gates and training-time audits for the GPU integer engine (frontend_js/gpu/engine.js).
//
// Gate: every GPU GEMM kernel, at every boot, computes GATE_CASES and is compared element by
// element with cpuEngine.gemm (frontend_js/units.js). One mismatch disables that kernel.
// The sweep covers 1x1x1, ragged M/N/K (not multiples of the tile nor of 4), several tiles in
// each direction, batched shapes (attention heads), K up to 4096 with the largest accumulators
// (|acc| = K*127^2 = 66,064,384 > 2^24, so a float accumulator shows), all -127, +127 x -127,
// alternating signs, zeros, and random values that include -128 (the quantizer never emits it,
// but it exercises the sign handling of the unpack).
//
// Audits, on GEMM results during training (cheap: O(MK + KN + MN) against the GEMM's O(MKN)):
//   boundAudit     every |C[i,j]| <= K * 128^2 (anything else cannot be a product of int8s)
//   checksumAudit  Freivalds' check C r == A (B r) for a random integer vector r in [-R, R]^N,
//                  computed in float64 with R chosen so every sum is an exact integer < 2^53;
//                  a wrong row escapes with probability <= 1/(2R+1)
//   tileAudit      a random tile of C recomputed exactly on the CPU
// (each also as *View over strided operands: the fused unit's padded int16 codes, see below)
// Randomness comes from frontend_js/prng.js keyed by (AUDIT_PURPOSE, seed, call): deterministic.
import { cpuEngine } from '../units.js';
import { key, draw } from '../prng.js';

export const GATE_PURPOSE = 0x6a7e;     // PRNG key words, distinct from the model's purposes
export const AUDIT_PURPOSE = 0xa0d1;

// name, batch, M, K, N, fill. Tiles are 32x32 (SwiftShader) or 128x128 (H200) by default.
export const GATE_CASES = [
  ['1x1x1 random', 1, 1, 1, 1, 'random'],
  ['1x1x1 -127', 1, 1, 1, 1, 'neg'],
  ['ragged 3x5x7', 1, 3, 5, 7, 'random'],
  ['4x4x4 alternating', 1, 4, 4, 4, 'alt'],
  ['batched 2x5x7x3', 2, 5, 7, 3, 'random'],
  ['ragged over tile 33x9x65', 1, 33, 9, 65, 'random'],
  ['exact tile 32x32x32', 1, 32, 32, 32, 'random'],
  ['batched ragged 3x17x31x19', 3, 17, 31, 19, 'random'],
  ['multi-tile 140x21x131', 1, 140, 21, 131, 'random'],
  ['heads 4x32x8x32', 4, 32, 8, 32, 'random'],
  ['K=4093 all -127', 1, 3, 4093, 5, 'neg'],
  ['K=4096 +127 x -127', 1, 3, 4096, 5, 'posneg'],
  ['K=4096 large same-sign', 1, 2, 4096, 3, 'bigpos'],
  ['K=4095 large opposite-sign', 1, 2, 4095, 3, 'bigneg'],
  ['K=4096 alternating', 1, 2, 4096, 3, 'alt'],
  ['zeros 7x13x9', 1, 7, 13, 9, 'zeros'],
  ['random with -128 9x67x11', 1, 9, 67, 11, 'random'],
];

// -> { qa: Int8Array (batch, M, K), qb: Int8Array (batch, K, N) }, a pure function of (fill, seed)
export function gateOperands(fill, batch, M, K, N, seed = 0) {
  const qa = new Int8Array(batch * M * K), qb = new Int8Array(batch * K * N);
  const ka = key(GATE_PURPOSE, seed, 1), kb = key(GATE_PURPOSE, seed, 2);
  const set = (q, k, f) => { for (let i = 0; i < q.length; i++) q[i] = f(i, draw(k, i)); };
  const big = (d) => 100 + (d % 28);                       // 100..127
  const alt = (n) => (i) => ((i + Math.floor(i / n)) & 1 ? -127 : 127);
  switch (fill) {
    case 'random': set(qa, ka, (i, d) => (d & 0xff) - 128); set(qb, kb, (i, d) => (d & 0xff) - 128); break;
    case 'neg': qa.fill(-127); qb.fill(-127); break;
    case 'posneg': qa.fill(127); qb.fill(-127); break;
    case 'bigpos': set(qa, ka, (i, d) => big(d)); set(qb, kb, (i, d) => big(d)); break;
    case 'bigneg': set(qa, ka, (i, d) => big(d)); set(qb, kb, (i, d) => -big(d)); break;
    case 'alt': set(qa, ka, alt(K)); set(qb, kb, alt(N)); break;
    case 'zeros': break;
    default: throw new Error(`unknown gate fill '${fill}'`);
  }
  return { qa, qb };
}

// -> null, or { index, got, want } for the first differing element
export function firstMismatch(got, want) {
  if (got.length !== want.length) return { index: -1, got: `length ${got.length}`, want: `length ${want.length}` };
  for (let i = 0; i < want.length; i++) if (got[i] !== want[i]) return { index: i, got: got[i], want: want[i] };
  return null;
}

// Runs GATE_CASES through gemm (qa, qb, batch, M, K, N) -> Int32Array | Promise.
// -> { ok, reason, cases: [{ name, ok, ms, mismatch }] }; stops at the first failure.
export async function gateKernel(label, gemm, { cases = GATE_CASES, seed = 0 } = {}) {
  const results = [];
  for (const [name, batch, M, K, N, fill] of cases) {
    const { qa, qb } = gateOperands(fill, batch, M, K, N, seed);
    const want = cpuEngine.gemm(qa, qb, batch, M, K, N);
    const t0 = performance.now();
    let got, error = null;
    try { got = await gemm(qa, qb, batch, M, K, N); } catch (e) { error = e; }
    const ms = performance.now() - t0;
    const mismatch = error ? null : firstMismatch(got, want);
    const ok = !error && !mismatch;
    results.push({ name, ok, ms, mismatch });
    if (!ok) {
      const shape = `${batch}x${M}x${K}x${N}`;
      const why = error ? `threw ${error.message}`
        : `element ${mismatch.index} is ${mismatch.got}, CPU says ${mismatch.want}`;
      return { ok: false, reason: `gate failed: ${label} kernel, case '${name}' (${shape}): ${why}`, cases: results };
    }
  }
  return { ok: true, reason: null, cases: results };
}

// --- audits: each returns null when the result passes, else a reason string -------------------
// The audits read operands through strided views, so they check a GEMM in whatever layout it ran:
// the int8 API's dense A (batch, M, K), B (batch, K, N), or the fused unit's zero-padded int16
// codes (A (batch, Mp, Kp), B^T (batch, Np, Kp)) and padded C (batch, Mp, Np).
// view: element (b, r, c) = data[base + b*sb + r*sr + c*sc]
export const view = (data, base, sb, sr, sc) => ({ data, base, sb, sr, sc });
export const denseView = (data, R, Cc) => view(data, 0, R * Cc, Cc, 1);   // (batch, R, Cc) row-major

export function boundAudit(c, K) {
  return boundAuditView(denseView(c, 1, c.length), 1, 1, c.length, K);
}

// every |C[b, i, j]| <= K * 128^2 (anything else cannot be a sum of K int8 products)
export function boundAuditView(C, batch, M, N, K) {
  const bound = K * 128 * 128, d = C.data, sc = C.sc;
  for (let b = 0; b < batch; b++) {
    for (let i = 0; i < M; i++) {
      const o = C.base + b * C.sb + i * C.sr;
      for (let j = 0; j < N; j++) {
        const v = d[o + j * sc];
        if (v > bound || v < -bound) return `bound audit: element ${(b * M + i) * N + j} is ${v}, |acc| cannot exceed K*128^2 = ${bound}`;
      }
    }
  }
  return null;
}

// Freivalds: C r == A (B r), every sum an exact float64 integer (|C| <= K*2^14 checked first).
export function checksumAudit(qa, qb, c, batch, M, K, N, k, call) {
  return checksumAuditView(denseView(qa, M, K), denseView(qb, K, N), denseView(c, M, N), batch, M, K, N, k, call);
}

// Freivalds' r for one call: N integers in [-R, R], R as large as keeps every sum of the check
// an exact integer below 2^53 (|C| <= K*2^14); a pure function of (k, call, K, N). Int32Array.
export function freivaldsVector(k, call, K, N) {
  const R = Math.max(1, Math.min(2 ** 20, Math.floor(2 ** 52 / (Math.max(K, 1) * N * 16384))));
  const r = new Int32Array(N);
  for (let j = 0; j < N; j++) r[j] = (draw(k, (call * 0x10001 + j) >>> 0) % (2 * R + 1)) - R;
  return r;
}

// A (batch, M, K), B (batch, K, N), C (batch, M, N) as views; r depends on (k, call, K, N) only.
// Every partial sum is an integer below 2^53, so any summation order gives the same sums: each
// loop runs along the operand's contiguous axis. The GPU engine's fused unit runs the same
// check in wasm (wasm_gemm.js audit) and comes here only for the words of a failure.
export function checksumAuditView(A, B, C, batch, M, K, N, k, call) {
  const bounded = boundAuditView(C, batch, M, N, K);
  if (bounded) return bounded;
  const r = freivaldsVector(k, call, K, N);
  const br = new Float64Array(K);
  const a = A.data, bd = B.data, cd = C.data, asc = A.sc, csc = C.sc;
  for (let b = 0; b < batch; b++) {
    const bo = B.base + b * B.sb;
    if (B.sr === 1) {                               // B^T rows: k contiguous
      br.fill(0);
      for (let j = 0; j < N; j++) {
        const rj = r[j], o = bo + j * B.sc;
        for (let kk = 0; kk < K; kk++) br[kk] += bd[o + kk] * rj;
      }
    } else {
      for (let kk = 0; kk < K; kk++) {
        let s = 0;
        const o = bo + kk * B.sr;
        for (let j = 0; j < N; j++) s += bd[o + j * B.sc] * r[j];
        br[kk] = s;
      }
    }
    for (let i = 0; i < M; i++) {
      let lhs = 0, rhs = 0;
      const co = C.base + b * C.sb + i * C.sr, ao = A.base + b * A.sb + i * A.sr;
      for (let j = 0; j < N; j++) lhs += cd[co + j * csc] * r[j];
      for (let kk = 0; kk < K; kk++) rhs += a[ao + kk * asc] * br[kk];
      if (lhs !== rhs) return `checksum audit: batch ${b} row ${i}: C r = ${lhs}, A (B r) = ${rhs}`;
    }
  }
  return null;
}

// A random tile (up to T x T) of C recomputed exactly; the tile is a pure function of (k, call).
export function tileAudit(qa, qb, c, batch, M, K, N, k, call, T = 8) {
  return tileAuditView(denseView(qa, M, K), denseView(qb, K, N), denseView(c, M, N), batch, M, K, N, k, call, T);
}

export function tileAuditView(A, B, C, batch, M, K, N, k, call, T = 8) {
  const b = draw(k, 3 * call) % batch;
  const i0 = draw(k, 3 * call + 1) % M, j0 = draw(k, 3 * call + 2) % N;
  for (let i = i0; i < Math.min(M, i0 + T); i++) {
    const ao = A.base + b * A.sb + i * A.sr;
    for (let j = j0; j < Math.min(N, j0 + T); j++) {
      const bo = B.base + b * B.sb + j * B.sc;
      let s = 0;
      for (let kk = 0; kk < K; kk++) s += A.data[ao + kk * A.sc] * B.data[bo + kk * B.sr];
      const got = C.data[C.base + b * C.sb + i * C.sr + j * C.sc];
      if (got !== s) return `tile audit: batch ${b} element (${i}, ${j}) is ${got}, CPU says ${s}`;
    }
  }
  return null;
}

export const auditKey = (seed) => key(AUDIT_PURPOSE, seed >>> 0);
