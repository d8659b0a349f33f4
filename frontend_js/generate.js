// Sampling text from the model, mirroring daisy/generate.py bit for bit (its docstring is the
// spec): same weights + prompt + settings + seed give the same token ids here, in the Python
// reference, in the page and in the offline kit.
//   context = last seq_len tokens of (prompt + tokens so far)  (an empty prompt starts at EOT)
//   logits  = forward(params, context)[last position]          (the full-context INT8 forward)
// No KV cache: P.V quantizes v per column over the whole context, so a cached forward would
// not give the reference's bits. lastLogits below is model.forward for one sequence, computing
// in the last block only what the last position needs (exact: see its comment).
import { key, uniform, PURPOSE_SAMPLE } from './prng.js';
import { exp, treeSum } from './detmath.js';
import { checkBackend } from './model.js';
import { EOT, VOCAB_SIZE, encode, decode } from './tokenizer.js';
import { qmatmulT } from './units.js';
import { referenceBackend } from './engines.js';

export const MAX_TOKENS = 2000;
export const MAX_SEED = 2 ** 32 - 1;

export class GenerateError extends Error {
  constructor(msg) { super(msg); this.name = 'GenerateError'; }
}

// logits (V,) float64 -> the sampled token id for continuation position i (daisy next_token)
export function nextToken(logits, i, temperature, topK, seed) {
  const V = logits.length;
  if (temperature === 0.0) {                        // np.argmax: the first maximum (first NaN wins)
    let best = 0;
    for (let j = 0; j < V; j++) {
      const x = logits[j];
      if (x !== x) return j;
      if (x > logits[best]) best = j;
    }
    return best;
  }
  const z = new Float64Array(V);                    // (V,)
  for (let j = 0; j < V; j++) z[j] = logits[j] / temperature;
  const keep = new Uint8Array(V).fill(1);
  if (topK > 0 && topK < V) {
    // np.lexsort((arange, -z)): by -z ascending (NaN last), then id ascending
    const order = Array.from({ length: V }, (_, j) => j);
    order.sort((a, b) => {
      const na = -z[a], nb = -z[b];
      const aNaN = na !== na, bNaN = nb !== nb;
      if (aNaN !== bNaN) return aNaN ? 1 : -1;
      if (!aNaN && na !== nb) return na < nb ? -1 : 1;
      return a - b;
    });
    keep.fill(0);
    for (let r = 0; r < topK; r++) keep[order[r]] = 1;
  }
  let m = -Infinity;                                // np.max(z[keep]): NaN propagates
  for (let j = 0; j < V; j++) {
    if (!keep[j]) continue;
    if (z[j] !== z[j]) { m = z[j]; break; }
    if (z[j] > m) m = z[j];
  }
  const e = new Float64Array(V);                    // (V,) +0 where not kept
  for (let j = 0; j < V; j++) if (keep[j]) e[j] = exp(z[j] - m);
  const total = treeSum(e, 0, V);
  const u = uniform(key(PURPOSE_SAMPLE, seed, i), 0) * total;
  let run = 0.0, last = 0;
  for (let j = 0; j < V; j++) {
    if (!keep[j]) continue;
    run = run + e[j];
    last = j;
    if (run > u) return j;
  }
  return last;
}

// qkv (T, 3C) as (T, 3, H, D) -> part s as (H, T, D), rows t0..T-1 (model.js splitHeads, B = 1)
function heads(qkv, part, T, H, D, t0 = 0) {
  const C = H * D, n = T - t0, out = new Float64Array(H * n * D);
  for (let h = 0; h < H; h++) for (let t = t0; t < T; t++) {
    const src = t * 3 * C + part * C + h * D, dst = (h * n + (t - t0)) * D;
    for (let d = 0; d < D; d++) out[dst + d] = qkv[src + d];
  }
  return out;
}

// yh (H, n, D) -> (n, C) (model.js mergeHeads, B = 1)
function merged(yh, n, H, D) {
  const C = H * D, out = new Float64Array(n * C);
  for (let h = 0; h < H; h++) for (let t = 0; t < n; t++) {
    for (let d = 0; d < D; d++) out[t * C + h * D + d] = yh[(h * n + t) * D + d];
  }
  return out;
}

