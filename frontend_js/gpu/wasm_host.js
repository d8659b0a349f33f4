// The wasm host: the CPU ends of the GPU engine's fused unit, next to the GPU. It quantizes
// float64 operands into padded int16 codes (qrows/qcols), packs them to the kernels' int8x4
// words (pack8) so they upload straight from wasm memory, audits the GPU's int32 result
// (audit: Freivalds + bound in exact float64 integers) and runs the float64 epilogue (epi) —
// the operations of units.js, in our own instance of wasm_gemm.js GEMM_WASM (the module the
// wasm engine gated). gateWasmHost gates the parts only the host uses (pack8, audit) when the
// engine is made. Padded shapes: A codes (batch, Mp, Kp), B^T codes (batch, Np, Kp), C (batch,
// Mp, Np); Kp a multiple of 8, Mp even, Np a multiple of 4 (unitPadding); pads are code 0.
import { cpuEngine } from '../units.js';
import { GEMM_WASM } from '../wasm_gemm.js';
import { gateOperands, checksumAuditView, freivaldsVector, auditKey, view } from './gpu_gates.js';

// (m, kk, n) -> the padded shape the host's quantizers and epilogue use
export const unitPadding = (m, kk, n) => ({ kp: (kk + 7) & ~7, mp: m + (m & 1), np: (n + 3) & ~3 });

// The CPU ends of the fused unit for the GPU engine: our own instance of GEMM_WASM (the module
// the wasm engine gated: qrows, qcols, epi with units.js's operations) and a bump allocator over
// its memory for the calls in flight (codes, scales, C, result); it rewinds when none is left.
// Its `audit` (Freivalds + bound in exact float64 integers) and `pack8` are gated here
// (gateWasmHost) like everything else: where either disagrees with JS, the engine does without
// the host (GEMMs through the int8 API, JS quantizers and audits).
export class WasmUnitHost {
  constructor() {
    const inst = new WebAssembly.Instance(new WebAssembly.Module(GEMM_WASM), {});
    Object.assign(this, inst.exports);     // mem, qrows, qcols, epi, audit, pack8 (and gemm, unused here)
    this.top = 0; this.live = 0;
  }

  // The checksum audit of one padded GEMM result in this memory -> 0, or 1 + (b*M + i) of the
  // first failing row. r: freivaldsVector(k, call, K, N).
  auditAt(oA, oB, oC, r, nb, m, kk, n, mp, np, kp) {
    const top = this.top, oR = this.alloc(n * 8), oBr = this.alloc(kp * 8);
    new Float64Array(this.mem.buffer, oR, n).set(r);
    const row = this.audit(oA, oB, oC, oR, oBr, nb, m, n, kk, kp, mp, np);
    this.top = top;
    return row;
  }

  alloc(bytes) {
    const at = this.top;
    this.top += (bytes + 15) & ~15;
    const need = Math.ceil((this.top - this.mem.buffer.byteLength) / 65536);
    if (need > 0) this.mem.grow(need);
    return at;
  }

  done() { if (--this.live === 0) this.top = 0; }
}

// The host's pack8 against the codes it packs, and its audit against gpu_gates.js
// checksumAuditView on exact and corrupted GEMM results (ragged padded shapes, batches, K = 4096
// at +-127): it must pass every exact one and name the corrupted row of every other.
// -> null, or the first disagreement in words.
export function gateWasmHost(h) {
  const shapes = [[1, 1, 1, 1, 'random'], [1, 3, 5, 7, 'random'], [2, 5, 9, 3, 'random'], [3, 17, 31, 19, 'random'],
    [1, 64, 257, 33, 'random'], [1, 3, 4096, 5, 'posneg'], [2, 2, 4095, 3, 'bigpos']];
  const key = auditKey(0x5eed);
  try {
    // pack8 first: what the GPU sees must be the codes the audit reads
    for (const n of [8, 16, 24, 40, 4096 + 8]) {
      const codes = gateOperands('random', 1, 1, n, 1, n).qa.map((v) => Math.max(-127, v));
      h.top = 0;
      const o16 = h.alloc(2 * n), o8 = h.alloc(n);
      new Int16Array(h.mem.buffer, o16, n).set(codes);
      h.pack8(o16, o8, n);
      const got = new Int8Array(h.mem.buffer, o8, n), bad = got.findIndex((v, i) => v !== codes[i]);
      if (bad >= 0) return `wasm pack8 (n = ${n}) byte ${bad}: ${got[bad]} vs code ${codes[bad]}`;
    }
    for (const [s, [nb, m, kk, n, fill]] of shapes.entries()) {
      const { kp, mp, np } = unitPadding(m, kk, n);
      const { qa, qb } = gateOperands(fill, nb, m, kk, n, 77 + s);
      const A = new Int8Array(nb * mp * kp), BT = new Int8Array(nb * np * kp);     // padded, pads 0
      for (let b = 0; b < nb; b++) for (let k = 0; k < kk; k++) {
        for (let i = 0; i < m; i++) A[(b * mp + i) * kp + k] = Math.max(-127, qa[(b * m + i) * kk + k]);
        for (let j = 0; j < n; j++) BT[(b * np + j) * kp + k] = Math.max(-127, qb[(b * kk + k) * n + j]);
      }
      const C = cpuEngine.gemmBT(A, BT, nb, mp, kp, np);
      h.top = 0;
      const oA = h.alloc(A.length * 2), oB = h.alloc(BT.length * 2), oC = h.alloc(C.length * 4);
      new Int16Array(h.mem.buffer, oA, A.length).set(A);
      new Int16Array(h.mem.buffer, oB, BT.length).set(BT);
      const views = () => [view(new Int16Array(h.mem.buffer), oA / 2, mp * kp, kp, 1), view(new Int16Array(h.mem.buffer), oB / 2, np * kp, 1, kp),
        view(new Int32Array(h.mem.buffer), oC / 4, mp * np, np, 1)];
      // exact, then one element off by one in the last row and column of the last batch, then
      // in the first, then a value no int8 GEMM can produce (bound)
      const edits = [null, [nb - 1, m - 1, n - 1, 1], [0, 0, 0, -1], [0, 0, 0, kk * 16384 + 1 - C[0]]];
      for (const [e, edit] of edits.entries()) {
        const c = C.slice();
        if (edit) c[(edit[0] * mp + edit[1]) * np + edit[2]] += edit[3];
        new Int32Array(h.mem.buffer, oC, c.length).set(c);
        const want = edit ? 1 + edit[0] * m + edit[1] : 0, call = 3 * s + e + 1;
        const got = h.auditAt(oA, oB, oC, freivaldsVector(key, call, kk, n), nb, m, kk, n, mp, np, kp);
        const js = checksumAuditView(...views(), nb, m, kk, n, key, call);
        if (got !== want || (js === null) !== (want === 0)) {
          return `wasm audit (${nb}, ${m}, ${kk}, ${n}) edit ${JSON.stringify(edit)}: returned ${got}, expected ${want}; JS audit: ${js}`;
        }
      }
    }
    return null;
  } catch (e) {
    return `wasm audit failed to run: ${e.message}`;
  } finally {
    h.top = 0;
  }
}
