// The compute backends' parts, gated here and nowhere else (docs/ARCHITECTURE.md "Compute"); which
// CPU backend a page runs (threads, unit workers or this module's best) is backends.js's choice (pickBackend).
// A backend is one frozen value, handed whole to the trainer, the model and the generator:
//   name          the GEMM engine's name ('wasm-simd', 'cpu', 'webgpu-packed', ...)
//   engine        the INT8 unit's integer engine (units.js: gemm, gemmBT and/or a fused qmatmulT)
//   rmsnorm, rmsnormBackward, causalSoftmax, softmaxBackward, relu, reluBackward, crossEntropy
//                 the row pieces, in model.js's signatures
//   adamStep      optim.adamStep's signature
//   weightHash(params) -> hex; weightHashAsync(params) -> Promise of the same hex (through
//                 sha and shaAsync, hashing.js's {name, hexOf(parts)})
//   parts         which implementation the other parts run: {rows, adam, sha, shaAsync}
//   newArena()    a StepArena (arena.js) for a trainer's step arrays, where this backend wants them
//                 (the threaded backend's are in its workers' shared memory; cpu/threads.js)
//   threads       how many threads a step's kernels run on (1 but for cpu/threads.js's and cpu/unit_workers.js's)
//   notes         why a part is not its fast version (empty when every part is)
// Families, best first: 'wasm-simd' (the WebAssembly SIMD GEMM, row kernels and Adam, each used
// only after its gate against the JS mirror passed) and 'cpu' (the scalar GEMM and the JS mirror
// itself). The SHA-256 of either is the fastest that passed its gate: WebCrypto (async only),
// the wasm compress, the JS one. referenceBackend is the JS mirror alone, ungated: it is the
// mirror. Nothing is cached: a caller makes its backends once and keeps them.
import { cpuEngine } from './units.js';
import { createWasmEngine, gateEngine, gateUnit } from './wasm_gemm.js';
import { createFloatKernels, rowPieces, adamUpdate } from './wasm_float.js';
import { jsSha, paramBytes, createWasmSha, createSubtleSha, gateSha } from './hashing.js';
import * as model from './model.js';
import * as optim from './optim.js';
import { freshF64, StepArena } from './arena.js';
import { sameBits, firstDiff } from './bits.js';

const ROW_PIECES = ['rmsnorm', 'rmsnormBackward', 'causalSoftmax', 'softmaxBackward', 'relu', 'reluBackward', 'crossEntropy'];
export const JS_ROWS = Object.freeze(Object.fromEntries(ROW_PIECES.map((k) => [k, model[k]])));

// the parts -> a backend; rows/adam/sha default to the JS mirror. parts: names of the rows and
// adam in use ('js' by default); sha, shaAsync: {name, hexOf(parts)} (hashing.js)
export function makeBackend({ engine, rows = JS_ROWS, adam = optim.adamStep, sha = jsSha, shaAsync = null, parts = {}, notes = [],
  newArena = () => new StepArena(), threads = 1 }) {
  if (!engine || !(engine.gemm || engine.qmatmulT)) throw new TypeError('backend: the engine needs gemm or qmatmulT (units.js)');
  for (const k of ROW_PIECES) if (typeof rows[k] !== 'function') throw new TypeError(`backend: the row piece ${k} is missing`);
  if (typeof adam !== 'function') throw new TypeError('backend: adamStep is missing');
  const hashAsync = shaAsync || sha;
  return Object.freeze({
    get name() { return engine.name; },      // the GPU engine renames itself when it falls to the CPU
    engine,
    ...Object.fromEntries(ROW_PIECES.map((k) => [k, rows[k]])),
    adamStep: adam,
    sha, shaAsync: hashAsync,
    weightHash: (params) => sha.hexOf(paramBytes(params)),
    weightHashAsync: async (params) => hashAsync.hexOf(paramBytes(params)),
    parts: Object.freeze({ rows: 'js', adam: 'js', ...parts, sha: sha.name, shaAsync: hashAsync.name }),
    notes: Object.freeze(notes.slice()),
    newArena, threads,
  });
}

export const referenceBackend = makeBackend({ engine: cpuEngine });

// backend, engine -> the same parts with another GEMM engine (the GPU's, whose own CPU
// fallback is the backend's engine)
export function withEngine(backend, engine) {
  const { sha, shaAsync, parts, notes, newArena, threads } = backend;
  return makeBackend({ engine, rows: backend, adam: backend.adamStep, sha, shaAsync, parts, notes, newArena, threads });
}

// -> the fastest GEMM engine whose gate passed: {engine, note} (note: why not wasm-simd, or null)
export function bestGemmEngine() {
  try {
    const wasm = createWasmEngine();
    const bad = gateEngine(wasm) || gateUnit(wasm);
    if (bad) throw new Error(`wasm-simd gemm failed its gate: ${bad}`);
    return { engine: wasm, note: null };
  } catch (e) {
    return { engine: cpuEngine, note: `wasm-simd GEMM not used: ${e.message}` };
  }
}

