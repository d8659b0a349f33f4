// The offline inference kit's page logic (the kit is built by daisy/files/kit.py: kit.html with this
// module and its imports inlined as data: URLs, the weights as base64). Opening the kit decodes
// the weights, recomputes the canonical weight hash and compares it with the embedded one; only
// weights that match are ever used. Generation is frontend_js/generate.js, the same code as the
// page, so the kit's text equals the Python reference's for the same settings and seed.
import { makeConfig } from '../config.js';
import { bestBackend } from '../engines.js';
import { generate } from '../generate.js';
import { weightHash, short } from '../hashing.js';
import { paramShapes, paramCount } from '../model.js';
import { TOKENIZER_ID } from '../tokenizer.js';

export const KIT_FORMAT = 'daisychain-kit';
export const KIT_VERSION = 1;

export class KitError extends Error {
  constructor(msg) { super(msg); this.name = 'KitError'; }
}

// base64 -> Uint8Array (atob is in browsers and node >= 16)
export function base64Bytes(text) {
  let bin;
  try {
    bin = atob(text.replace(/\s+/g, ''));
  } catch (e) {
    throw new KitError('the embedded weights are not valid base64 (the kit file is damaged)');
  }
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

// bytes: every parameter's float64 little-endian values, row-major, in paramShapes order
// -> {name: Float64Array}
export function paramsFromBytes(bytes, cfg) {
  const shapes = paramShapes(cfg);
  const total = paramCount(cfg);
  if (bytes.length !== total * 8) {
    throw new KitError(`the embedded weights have ${bytes.length} bytes; this config needs ${total * 8}`
      + ` (${total} float64 values)`);
  }
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const params = {};
  let o = 0;
  for (const [name, shape] of shapes) {
    const n = shape.reduce((a, b) => a * b, 1), w = new Float64Array(n);
    for (let i = 0; i < n; i++) w[i] = dv.getFloat64((o + i) * 8, true);
    params[name] = w;
    o += n;
  }
  return params;
}

// meta (the kit's JSON), base64 weights -> {cfg, params, hash, meta}; KitError names the problem
export function openKit(meta, weightsBase64) {
  if (!meta || meta.format !== KIT_FORMAT) throw new KitError('this is not a DaisyChain inference kit');
  if (meta.version !== KIT_VERSION) {
    throw new KitError(`kit format version ${meta.version}; this kit code reads version ${KIT_VERSION}`);
  }
  if (meta.tokenizer !== TOKENIZER_ID) {
    throw new KitError(`tokenizer ${JSON.stringify(meta.tokenizer)}; this code has ${TOKENIZER_ID}`);
  }
  let cfg;
  try {
    cfg = makeConfig(meta.config);
  } catch (e) {
    throw new KitError(`bad config in the kit: ${e.message}`);
  }
  const params = paramsFromBytes(base64Bytes(weightsBase64), cfg);
  const hash = weightHash(params);
  if (hash !== meta.weight_hash) {
    throw new KitError(`weight hash mismatch: the kit says ${meta.weight_hash}, the embedded weights hash to `
      + `${hash}. The file was damaged or edited; its weights are not the trained model's.`);
  }
  return { cfg, params, hash, meta };
}

const $ = (id) => document.getElementById(id);

// Wires the kit page (kit.html's elements); exposes window.daisyKit = {generate, hash, cfg, engine}.
export async function boot() {
  const status = $('status'), error = $('error'), button = $('generate');
  let kit;
  try {
    kit = openKit(JSON.parse($('daisy-kit-meta').textContent), $('daisy-kit-weights').textContent);
  } catch (e) {
    error.textContent = `Cannot use this kit: ${e.message}`;
    error.hidden = false;
    status.textContent = 'weights refused';
    $('hash').textContent = 'check failed';        // not "(checking)" forever: the check ran and failed
    $('hash').title = e.message;
    document.body.dataset.state = 'error';
    return;
  }
  const backend = await bestBackend();
  const { cfg, params, hash, meta } = kit;
  $('hash').textContent = short(hash);
  $('hash').title = hash;
  $('model').textContent = `width ${cfg.width}, ${cfg.layers} layers, ${cfg.heads} heads, context ${cfg.seq_len}`
    + `; trained ${meta.step} steps`;
  const run = (prompt, opts) => generate(params, cfg, prompt, opts.tokens,
    { temperature: opts.temperature, topK: opts.topK, seed: opts.seed, backend });
  window.daisyKit = { generate: run, hash, cfg, engine: backend.name };
  const num = (id) => Number($(id).value);
  button.addEventListener('click', async () => {
    error.hidden = true;
    button.disabled = true;
    status.textContent = 'generating...';
    const prompt = $('prompt').value;
    try {
      const t0 = performance.now();
      const { text, ids } = await run(prompt,
        { tokens: num('tokens'), temperature: num('temperature'), topK: num('top-k'), seed: num('seed') });
      const ms = performance.now() - t0;
      $('prompt-echo').textContent = prompt;
      $('continuation').textContent = text;
      status.textContent = `${ids.length} tokens in ${ms.toFixed(0)} ms (${backend.name})`;
      document.body.dataset.runs = String(Number(document.body.dataset.runs || 0) + 1);
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
      status.textContent = 'not generated';
      document.body.dataset.runs = String(Number(document.body.dataset.runs || 0) + 1);
    } finally {
      button.disabled = false;
    }
  });
  button.disabled = false;
  status.textContent = `weights verified; ready (${backend.name})`;
  document.body.dataset.state = 'ready';
}
