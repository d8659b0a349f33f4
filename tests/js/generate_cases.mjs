// Runs frontend_js/generate.js on the cases of a JSON spec and prints one JSON result line;
// tests/test_generate_js.py compares the token ids with daisy.generate's.
//   node tests/js/generate_cases.mjs SPEC.json
// SPEC: {"config": {...}, "weights": "PATH" (float64 LE, canonical order, as in the kit),
//        "cases": [{"prompt", "tokens", "temperature", "topK", "seed"}], "bad": [same keys],
//        "contexts": [[ids...]]}
// -> {"engine", "ids": [[...] per case], "texts": [...], "errors": [message per bad case],
//     "lastLogits": [first index where lastLogits differs from forward's last row, or -1]}
// Not named *.test.mjs: it needs a spec, so `node --test tests/js/` must not pick it up.
import { readFileSync } from 'node:fs';

import { makeConfig } from '../../frontend_js/config.js';
import { bestBackend, referenceBackend } from '../../frontend_js/engines.js';
import { firstMismatch } from '../../frontend_js/fixtures.js';
import { generate, lastLogits } from '../../frontend_js/generate.js';
import { paramsFromBytes } from '../../frontend_js/kit/kit.js';
import { forward } from '../../frontend_js/model.js';
import { VOCAB_SIZE } from '../../frontend_js/tokenizer.js';

const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const cfg = makeConfig(spec.config);
const params = paramsFromBytes(new Uint8Array(readFileSync(spec.weights)), cfg);
const backend = spec.engine === 'cpu' ? referenceBackend : await bestBackend();

const ids = [], texts = [];
for (const c of spec.cases) {
  const r = await generate(params, cfg, c.prompt, c.tokens,
    { temperature: c.temperature, topK: c.topK, seed: c.seed, backend });
  ids.push(r.ids);
  texts.push(r.text);
}
const errors = [];
for (const c of spec.bad || []) {
  try {
    await generate(params, cfg, c.prompt, c.tokens, { temperature: c.temperature, topK: c.topK, seed: c.seed, backend });
    errors.push(null);
  } catch (e) {
    errors.push(e.message);
  }
}
const last = [];
for (const ctx of spec.contexts || []) {
  const idx = Int32Array.from(ctx), T = idx.length;
  const full = await forward(params, cfg, idx, 1, T, null, backend);          // (T, V)
  last.push(firstMismatch(await lastLogits(params, cfg, idx, T, backend), full.subarray((T - 1) * VOCAB_SIZE)));
}
process.stdout.write(JSON.stringify({ engine: backend.name, ids, texts, errors, lastLogits: last }) + '\n');