// -> the backends, best first: [wasm-simd (when its GEMM passed its gate), cpu]
export async function createBackends() {
  const gemm = bestGemmEngine(), gemmNotes = gemm.note ? [gemm.note] : [], floatNotes = [], shaNotes = [];
  let rows = JS_ROWS, adam = optim.adamStep;
  const parts = {};
  try {
    const k = createFloatKernels();
    const rowsBad = gateRowKernels(k), adamBad = gateAdam(k);
    if (rowsBad) floatNotes.push(`wasm row kernels not used: ${rowsBad}`);
    else { rows = rowPieces(k); parts.rows = 'wasm-simd'; }
    if (adamBad) floatNotes.push(`wasm Adam not used: ${adamBad}`);
    else { adam = adamUpdate(k); parts.adam = 'wasm-simd'; }
  } catch (e) {
    floatNotes.push(`wasm row kernels and Adam not used: ${e.message}`);
  }
  const sha = await gatedSha('wasm', createWasmSha, shaNotes) || jsSha;
  const shaAsync = await gatedSha('WebCrypto', createSubtleSha, shaNotes);
  const out = [];
  if (gemm.engine !== cpuEngine) {
    out.push(makeBackend({ engine: gemm.engine, rows, adam, sha, shaAsync, parts, notes: [...floatNotes, ...shaNotes] }));
  }
  out.push(makeBackend({ engine: cpuEngine, sha, shaAsync, notes: [...gemmNotes, ...shaNotes] }));
  return out;
}

// the backend the trainer uses: the first of createBackends()
export async function bestBackend() {
  return (await createBackends())[0];
}

// -> the sha make() gives when it passes gateSha, else null (why, in notes)
async function gatedSha(what, make, notes) {
  try {
    const sha = make(), bad = await gateSha(sha);
    if (!bad) return sha;
    notes.push(`the ${what} SHA-256 not used: ${bad}`);
  } catch (e) {
    notes.push(`the ${what} SHA-256 not used: ${e.message}`);
  }
  return null;
}

// --- the gates: each fast part against its JS twin, bit for bit -----------------------------

// values for the gate: many magnitudes, ties, zeros of both signs, spreads past exp's range
// (x - m < -708), infinities; a counter-based LCG (no Math.random)
function gateValues(n, seed, withSpecials) {
  const x = new Float64Array(n);
  let st = seed >>> 0;
  const next = () => { st = (Math.imul(st, 1664525) + 1013904223) >>> 0; return st; };
  const special = [0, -0, 3.5, -3.5, 1e-310, -708, 709, -1000, 1e300, -1e300, -Infinity];
  for (let i = 0; i < n; i++) {
    const r = next();
    if (withSpecials && r % 9 === 0) x[i] = special[next() % special.length];
    else x[i] = ((next() >>> 8) * 2 ** -24 - 0.5) * 2 ** ((r >>> 4) % 12 - 2);
  }
  return x;
}

