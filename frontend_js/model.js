// The GPT-style decoder, forward and backward by hand, mirroring daisy/model.py function by
// function and operation by operation (float64, row-major Float64Array; shapes in comments).
//   tokens (B, T) -> wte + wpe -> L x [x += attn(norm1(x)); x += mlp(norm2(x))] -> norm_f -> head
//   -> cross-entropy
// The pieces below (rmsnorm, causalSoftmax, ...) are the mirror, in plain JS. forward and
// backward run on a backend (engines.js), which holds the INT8 unit's engine (every matmul is
// units.qmatmulT, straight-through in backward; CPU or WGSL, so forward/backward are async) and
// the row pieces: these JS ones, or wasm twins gated against them. Arrays come from `mem`
// (arena.js): fresh ones by default, or a trainer's StepArena, reused step after step. Linear
// weights use nn.Linear's layout (out_features, in_features): y = x W^T, W passed as stored B^T.
import { key, uniform, PURPOSE_INIT } from './prng.js';
import { exp, expShiftedInto, log, treeSum } from './detmath.js';
import { VOCAB_SIZE } from './tokenizer.js';
import { qmatmulT } from './units.js';
import { freshF64, into } from './arena.js';

export const NORM_EPS = 1e-5;
export const EMBED_BOUND = 0.1;

// [[name, shape], ...] in the canonical order (hash, init, checkpoint, wire). Python's twin
// (daisy/model.py) returns an OrderedDict of the same pairs: its callers look tensors up by name.
export function paramShapes(cfg) {
  const C = cfg.width, T = cfg.seq_len, V = VOCAB_SIZE;
  const shapes = [['wte.weight', [V, C]], ['wpe.weight', [T, C]]];
  for (let l = 0; l < cfg.layers; l++) {
    const p = `blocks.${l}.`;
    shapes.push([p + 'norm1.weight', [C]], [p + 'attn.qkv.weight', [3 * C, C]],
      [p + 'attn.proj.weight', [C, C]], [p + 'norm2.weight', [C]],
      [p + 'mlp.fc.weight', [4 * C, C]], [p + 'mlp.proj.weight', [C, 4 * C]]);
  }
  shapes.push(['norm_f.weight', [C]], ['head.weight', [V, C]]);
  return shapes;
}

// how many parameters the model of cfg has (every tensor of paramShapes): the one count
export const paramCount = (cfg) => paramShapes(cfg).reduce((n, [, shape]) => n + shape.reduce((x, y) => x * y, 1), 0);

// half-width of the uniform init; 0 means the constant 1.0 (norm gains)
export function initBound(name, shape, cfg) {
  if (name.endsWith('norm1.weight') || name.endsWith('norm2.weight') || name === 'norm_f.weight') return 0.0;
  if (name === 'wte.weight' || name === 'wpe.weight') return EMBED_BOUND;
  let bound = 1.0 / Math.sqrt(shape[1]);                      // 1/sqrt(fan_in)
  if (name.endsWith('attn.proj.weight') || name.endsWith('mlp.proj.weight')) {
    bound = bound / Math.sqrt(2 * cfg.layers);               // residual branches, as GPT-2
  }
  return bound;
}

// parameter p, element i (row-major) = (2u - 1) * bound, u = uniform(key(PURPOSE_INIT, seed, p), i)
export function initParams(cfg) {
  const params = {};
  paramShapes(cfg).forEach(([name, shape], p) => {
    const bound = initBound(name, shape, cfg);
    const n = shape.reduce((a, b) => a * b, 1);
    const w = new Float64Array(n);
    if (bound === 0.0) w.fill(1.0);
    else {
      const k = key(PURPOSE_INIT, cfg.seed, p);
      for (let i = 0; i < n; i++) w[i] = (uniform(k, i) * 2.0 - 1.0) * bound;
    }
    params[name] = w;
  });
  return params;
}

// --- the pieces, each with its backward ---------------------------------------------------

