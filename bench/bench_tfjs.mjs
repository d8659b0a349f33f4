#!/usr/bin/env node
// The browser runtime people would train with instead: the same model as daisy/model.py
// (architecture and settings: token + position embeddings, L pre-norm blocks of RMSNorm ->
// causal multi-head attention without biases -> residual, RMSNorm -> 4C ReLU MLP -> residual,
// a final RMSNorm, the head over the 257-token vocabulary, mean cross-entropy, Adam) trained in
// TensorFlow.js (float32, its own kernels) on its wasm backend (SIMD and threads where it finds
// them) and, where WebGPU exists, its WebGPU backend, timed in one run with our CPU path (the
// page's own backends, bit-identical to the reference) on one device's step (forward, backward,
// Adam; one peer, no exchange). Prints one JSON line per runtime and the ratios; medians.
//   cd bench/tfjs && npm install          (once; bench-only, gitignored node_modules)
//   node bench/bench_tfjs.mjs [--width 32 --seq-len 32 --batch 8 --layers 2 --heads 4] [--steps 20] [--warmup 3]
//        [--webgpu]   (the WebGPU backend through the npm package webgpu on NODE_PATH)
// Timings need a quiet machine (docs: TEST_RESULTS.md "GPU path"); a loaded one gives noise.
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

import { makeConfig } from '../frontend_js/config.js';
import { VOCAB_SIZE } from '../frontend_js/tokenizer.js';
import { Group } from '../frontend_js/train.js';
import { textStream } from '../frontend_js/data.js';
import { pickCpuBackend } from '../frontend_js/backends.js';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a === '--webgpu') acc.push(['webgpu', true]);
  else if (a.startsWith('--') && all[i + 1] !== undefined && !all[i + 1].startsWith('--')) acc.push([a.slice(2).replace('-', '_'), Number(all[i + 1])]);
  return acc;
}, []));
const cfg = makeConfig({ width: args.width ?? 32, seq_len: args.seq_len ?? 32, batch: args.batch ?? 8, layers: args.layers ?? 2, heads: args.heads ?? 4, steps: 100 });
const STEPS = args.steps ?? 20, WARMUP = args.warmup ?? 3;
const median = (xs) => { const s = [...xs].sort((a, b) => a - b), h = s.length >> 1; return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2; };
const settings = { width: cfg.width, seq_len: cfg.seq_len, batch: cfg.batch, layers: cfg.layers, heads: cfg.heads };
const say = (o) => process.stdout.write(`${JSON.stringify({ settings, ...o })}\n`);
const stream = textStream('the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. '.repeat(400));

// --- ours: one device's step on the page's CPU backends ------------------------------------------
async function ours(threads) {
  const { backend, threads: t } = await pickCpuBackend({ threads });
  const g = new Group(cfg, 1, stream, backend), ms = [];
  for (let s = 0; s < WARMUP + STEPS; s++) {
    const t0 = performance.now();
    await g.step();
    if (s >= WARMUP) ms.push(performance.now() - t0);
  }
  backend.close?.();
  return { runtime: `ours ${backend.threads > 1 ? `wasm-simd x ${t.count} threads` : backend.name}`, ms: median(ms), steps: STEPS };
}

