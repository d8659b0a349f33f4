// The INT8 units, mirroring daisy/units.py. Every matmul of the model goes through qmatmul:
//   qmatmul(A, B) = epilogue(gemm_i8(quantizeRows(A), quantizeCols(B)))
// Quantization and the float epilogue always run here on the CPU (float64, the bits of the
// reference); only the exact integer GEMM is delegated to an engine (CPU below, or the WGSL
// kernels of frontend_js/gpu/), so a GPU can only ever be asked for integer work.
import { rint } from './detmath.js';

export const QMAX = 127;
export const SCALE_FLOOR = 2 ** -60;                      // rows with max|x| below this use the floor
export const MAX_K = Math.floor((2 ** 31 - 1) / (QMAX * QMAX));  // 133144: no int32 overflow

// x: Float64Array (batch*M*K) row-major -> { q: Int8Array (batch*M*K), s: Float64Array (batch*M) }
export function quantizeRows(x, batch, M, K) {
  const q = new Int8Array(batch * M * K);
  const s = new Float64Array(batch * M);
  for (let r = 0; r < batch * M; r++) {
    const o = r * K;
    let amax = 0;
    for (let k = 0; k < K; k++) { const a = Math.abs(x[o + k]); if (a > amax) amax = a; }
    const sc = (amax > SCALE_FLOOR ? amax : SCALE_FLOOR) / QMAX;   // max(amax, floor) / 127
    s[r] = sc;
    for (let k = 0; k < K; k++) {
      let v = rint(x[o + k] / sc);
      q[o + k] = v > QMAX ? QMAX : v < -QMAX ? -QMAX : v;
    }
  }
  return { q, s };
}

// x: Float64Array (batch*K*N) row-major -> { q (batch*K*N, same layout), s (batch*N) }: per column
export function quantizeCols(x, batch, K, N) {
  const q = new Int8Array(batch * K * N);
  const s = new Float64Array(batch * N);
  for (let b = 0; b < batch; b++) {
    const o = b * K * N;
    for (let j = 0; j < N; j++) {
      let amax = 0;
      for (let k = 0; k < K; k++) { const a = Math.abs(x[o + k * N + j]); if (a > amax) amax = a; }
      const sc = (amax > SCALE_FLOOR ? amax : SCALE_FLOOR) / QMAX;
      s[b * N + j] = sc;
      for (let k = 0; k < K; k++) {
        const v = rint(x[o + k * N + j] / sc);
        q[o + k * N + j] = v > QMAX ? QMAX : v < -QMAX ? -QMAX : v;
      }
    }
  }
  return { q, s };
}

// The CPU integer engine: int8 (batch, M, K) @ int8 (batch, K, N) -> Int32Array (batch, M, N), exact.
export const cpuEngine = {
  name: 'cpu',
  gemm(qa, qb, batch, M, K, N) {
    if (K > MAX_K) throw new Error(`K=${K} could overflow int32`);
    const c = new Int32Array(batch * M * N);
    for (let b = 0; b < batch; b++) {
      const ao = b * M * K, bo = b * K * N, co = b * M * N;
      for (let i = 0; i < M; i++) {
        for (let k = 0; k < K; k++) {
          const a = qa[ao + i * K + k];
          if (a === 0) continue;
          const brow = bo + k * N, crow = co + i * N;
          for (let j = 0; j < N; j++) c[crow + j] += a * qb[brow + j];
        }
      }
    }
    return c;
  },
  // int8 (batch, M, K) @ (int8 (batch, N, K))^T -> Int32Array (batch, M, N): dot products along K.
  // Every partial sum is an integer below K*127^2 < 2^31, so float64 number adds are exact.
  gemmBT(qa, qbT, batch, M, K, N) {
    if (K > MAX_K) throw new Error(`K=${K} could overflow int32`);
    const c = new Int32Array(batch * M * N);
    for (let b = 0; b < batch; b++) {
      const ao = b * M * K, bo = b * N * K, co = b * M * N;
      for (let i = 0; i < M; i++) {
        const ar = ao + i * K;
        for (let j = 0; j < N; j++) {
          const br = bo + j * K;
          let acc = 0;
          for (let k = 0; k < K; k++) acc += qa[ar + k] * qbT[br + k];
          c[co + i * N + j] = acc;
        }
      }
    }
    return c;
  },
};

// acc (batch*M*N) int32, sRow (batch*M), sCol (batch*N) -> float64: (acc * sRow[i]) * sCol[j]
// (into `out` when given)
export function epilogue(acc, sRow, sCol, batch, M, N, out = new Float64Array(batch * M * N)) {
  for (let b = 0; b < batch; b++) {
    for (let i = 0; i < M; i++) {
      const r = sRow[b * M + i], o = (b * M + i) * N;
      for (let j = 0; j < N; j++) out[o + j] = (acc[o + j] * r) * sCol[b * N + j];
    }
  }
  return out;
}

// a (batch, M, K) @ b (batch, K, N) through the INT8 unit -> Float64Array (batch, M, N).
// engine.gemm may return a Promise (GPU), so qmatmul is async.
export async function qmatmul(engine, a, b, batch, M, K, N) {
  return qmatmulT(engine, a, false, b, false, batch, M, K, N);
}