// x (N, C), g (C,) -> y (N, C), cache {xhat (N, C), r (N,)}.
// r = 1 / sqrt(tree_sum(x*x)/C + eps); y = (x * r) * g
export function rmsnorm(x, g, N, C, mem = freshF64) {
  const y = mem.take(N * C), xhat = mem.take(N * C), r = mem.take(N);
  const sq = mem.take(C);
  for (let n = 0; n < N; n++) {
    const o = n * C;
    for (let c = 0; c < C; c++) sq[c] = x[o + c] * x[o + c];
    const ms = treeSum(sq, 0, C) / C;
    const rn = 1.0 / Math.sqrt(ms + NORM_EPS);
    r[n] = rn;
    for (let c = 0; c < C; c++) { const xh = x[o + c] * rn; xhat[o + c] = xh; y[o + c] = xh * g[c]; }
  }
  return [y, { xhat, r }];
}

// dy (N, C) -> dx (N, C), dg (C,)
export function rmsnormBackward(dy, g, cache, N, C, mem = freshF64) {
  const { xhat, r } = cache;
  const prod = mem.take(N * C);
  for (let i = 0; i < N * C; i++) prod[i] = dy[i] * xhat[i];
  const dg = mem.take(C);
  for (let c = 0; c < C; c++) dg[c] = treeSum(prod, c, N, C);    // over rows n = 0..N-1
  const dx = mem.take(N * C), t = mem.take(C), dxhat = mem.take(C);
  for (let n = 0; n < N; n++) {
    const o = n * C;
    for (let c = 0; c < C; c++) { dxhat[c] = dy[o + c] * g[c]; t[c] = dxhat[c] * xhat[o + c]; }
    const dotC = treeSum(t, 0, C) / C;
    const rn = r[n];
    for (let c = 0; c < C; c++) dx[o + c] = (dxhat[c] - xhat[o + c] * dotC) * rn;
  }
  return [dx, dg];
}

// s (G, T, T) -> p: row i over columns j <= i; masked entries exactly +0; z sums all T columns.
// scale: each score is first multiplied by it (attention's 1/sqrt(D); x * 1 = x exactly)
export function causalSoftmax(s, G, T, mem = freshF64, scale = 1.0) {
  const p = mem.take(G * T * T), e = mem.take(T), x = mem.take(T);
  for (let row = 0; row < G * T; row++) {
    const i = row % T, o = row * T;
    for (let j = 0; j <= i; j++) x[j] = s[o + j] * scale;
    let m = x[0];
    for (let j = 1; j <= i; j++) if (x[j] > m) m = x[j];
    expShiftedInto(x, 0, i + 1, m, e, 0);
    for (let j = i + 1; j < T; j++) e[j] = 0.0;
    const z = treeSum(e, 0, T);
    for (let j = 0; j < T; j++) p[o + j] = e[j] / z;
  }
  return p;
}

// dp, p (G, T, T) -> ds = (p * (dp - tree_sum(dp * p))) * scale  (scale applied after, as model.py)
export function softmaxBackward(dp, p, G, T, scale, mem = freshF64) {
  const ds = mem.take(G * T * T), t = mem.take(T);
  for (let row = 0; row < G * T; row++) {
    const o = row * T;
    for (let j = 0; j < T; j++) t[j] = dp[o + j] * p[o + j];
    const tr = treeSum(t, 0, T);
    for (let j = 0; j < T; j++) ds[o + j] = (p[o + j] * (dp[o + j] - tr)) * scale;
  }
  return ds;
}

// h -> np.maximum(h, 0): h where h > 0 or NaN, else +0;  backward: dh = h > 0 ? dhr : +0
export function relu(h, mem = freshF64) {
  const hr = mem.take(h.length);
  for (let i = 0; i < h.length; i++) hr[i] = (h[i] > 0.0 || h[i] !== h[i]) ? h[i] : 0.0;
  return hr;
}

