// The host's share of a 2-peer exchange at the largest settings (issue 26): SimulatedCollective
// (collective.js) with each slot's gradient encoded here, against the same exchange given each
// slot's message made beforehand (what the resident step now hands over: encoded on the GPU), and
// the resident trainer's spot check of such a message (gpu/resident.js spotCheckMessage). Same G
// both ways (checked); medians of REPS after a warm-up, both orders alternately. reduceMs: the
// codec's reduce alone (two decoded slices -> G, what a page of 2 or 3 runs after the last message).
//   node bench/bench_exchange_encoded.mjs [--reps 15] [--width 128 --seq-len 128 --batch 32]
import { SimulatedCollective, flattenGrads } from '../frontend_js/collective.js';
import { CODECS } from '../frontend_js/exchange_codec.js';
import { paramShapes } from '../frontend_js/model.js';
import { makeConfig } from '../frontend_js/config.js';
import { spotCheckMessage } from '../frontend_js/gpu/resident.js';

const arg = (name, dflt) => { const i = process.argv.indexOf(`--${name}`); return i > 0 ? Number(process.argv[i + 1]) : dflt; };
const REPS = arg('reps', 15);
const cfg = makeConfig({ width: arg('width', 128), seq_len: arg('seq-len', 128), batch: arg('batch', 32), exchange: 'int8' });
const shapes = paramShapes(cfg), names = shapes.map(([n]) => n);
const median = (xs) => { const s = [...xs].sort((a, b) => a - b), h = s.length >> 1; return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2; };
let seed = 20261206;
const rnd = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed / 2 ** 32 - 0.5) * 1e-3; };
const grads = [0, 1].map(() => Object.fromEntries(shapes.map(([n, s]) => [n, Float64Array.from({ length: s.reduce((a, b) => a * b, 1) }, rnd)])));
const N = names.reduce((n, k) => n + grads[0][k].length, 0);
const messages = (step) => grads.map((g, slot) => CODECS.int8.encode(flattenGrads(g, names), { seed: cfg.seed, step, slot, offset: 0 }));

async function exchange(step, encoded) {
  const c = new SimulatedCollective(shapes, { seed: cfg.seed, exchange: 'int8' });
  const t0 = performance.now();
  const outs = await Promise.all(grads.map((g, slot) => c.exchange(step, [0, 1], slot, 1.0, g, encoded ? encoded[slot] : null)));
  return { ms: performance.now() - t0, G: outs[0].grads };
}
const ms = { host: [], given: [], spot: [], reduce: [] };
for (let r = 0; r <= REPS; r++) {
  const pre = messages(r);
  const a = await exchange(r, null), b = await exchange(r, pre);
  for (const k of names) if (Buffer.compare(Buffer.from(a.G[k].buffer, a.G[k].byteOffset, a.G[k].byteLength), Buffer.from(b.G[k].buffer, b.G[k].byteOffset, b.G[k].byteLength))) throw new Error(`G of ${k} differs`);
  const t0 = performance.now();
  const why = spotCheckMessage(CODECS.int8, grads[0], names, pre[0], { seed: cfg.seed, step: r, slot: 0 });
  const spot = performance.now() - t0;
  if (why) throw new Error(`spot check: ${why}`);
  const decoded = pre.map((m) => CODECS.int8.decode(m, N)), t1 = performance.now();
  CODECS.int8.reduce(decoded, { seed: cfg.seed, step: r, offset: 0 });
  const reduce = performance.now() - t1;
  if (r > 0) { ms.host.push(a.ms); ms.given.push(b.ms); ms.spot.push(spot); ms.reduce.push(reduce); }
}
const out = { values: N, reps: REPS, hostEncodesMs: median(ms.host), messagesGivenMs: median(ms.given), spotCheckMs: median(ms.spot), reduceMs: median(ms.reduce) };
out.savedMs = out.hostEncodesMs - out.messagesGivenMs;
out.ratio = out.messagesGivenMs / out.hostEncodesMs;
console.log(JSON.stringify(out));