// idx (T,) -> the logits (V,) of the last position: bit for bit model.forward(idx as (1, T))'s
// last row. Blocks 0..L-2 run in full (later blocks read every position's k and v). In the last
// block every quantization is per row of the left operand (each row on its own) or per column
// of a weight, except P.V's v (per column over all T: computed in full); so the queries,
// softmax, projections, MLP, final norm and head are computed for the last row only.
// be: the backend (engines.js) of the matmuls, RMSNorm and the softmax rows
export async function lastLogits(params, cfg, idx, T, be = referenceBackend) {
  checkBackend(be, 'lastLogits');
  const C = cfg.width, H = cfg.heads, L = cfg.layers, V = VOCAB_SIZE, D = Math.floor(C / H);
  const attScale = 1.0 / Math.sqrt(D);
  const mm = (a, ta, b, tb, batch, M, K, N) => qmatmulT(be.engine, a, ta, b, tb, batch, M, K, N);
  const wte = params['wte.weight'], wpe = params['wpe.weight'];
  let x = new Float64Array(T * C);                                            // (T, C)
  for (let t = 0; t < T; t++) {
    const r = idx[t] * C;
    for (let c = 0; c < C; c++) x[t * C + c] = wte[r + c] + wpe[t * C + c];
  }
  let n = T;                                                                   // rows of x kept
  for (let l = 0; l < L; l++) {
    const p = `blocks.${l}.`, last = l === L - 1;
    const [xn1] = be.rmsnorm(x, params[p + 'norm1.weight'], T, C);           // (T, C)
    const qkv = await mm(xn1, false, params[p + 'attn.qkv.weight'], true, 1, T, C, 3 * C);   // (T, 3C)
    const k = heads(qkv, 1, T, H, D), v = heads(qkv, 2, T, H, D);            // (H, T, D)
    let yh;
    if (!last) {
      const q = heads(qkv, 0, T, H, D);                                      // (H, T, D)
      const s = await mm(q, false, k, true, H, T, D, T);                     // (H, T, T)
      for (let i = 0; i < s.length; i++) s[i] = s[i] * attScale;
      yh = await mm(be.causalSoftmax(s, H, T), false, v, false, H, T, T, D);   // (H, T, D)
    } else {
      const q = heads(qkv, 0, T, H, D, T - 1);                               // (H, 1, D)
      const s = await mm(q, false, k, true, H, 1, D, T);                     // (H, 1, T)
      for (let i = 0; i < s.length; i++) s[i] = s[i] * attScale;
      const pr = new Float64Array(H * T), e = new Float64Array(T);           // causalSoftmax's row T-1
      for (let h = 0; h < H; h++) {
        const o = h * T;
        let m = s[o];
        for (let j = 1; j < T; j++) if (s[o + j] > m) m = s[o + j];
        for (let j = 0; j < T; j++) e[j] = exp(s[o + j] - m);
        const z = treeSum(e, 0, T);
        for (let j = 0; j < T; j++) pr[o + j] = e[j] / z;
      }
      yh = await mm(pr, false, v, false, H, 1, T, D);                        // (H, 1, D)
      x = x.slice((T - 1) * C);                                              // (1, C)
      n = 1;
    }
    const att = await mm(merged(yh, n, H, D), false, params[p + 'attn.proj.weight'], true, 1, n, C, C);
    for (let i = 0; i < x.length; i++) x[i] = x[i] + att[i];
    const [xn2] = be.rmsnorm(x, params[p + 'norm2.weight'], n, C);           // (n, C)
    const h = await mm(xn2, false, params[p + 'mlp.fc.weight'], true, 1, n, C, 4 * C);        // (n, 4C)
    for (let i = 0; i < h.length; i++) h[i] = (h[i] > 0.0 || h[i] !== h[i]) ? h[i] : 0.0;   // ReLU
    const mlp = await mm(h, false, params[p + 'mlp.proj.weight'], true, 1, n, 4 * C, C);
    for (let i = 0; i < x.length; i++) x[i] = x[i] + mlp[i];
  }
  const [xf] = be.rmsnorm(x, params['norm_f.weight'], n, C);                 // (1, C)
  return mm(xf, false, params['head.weight'], true, 1, 1, C, V);             // (1, V)
}

// The same checks and messages as daisy.generate.generate (and the seed check of its CLI).
export function checkSettings(nTokens, temperature, topK, seed) {
  if (!(Number.isInteger(nTokens) && nTokens >= 0 && nTokens <= MAX_TOKENS)) {
    throw new GenerateError(`tokens must be in 0..${MAX_TOKENS}, got ${nTokens}`);
  }
  if (!(typeof temperature === 'number' && temperature >= 0.0 && temperature <= 10.0)) {
    throw new GenerateError(`temperature must be in 0..10, got ${temperature}`);
  }
  if (!(Number.isInteger(topK) && topK >= 0 && topK <= VOCAB_SIZE)) {
    throw new GenerateError(`top_k must be in 0..${VOCAB_SIZE} (0 = all), got ${topK}`);
  }
  if (!(Number.isInteger(seed) && seed >= 0 && seed <= MAX_SEED)) {
    throw new GenerateError(`seed must be in 0..${MAX_SEED}, got ${seed}`);
  }
}

// params {name: Float64Array}, cfg (config.makeConfig) -> {text: continuation, ids: [token ids]}.
// backend: engines.js (the JS mirror by default). onToken(i, id), if given, is called after each
// token (progress display).
export async function generate(params, cfg, prompt, nTokens,
  { temperature = 0.8, topK = 40, seed = 0, backend = referenceBackend, onToken = null } = {}) {
  checkSettings(nTokens, temperature, topK, seed);
  const ids = Array.from(encode(prompt));
  if (ids.length === 0) ids.push(EOT);
  const out = [];
  for (let i = 0; i < nTokens; i++) {
    const ctx = Int32Array.from(ids.slice(-cfg.seq_len));                   // (1, T')
    const T = ctx.length;
    const logits = await lastLogits(params, cfg, ctx, T, backend);         // (V,)
    const t = nextToken(logits, i, temperature, topK, seed);
    ids.push(t);
    out.push(t);
    if (onToken) onToken(i, t);
  }
  return { text: decode(out), ids: out };
}