export function reluBackward(dhr, h, mem = freshF64) {
  const dh = mem.take(h.length);
  for (let i = 0; i < dh.length; i++) dh[i] = h[i] > 0.0 ? dhr[i] : 0.0;
  return dh;
}

// logits (N, V), targets (N,) -> [mean loss, dlogits (N, V)]
// loss_n = (m + log z) - logit[target]; loss = tree_sum(loss_n) / N; dlogits = (softmax - onehot) / N
// The softmax rows here; the rest in crossEntropyTail, which every backend shares.
export function crossEntropy(logits, targets, N, V, mem = freshF64) {
  const lossN = mem.take(N), dlogits = mem.take(N * V), e = mem.take(V), stats = mem.take(2 * N);
  for (let n = 0; n < N; n++) {
    const o = n * V;
    let m = logits[o];
    for (let v = 1; v < V; v++) if (logits[o + v] > m) m = logits[o + v];
    expShiftedInto(logits, o, V, m, e, 0);
    const z = treeSum(e, 0, V);
    for (let v = 0; v < V; v++) dlogits[o + v] = (e[v] / z) / N;
    stats[2 * n] = m; stats[2 * n + 1] = z;
  }
  return crossEntropyTail(logits, targets, N, V, stats, dlogits, lossN);
}

// The cross-entropy after the softmax rows, in daisy/model.py's order: dlogits (N, V) holds
// (e / z) / N and stats (N, 2) each row's max m and sum z -> [mean loss, dlogits with the target
// entries ((e / z) - 1) / N]; lossN (N,): scratch, taken by the caller before its staging memory is
// freed. e at the target is recomputed as exp(logit - m): the same bits as the softmax's
// (detmath.js expShiftedInto = exp).
export function crossEntropyTail(logits, targets, N, V, stats, dlogits, lossN) {
  for (let n = 0; n < N; n++) {
    const o = n * V, m = stats[2 * n], z = stats[2 * n + 1], tgt = targets[n];
    lossN[n] = (m + log(z)) - logits[o + tgt];
    dlogits[o + tgt] = ((exp(logits[o + tgt] - m) / z) - 1.0) / N;
  }
  return [treeSum(lossN, 0, N) / N, dlogits];
}

// dx (N, C), idx (N,) -> dwte (V, C): row idx[n] += dx[n], n ascending
export function embeddingBackward(dx, idx, V, N, C, mem = freshF64) {
  const dwte = mem.zeros(V * C);
  for (let n = 0; n < N; n++) {
    const r = idx[n] * C, o = n * C;
    for (let c = 0; c < C; c++) dwte[r + c] = dwte[r + c] + dx[o + c];
  }
  return dwte;
}

// --- layout moves (exact copies) ------------------------------------------------------------

// qkv (N, 3C) as (B, T, 3, H, D) -> part s of (3, B, H, T, D), i.e. (B*H, T, D)
function splitHeads(qkv, part, B, T, H, D, out) {
  const C = H * D;
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let t = 0; t < T; t++) {
    const src = (b * T + t) * 3 * C + part * C + h * D, dst = ((b * H + h) * T + t) * D;
    for (let d = 0; d < D; d++) out[dst + d] = qkv[src + d];
  }
  return out;
}

// yh (B, H, T, D) -> out (N, W) at column offset col0: out[(b*T+t), col0 + h*D + d]
function mergeHeads(yh, out, W, col0, B, T, H, D) {
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let t = 0; t < T; t++) {
    const src = ((b * H + h) * T + t) * D, dst = (b * T + t) * W + col0 + h * D;
    for (let d = 0; d < D; d++) out[dst + d] = yh[src + d];
  }
  return out;
}

const addInPlace = (x, y) => { for (let i = 0; i < x.length; i++) x[i] = x[i] + y[i]; return x; };

// --- the model --------------------------------------------------------------------------------