// the wasm float kernels (wasm_float.js) -> null, or the first disagreement of their row pieces
// with model.js's in words
export function gateRowKernels(kernels) {
  const fast = rowPieces(kernels), js = JS_ROWS;
  let seed = 1;
  for (const [G, T] of [[1, 1], [2, 2], [3, 3], [2, 5], [4, 8], [2, 17], [3, 32], [1, 33]]) {
    for (const specials of [false, true]) {
      const s = gateValues(G * T * T, seed++, specials);
      const scale = specials ? 0.35355339059327373 : 1.0;
      const got = fast.causalSoftmax(s, G, T, freshF64, scale), want = js.causalSoftmax(s, G, T, freshF64, scale);
      const i = firstDiff(got, want);
      if (i >= 0) return `causal softmax (${G}, ${T}, ${T}) index ${i}: ${got[i]} vs JS ${want[i]}`;
    }
  }
  for (const [N, V] of [[1, 1], [2, 2], [3, 3], [5, 7], [4, 64], [9, 257]]) {
    for (const specials of [false, true]) {
      const logits = gateValues(N * V, seed++, specials).map((v) => (v === -Infinity || Math.abs(v) > 1e299 ? -1000 : v));
      const targets = Int32Array.from({ length: N }, (_, n) => (n * 7919) % V);
      const [lossGot, dGot] = fast.crossEntropy(logits, targets, N, V), [lossWant, dWant] = js.crossEntropy(logits, targets, N, V);
      if (!sameBits(lossGot, lossWant)) return `cross-entropy (${N}, ${V}) loss: ${lossGot} vs JS ${lossWant}`;
      const i = firstDiff(dGot, dWant);
      if (i >= 0) return `cross-entropy (${N}, ${V}) dlogits index ${i}: ${dGot[i]} vs JS ${dWant[i]}`;
    }
  }
  for (const [N, C] of [[1, 1], [2, 3], [3, 8], [5, 17], [64, 32], [7, 128]]) {
    for (const specials of [false, true]) {
      const x = gateValues(N * C, seed++, specials).map((v) => (Math.abs(v) === Infinity ? 1e300 : v));
      const g = gateValues(C, seed++, false), dy = gateValues(N * C, seed++, specials).map((v) => (Math.abs(v) === Infinity ? -3 : v));
      const [yGot, cGot] = fast.rmsnorm(x, g, N, C), [yWant, cWant] = js.rmsnorm(x, g, N, C);
      for (const [what, a, b] of [['y', yGot, yWant], ['xhat', cGot.xhat, cWant.xhat], ['r', cGot.r, cWant.r]]) {
        const i = firstDiff(a, b);
        if (i >= 0) return `rmsnorm (${N}, ${C}) ${what} index ${i}: ${a[i]} vs JS ${b[i]}`;
      }
      const [dxGot, dgGot] = fast.rmsnormBackward(dy, g, cWant, N, C), [dxWant, dgWant] = js.rmsnormBackward(dy, g, cWant, N, C);
      for (const [what, a, b] of [['dx', dxGot, dxWant], ['dg', dgGot, dgWant]]) {
        const i = firstDiff(a, b);
        if (i >= 0) return `rmsnorm backward (${N}, ${C}) ${what} index ${i}: ${a[i]} vs JS ${b[i]}`;
      }
    }
  }
  for (const [G, T] of [[1, 1], [2, 3], [3, 8], [2, 17], [4, 32]]) {
    const p = js.causalSoftmax(gateValues(G * T * T, seed++, true), G, T), dp = gateValues(G * T * T, seed++, true);
    const scale = 1.0 / Math.sqrt(T);
    const got = fast.softmaxBackward(dp, p, G, T, scale), want = js.softmaxBackward(dp, p, G, T, scale);
    const i = firstDiff(got, want);
    if (i >= 0) return `softmax backward (${G}, ${T}, ${T}) index ${i}: ${got[i]} vs JS ${want[i]}`;
  }
  for (const n of [1, 2, 3, 33, 1024]) {
    const h = gateValues(n, seed++, true), dhr = gateValues(n, seed++, true);
    h[0] = NaN;
    for (const [what, got, want] of [['relu', fast.relu(h), js.relu(h)], ['relu backward', fast.reluBackward(dhr, h), js.reluBackward(dhr, h)]]) {
      const i = firstDiff(got, want);
      if (i >= 0) return `${what} (${n}) index ${i}: ${got[i]} vs JS ${want[i]}`;
    }
  }
  return null;
}

// kernels (their adamStep(w, g, m, v, lr, bc1, bc2)) -> null, or the first disagreement with
// optim.adamStep in words: odd and even lengths, steps 1, 2, 3 and 1000, gradients of many
// magnitudes, zeros of both signs
export function gateAdam(kernels) {
  let st = 12345;
  const next = () => { st = (Math.imul(st, 1664525) + 1013904223) >>> 0; return st; };
  const value = () => { const r = next(); return r % 11 === 0 ? [0, -0, 1e-300, -1e300][r % 4] : ((next() >>> 8) * 2 ** -24 - 0.5) * 2 ** (r % 40 - 30); };
  const fill = (n) => Float64Array.from({ length: n }, value);
  for (const [n, t0, lr] of [[1, 0, 0.01], [2, 1, 0.005], [7, 2, 0.05], [33, 999, 0.01], [256, 0, 0.03]]) {
    const w = fill(n), g = fill(n), m = fill(n).map(Math.abs), v = fill(n).map(Math.abs);
    const a = { x: Float64Array.from(w) }, b = { x: Float64Array.from(w) };
    const sa = { t: t0, m: { x: Float64Array.from(m) }, v: { x: Float64Array.from(v) } };
    const sb = { t: t0, m: { x: Float64Array.from(m) }, v: { x: Float64Array.from(v) } };
    adamUpdate(kernels)(a, { x: g }, sa, lr);
    optim.adamStep(b, { x: g }, sb, lr);
    const t = t0 + 1;
    for (const [what, x, y] of [['w', a.x, b.x], ['m', sa.m.x, sb.m.x], ['v', sa.v.x, sb.v.x]]) {
      for (let i = 0; i < n; i++) {
        if (!sameBits(x[i], y[i])) return `${what}[${i}] of ${n} at step ${t}: ${x[i]} vs JS ${y[i]}`;
      }
    }
    if (sa.t !== t) return `the step count is ${sa.t} after step ${t}`;
  }
  return null;
}
