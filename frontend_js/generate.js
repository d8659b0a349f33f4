// Sampling text from the model, mirroring daisy/generate.py bit for bit (its docstring is the
// spec): same weights + prompt + settings + seed give the same token ids here, in the Python
// reference, in the page and in the offline kit.
//   context = last seq_len tokens of (prompt + tokens so far)  (an empty prompt starts at EOT)
//   logits  = forward(params, context)[last position]          (the full-context INT8 forward)
// No KV cache: P.V quantizes v per column over the whole context, so a cached forward would
// not give the reference's bits.
import { key, uniform, PURPOSE_SAMPLE } from './prng.js';
import { exp, treeSum } from './detmath.js';
import { forward } from './model.js';
import { EOT, VOCAB_SIZE, encode, decode } from './tokenizer.js';
import { cpuEngine } from './units.js';

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
// onToken(i, id), if given, is called after each token (progress display).
export async function generate(params, cfg, prompt, nTokens,
  { temperature = 0.8, topK = 40, seed = 0, engine = cpuEngine, onToken = null } = {}) {
  checkSettings(nTokens, temperature, topK, seed);
  const ids = Array.from(encode(prompt));
  if (ids.length === 0) ids.push(EOT);
  const out = [];
  for (let i = 0; i < nTokens; i++) {
    const ctx = Int32Array.from(ids.slice(-cfg.seq_len));                   // (1, T')
    const T = ctx.length;
    const logits = await forward(params, cfg, ctx, 1, T, null, engine);    // (T', V)
    const t = nextToken(logits.subarray((T - 1) * VOCAB_SIZE, T * VOCAB_SIZE), i, temperature, topK, seed);
    ids.push(t);
    out.push(t);
    if (onToken) onToken(i, t);
  }
  return { text: decode(out), ids: out };
}