// A backend (engines.js) is required: it is where the pieces run. Anything else (a bare INT8
// engine, as these functions once took) is refused by name.
export function checkBackend(be, who) {
  if (!be || typeof be.rmsnorm !== 'function' || !be.engine) {
    const what = be && typeof be === 'object' ? `an object with keys ${Object.keys(be).join(', ') || 'none'}` : String(be);
    throw new TypeError(`${who}: needs a backend from engines.js (engine, rmsnorm, ...), got ${what}`);
  }
  return be;
}

// idx (B, T) Int32Array -> logits (B*T, V); with targets (B, T): {loss, cache} for backward.
// be: the backend (engines.js). mem: where the arrays come from (arena.js); a StepArena's
// arrays live until its next reset.
export async function forward(params, cfg, idx, B, T, targets = null, be, mem = freshF64) {
  checkBackend(be, 'forward');
  const C = cfg.width, H = cfg.heads, L = cfg.layers, V = VOCAB_SIZE;
  const D = Math.floor(C / H), N = B * T, G = B * H;
  const attScale = 1.0 / Math.sqrt(D);
  const mm = (a, ta, b, tb, batch, M, K, Nn) => qmatmulT(be.engine, a, ta, b, tb, batch, M, K, Nn, mem.take(batch * M * Nn));
  const wte = params['wte.weight'], wpe = params['wpe.weight'];
  const x = mem.take(N * C);                                                  // (N, C)
  for (let n = 0; n < N; n++) {
    const r = idx[n] * C, t = (n % T) * C;
    for (let c = 0; c < C; c++) x[n * C + c] = wte[r + c] + wpe[t + c];
  }
  const caches = [];
  for (let l = 0; l < L; l++) {
    const p = `blocks.${l}.`;
    const [xn1, n1] = be.rmsnorm(x, params[p + 'norm1.weight'], N, C, mem);   // (N, C)
    // what backward needs is taken first; the temporaries after the mark are free again once the
    // branch has added into x (a third less memory at the largest settings: TEST_RESULTS "Memory")
    const q = mem.take(N * C), k = mem.take(N * C), v = mem.take(N * C);    // (B, H, T, D) each
    const pr = mem.take(G * T * T), y = mem.take(N * C);                     // (B, H, T, T), (N, C)
    let mark = mem.mark();
    const qkv = await mm(xn1, false, params[p + 'attn.qkv.weight'], true, 1, N, C, 3 * C);   // (N, 3C)
    splitHeads(qkv, 0, B, T, H, D, q);
    splitHeads(qkv, 1, B, T, H, D, k);
    splitHeads(qkv, 2, B, T, H, D, v);
    const s = await mm(q, false, k, true, G, T, D, T);                      // (B, H, T, T) q k^T
    // (B, H, T, T) softmax of s * scale, written into pr (kept for backward)
    if (be.causalSoftmax(s, G, T, into(pr, mem), attScale) !== pr) throw new Error('causalSoftmax did not write into the array it was given');
    const yh = await mm(pr, false, v, false, G, T, T, D);                   // (B, H, T, D)
    mergeHeads(yh, y, C, 0, B, T, H, D);                                     // (N, C)
    addInPlace(x, await mm(y, false, params[p + 'attn.proj.weight'], true, 1, N, C, C));
    mem.rewind(mark);
    const [xn2, n2] = be.rmsnorm(x, params[p + 'norm2.weight'], N, C, mem);   // (N, C)
    const h = await mm(xn2, false, params[p + 'mlp.fc.weight'], true, 1, N, C, 4 * C);       // (N, 4C)
    const hr = be.relu(h, mem);                                              // (N, 4C)
    mark = mem.mark();
    addInPlace(x, await mm(hr, false, params[p + 'mlp.proj.weight'], true, 1, N, 4 * C, C));
    mem.rewind(mark);
    caches.push({ xn1, n1, q, k, v, pr, y, xn2, n2, h, hr });
  }
  const [xf, nf] = be.rmsnorm(x, params['norm_f.weight'], N, C, mem);       // (N, C)
  const logits = await mm(xf, false, params['head.weight'], true, 1, N, C, V);   // (N, V)
  if (targets === null) return logits;
  const [loss, dlogits] = be.crossEntropy(logits, targets, N, V, mem);
  return { loss, cache: { idx, B, T, caches, xf, nf, dlogits, attScale, be, mem } };
}