// int8 (batch, R, Cc) -> (batch, Cc, R)
export function transposeI8(q, batch, R, Cc) {
  const t = new Int8Array(batch * R * Cc);
  for (let b = 0; b < batch; b++) {
    const o = b * R * Cc;
    for (let i = 0; i < R; i++) for (let j = 0; j < Cc; j++) t[o + j * R + i] = q[o + i * Cc + j];
  }
  return t;
}

// qmatmul with either operand given transposed in storage, so the model never copies floats
// to transpose them (the logical math, hence the bits, is that of qmatmul on the logical A, B):
//   transA: a holds A^T, (batch, K, M);  transB: b holds B^T, (batch, N, K).
// A is quantized per logical row, B per logical column, exactly as daisy.units.qmatmul.
// An engine with its own qmatmulT (the wasm one, gated against this path) does all of it;
// otherwise the engine gets qa (batch, M, K); if it has gemmBT it gets qb^T (batch, N, K), else qb (K, N).
// out: an optional Float64Array (batch*M*N) to write the result into (a trainer's arena).
export async function qmatmulT(engine, a, transA, b, transB, batch, M, K, N, out = undefined) {
  if (engine.qmatmulT) return engine.qmatmulT(a, transA, b, transB, batch, M, K, N, out);   // a fused unit
  let qa, sa, qbT, sb;
  if (transA) {                                   // per column of the stored (K, M)
    const A = quantizeCols(a, batch, K, M);
    qa = transposeI8(A.q, batch, K, M); sa = A.s;
  } else {
    const A = quantizeRows(a, batch, M, K);
    qa = A.q; sa = A.s;
  }
  if (transB) {                                   // logical column j = stored row j
    const Bq = quantizeRows(b, batch, N, K);
    qbT = Bq.q; sb = Bq.s;
  } else {
    const Bq = quantizeCols(b, batch, K, N);
    sb = Bq.s;
    if (!engine.gemmBT) {
      const acc = await engine.gemm(qa, Bq.q, batch, M, K, N);
      return epilogue(acc, sa, sb, batch, M, N, out);
    }
    qbT = transposeI8(Bq.q, batch, K, N);
  }
  const acc = engine.gemmBT
    ? await engine.gemmBT(qa, qbT, batch, M, K, N)
    : await engine.gemm(qa, transposeI8(qbT, batch, N, K), batch, M, K, N);
  return epilogue(acc, sa, sb, batch, M, N, out);
}

// One element of qmatmul from its row of A and column of B (K values each): both quantized as
// quantizeRows quantizes a row of one, the exact integer dot product, the epilogue. One fused pass
// (no arrays): the resident step's self-audit recomputes ~80 of these per local step on the host,
// ~2.4x faster than through quantizeRows (TEST_RESULTS "What the unit's self-audit costs"); the
// same operations on the same values, so the same bits (tests/js/mirror.test.mjs compares them).
export function unitDot(row, col, K) {
  let amaxA = 0, amaxB = 0;
  for (let k = 0; k < K; k++) {
    const a = Math.abs(row[k]), b = Math.abs(col[k]);
    if (a > amaxA) amaxA = a;
    if (b > amaxB) amaxB = b;
  }
  const sa = (amaxA > SCALE_FLOOR ? amaxA : SCALE_FLOOR) / QMAX, sb = (amaxB > SCALE_FLOOR ? amaxB : SCALE_FLOOR) / QMAX;
  let acc = 0;                                   // |acc| <= 127^2 K < 2^31: exact in a float64
  for (let k = 0; k < K; k++) {
    const va = rint(row[k] / sa), vb = rint(col[k] / sb);
    // clamped, then `| 0` as the Int8Array store does it (NaN and -0 become 0)
    acc += ((va > QMAX ? QMAX : va < -QMAX ? -QMAX : va) | 0) * ((vb > QMAX ? QMAX : vb < -QMAX ? -QMAX : vb) | 0);
  }
  return (acc * sa) * sb;
}

// --- int8 packed four to a u32, as the WGSL kernels read them (little-endian lanes) ---------
// pack:   word = b0 | b1<<8 | b2<<16 | b3<<24, with b = q & 0xff
export function packI8x4(q) {
  const n = q.length >> 2, w = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    w[i] = ((q[4 * i] & 0xff) | ((q[4 * i + 1] & 0xff) << 8) | ((q[4 * i + 2] & 0xff) << 16)
      | ((q[4 * i + 3] & 0xff) << 24)) >>> 0;
  }
  return w;
}
// sign extend: int8 value of a byte b in 0..255 = (b ^ 0x80) - 0x80
export const signExtend8 = (b) => (b ^ 0x80) - 0x80;
// unpack: lane i = signExtend8((w >>> 8i) & 0xff)
export function unpackI8x4(w) {
  const q = new Int8Array(w.length * 4);
  for (let i = 0; i < w.length; i++) {
    for (let l = 0; l < 4; l++) q[4 * i + l] = signExtend8((w[i] >>> (8 * l)) & 0xff);
  }
  return q;
}