// --- TensorFlow.js: the same model ---------------------------------------------------------------
function tfModel(tf) {
  const C = cfg.width, T = cfg.seq_len, H = cfg.heads, D = C / H, V = VOCAB_SIZE, L = cfg.layers, B = cfg.batch;
  const u = (shape, bound) => tf.variable(tf.randomUniform(shape, -bound, bound, 'float32', 1));
  const w = { wte: u([V, C], 0.1), wpe: u([T, C], 0.1), normf: tf.variable(tf.ones([C])), head: u([V, C], 1 / Math.sqrt(C)), blocks: [] };
  for (let l = 0; l < L; l++) {
    w.blocks.push({ n1: tf.variable(tf.ones([C])), qkv: u([3 * C, C], 1 / Math.sqrt(C)), proj: u([C, C], 1 / Math.sqrt(C) / Math.sqrt(2 * L)),
      n2: tf.variable(tf.ones([C])), fc: u([4 * C, C], 1 / Math.sqrt(C)), mproj: u([C, 4 * C], 1 / Math.sqrt(4 * C) / Math.sqrt(2 * L)) });
  }
  const rms = (x, g) => x.mul(tf.rsqrt(x.square().mean(-1, true).add(1e-5))).mul(g);
  // x W^T (nn.Linear's layout), x flattened to 2-D (tfjs's batched-matmul gradient refuses a 2-D W)
  const lin = (x, W) => tf.matMul(x.reshape([-1, x.shape.at(-1)]), W, false, true).reshape([...x.shape.slice(0, -1), W.shape[0]]);
  const mask = tf.linalg.bandPart(tf.ones([T, T]), -1, 0);                   // lower triangle
  const neg = tf.scalar(-1e9);
  const loss = (idx, tgt) => {
    // the embedding as one-hot x wte: tfjs-wasm has no UnsortedSegmentSum (gather's gradient);
    // B*T*V*C more multiply-adds, ~2 % of the step at the largest settings
    let x = tf.matMul(tf.oneHot(idx.flatten(), V).cast('float32'), w.wte).reshape([B, T, C]).add(w.wpe);
    for (const b of w.blocks) {
      const qkv = lin(rms(x, b.n1), b.qkv).reshape([B, T, 3, H, D]).transpose([2, 0, 3, 1, 4]);   // (3, B, H, T, D)
      const [q, k, v] = tf.unstack(qkv);
      const s = tf.matMul(q, k, false, true).mul(1 / Math.sqrt(D));
      const p = tf.softmax(tf.where(mask.cast('bool'), s, neg));
      const y = tf.matMul(p, v).transpose([0, 2, 1, 3]).reshape([B, T, C]);
      x = x.add(lin(y, b.proj));
      x = x.add(lin(tf.relu(lin(rms(x, b.n2), b.fc)), b.mproj));
    }
    const logits = lin(rms(x, w.normf), w.head).reshape([B * T, V]);
    return tf.losses.softmaxCrossEntropy(tf.oneHot(tgt.flatten(), V), logits);
  };
  return { loss, opt: tf.train.adam(cfg.lr, 0.9, 0.999, 1e-8) };
}

async function tfjs(tf, backend) {
  await tf.setBackend(backend);
  await tf.ready();
  const { loss, opt } = tfModel(tf), B = cfg.batch, T = cfg.seq_len, ms = [];
  let last = null;
  for (let s = 0; s < WARMUP + STEPS; s++) {
    const start = (s * 9973) % (stream.length - T - 1);
    const rows = Array.from({ length: B }, (_, b) => (start + b * 131) % (stream.length - T - 1));
    const idx = tf.tensor2d(rows.flatMap((r) => Array.from(stream.subarray(r, r + T))), [B, T], 'int32');
    const tgt = tf.tensor2d(rows.flatMap((r) => Array.from(stream.subarray(r + 1, r + T + 1))), [B, T], 'int32');
    const t0 = performance.now();
    const l = opt.minimize(() => loss(idx, tgt), true);
    last = (await l.data())[0];                                               // waits for the step
    if (s >= WARMUP) ms.push(performance.now() - t0);
    tf.dispose([idx, tgt, l]);
  }
  const env = tf.env();
  const flags = backend === 'wasm' ? { simd: await env.getAsync('WASM_HAS_SIMD_SUPPORT'), threads: await env.getAsync('WASM_HAS_MULTITHREAD_SUPPORT') } : {};
  return { runtime: `tfjs ${backend}`, ms: median(ms), steps: STEPS, lastLoss: last, ...flags };
}

const here = fileURLToPath(new URL('./tfjs/', import.meta.url));
const req = createRequire(here);
const results = [];
results.push(await ours(1));
results.push(await ours('auto'));
const tf = req('@tensorflow/tfjs');
req('@tensorflow/tfjs-backend-wasm');
results.push(await tfjs(tf, 'wasm'));
if (args.webgpu) {
  try {
    const webgpu = createRequire(import.meta.url)('webgpu');
    Object.assign(globalThis, webgpu.globals);
    globalThis.navigator ??= {};
    Object.defineProperty(globalThis.navigator, 'gpu', { value: webgpu.create([]), configurable: true });
    req('@tensorflow/tfjs-backend-webgpu');
    results.push(await tfjs(tf, 'webgpu'));
  } catch (e) {
    say({ runtime: 'tfjs webgpu', error: `${e.message || e}`.split('\n')[0] });
  }
}
const base = results.find((r) => r.runtime.startsWith('tfjs wasm'));
for (const r of results) say({ ...r, vsTfjsWasm: base ? +(r.ms / base.ms).toFixed(3) : null });
process.exit(0);