// Two matmuls issued together, so an engine that batches its calls (the GPU's) can run them in
// one submission; the results, hence the bits, are those of one after the other. Both settle
// before it returns or throws: no call of a failed step may still write into its arena.
async function both(first, second) {
  const [a, b] = await Promise.allSettled([first, second]);
  if (a.status === 'rejected') throw a.reason;
  if (b.status === 'rejected') throw b.reason;
  return [a.value, b.value];
}

// The gradient of the mean loss w.r.t. every parameter, in canonical order; matmuls that do not
// depend on each other go through both(). onGrad(name, values), when given, is called as each
// parameter's gradient becomes final, in the reverse of the canonical order (head.weight first,
// wte.weight last): the streamed exchange sends what is final while the rest computes
// (mesh/mesh_collective.js beginStep). It must not write into values; it changes no bits. When it
// returns a promise, backward waits for it (the sink yields to the event loop there, so that its
// sends make progress during a backward pass that otherwise never yields).
export async function backward(params, cfg, cache, onGrad = null) {
  const { idx, B, T, caches, xf, nf, dlogits, attScale, be, mem } = cache;
  const C = cfg.width, H = cfg.heads, L = cfg.layers, V = VOCAB_SIZE;
  const D = Math.floor(C / H), N = B * T, G = B * H;
  const mm = (a, ta, b, tb, batch, M, K, Nn, out = mem.take(batch * M * Nn)) => qmatmulT(be.engine, a, ta, b, tb, batch, M, K, Nn, out);
  const g = {};
  const final = onGrad ? (name) => onGrad(name, g[name]) : () => null;
  let dxf;
  [g['head.weight'], dxf] = await both(
    mm(dlogits, true, xf, false, 1, V, N, C),                                // (V, C) dlogits^T xf
    mm(dlogits, false, params['head.weight'], false, 1, N, V, C));          // (N, C)
  let dx;
  await final('head.weight');
  [dx, g['norm_f.weight']] = be.rmsnormBackward(dxf, params['norm_f.weight'], nf, N, C, mem);
  await final('norm_f.weight');
  for (let l = L - 1; l >= 0; l--) {
    const p = `blocks.${l}.`;
    const { xn1, n1, q, k, v, pr, y, xn2, n2, h, hr } = caches[l];
    // the layer's weight gradients outlive it: taken before the mark; everything taken after it
    // is this layer's temporaries, free again at its end (dx, the running gradient, is older)
    for (const [name, size] of [['mlp.proj.weight', C * 4 * C], ['mlp.fc.weight', 4 * C * C], ['norm2.weight', C],
      ['attn.proj.weight', C * C], ['attn.qkv.weight', 3 * C * C], ['norm1.weight', C]]) g[p + name] = mem.take(size);
    const mark = mem.mark();
    let dgNorm;
    // MLP branch: x += proj(relu(fc(norm2(x))))
    let dhr, dxn2, dy, dpr, dv, dq, dk, dxn1, dxb;
    [g[p + 'mlp.proj.weight'], dhr] = await both(
      mm(dx, true, hr, false, 1, C, N, 4 * C, g[p + 'mlp.proj.weight']),     // (C, 4C)
      mm(dx, false, params[p + 'mlp.proj.weight'], false, 1, N, C, 4 * C)); // (N, 4C)
    await final(p + 'mlp.proj.weight');
    const dh = be.reluBackward(dhr, h, mem);                                 // (N, 4C)
    [g[p + 'mlp.fc.weight'], dxn2] = await both(
      mm(dh, true, xn2, false, 1, 4 * C, N, C, g[p + 'mlp.fc.weight']),      // (4C, C)
      mm(dh, false, params[p + 'mlp.fc.weight'], false, 1, N, 4 * C, C));   // (N, C)
    await final(p + 'mlp.fc.weight');
    [dxb, dgNorm] = be.rmsnormBackward(dxn2, params[p + 'norm2.weight'], n2, N, C, mem);
    g[p + 'norm2.weight'].set(dgNorm);
    await final(p + 'norm2.weight');
    dx = addInPlace(dx, dxb);                                                // dx is ours alone: add in place
    // attention branch: x += proj(attn(qkv(norm1(x))))
    [g[p + 'attn.proj.weight'], dy] = await both(
      mm(dx, true, y, false, 1, C, N, C, g[p + 'attn.proj.weight']),         // (C, C)
      mm(dx, false, params[p + 'attn.proj.weight'], false, 1, N, C, C));    // (N, C)
    await final(p + 'attn.proj.weight');
    const dyh = splitHeads3(dy, B, T, H, D, mem);                            // (B, H, T, D)
    [dpr, dv] = await both(
      mm(dyh, false, v, true, G, T, D, T),                                   // (B, H, T, T) dyh v^T
      mm(pr, true, dyh, false, G, T, T, D));                                // (B, H, T, D) pr^T dyh
    const ds = be.softmaxBackward(dpr, pr, G, T, attScale, mem);             // (B, H, T, T)
    [dq, dk] = await both(
      mm(ds, false, k, false, G, T, T, D),                                   // (B, H, T, D)
      mm(ds, true, q, false, G, T, T, D));                                  // (B, H, T, D) ds^T q
    const dqkv = mem.take(N * 3 * C);                                        // (N, 3C) as (B, T, 3, H, D)
    mergeHeads(dq, dqkv, 3 * C, 0, B, T, H, D);
    mergeHeads(dk, dqkv, 3 * C, C, B, T, H, D);
    mergeHeads(dv, dqkv, 3 * C, 2 * C, B, T, H, D);
    [g[p + 'attn.qkv.weight'], dxn1] = await both(
      mm(dqkv, true, xn1, false, 1, 3 * C, N, C, g[p + 'attn.qkv.weight']),  // (3C, C)
      mm(dqkv, false, params[p + 'attn.qkv.weight'], false, 1, N, 3 * C, C)); // (N, C)
    await final(p + 'attn.qkv.weight');
    [dxb, dgNorm] = be.rmsnormBackward(dxn1, params[p + 'norm1.weight'], n1, N, C, mem);
    g[p + 'norm1.weight'].set(dgNorm);
    await final(p + 'norm1.weight');
    dx = addInPlace(dx, dxb);
    mem.rewind(mark);
  }
  const dwpe = mem.take(T * C);                                              // (T, C) tree over b
  for (let i = 0; i < T * C; i++) dwpe[i] = treeSum(dx, i, B, T * C);
  g['wpe.weight'] = dwpe;
  await final('wpe.weight');
  g['wte.weight'] = embeddingBackward(dx, idx, V, N, C, mem);                // (V, C)
  await final('wte.weight');
  const out = {};
  for (const name of Object.keys(params)) out[name] = g[name];
  return out;
}

// dy (N, C) as (B, T, H, D) -> (B, H, T, D)
function splitHeads3(dy, B, T, H, D, mem) {
  const C = H * D, out = mem.take(B * H * T * D);
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let t = 0; t < T; t++) {
    const src = (b * T + t) * C + h * D, dst = ((b * H + h) * T + t) * D;
    for (let d = 0; d < D; d++) out[dst + d] = dy[src + d];
  }
  return out;
}

// one peer's contribution to a step: {loss (mean over its B*T tokens), grads}; onGrad: backward's
export async function lossAndGrads(params, cfg, idx, targets, B, T, be, mem = freshF64, onGrad = null) {
  const { loss, cache } = await forward(params, cfg, idx, B, T, targets, be, mem);
  return { loss, grads: await backward(params, cfg, cache, onGrad) };
}
