// Convergence of the exchange codecs (issue 21 §2; TEST_RESULTS.md "Exchange codec"): the
// convergence suite's settings (tests/test_convergence.py: the default config, 2 peers, the
// built-in corpus) trained for --steps steps (2,000) per seed (1234, 1, 2) with
//   f64    today's exchange (exact)
//   int8   exchange_codec.js's int8 (the setting)
//   randk  a sparser prototype, measured here only: each slot keeps each value with probability
//          1/4 (keyed Bernoulli on (seed, step, slot, index): the receiver knows the positions
//          from the key, so only the kept values travel), kept values x4 (unbiased), then int8
//          as above; G re-quantized as int8. Bytes: 4 per 256-value block + the kept values.
//   int8ef the alternative the codec does not take, measured for the record: error feedback: each
//          slot adds its private residual e to its gradient, sends int8 with round-to-nearest
//          (the same blocks and scales) and keeps e = (g + e) - decoded; G as int8.
// "Loss at S" = the mean training loss of steps S-19..S (tests/test_convergence.py's rule).
// The JS CLI's bits equal python -m daisy.train's (tests/test_js_mirror.py), so f64 and int8
// here are the reference's numbers.
//   nice -n 19 taskset -c 1 node bench/bench_exchange_convergence.mjs [--steps 2000] [--codecs f64,int8,randk] [--seeds 1234,1,2]
import { loadStream } from '../frontend_js/cli.mjs';
import { makeConfig } from '../frontend_js/config.js';
import { Group } from '../frontend_js/train.js';
import { bestBackend } from '../frontend_js/engines.js';
import { CODECS, BLOCK } from '../frontend_js/exchange_codec.js';
import { key, uniform } from '../frontend_js/prng.js';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const STEPS = Number(opt('--steps', '2000'));
const CODEC_NAMES = opt('--codecs', 'f64,int8,randk').split(',');
const SEEDS = opt('--seeds', '1234,1,2').split(',').map(Number);
const DENSITY = 0.25;
const PURPOSE_RANDK = 0x5a4b;      // the prototype's own stream purpose

// the prototype: encode -> {values: dense decoded contribution, length: bytes on the wire}
const int8 = CODECS.int8;
const randk = {
  name: 'randk',
  shardBounds: (N, P) => int8.shardBounds(N, P),
  encode(x, { seed, step, slot, offset }) {
    const k = key(PURPOSE_RANDK, seed, step, slot);
    const kept = new Float64Array(x.length);
    let n = 0;
    for (let i = 0; i < x.length; i++) if (uniform(k, offset + i) < DENSITY) { kept[i] = x[i] / DENSITY; n++; }
    const values = int8.decode(int8.encode(kept, { seed, step, slot, offset }), x.length);
    return { values, length: 4 * Math.ceil(x.length / BLOCK) + n };
  },
  decode: (m) => m.values,
  reduce: (slices, o) => int8.reduce(slices, o),
};

// error feedback: the residual of each slot lives here, outside any message (that is the point)
function makeErrorFeedback() {
  const residual = new Map();
  return {
    name: 'int8ef',
    shardBounds: (N, P) => int8.shardBounds(N, P),
    encode(x, { slot, offset }) {
      const e = residual.get(slot) || new Float64Array(x.length);
      const v = Float64Array.from(x, (g, i) => g + e[i]);
      const out = new Float64Array(x.length);
      for (let j = 0; j * BLOCK < x.length; j++) {
        const i0 = j * BLOCK, i1 = Math.min(x.length, i0 + BLOCK);
        let m = 0;
        for (let i = i0; i < i1; i++) m = Math.max(m, Math.abs(v[i]));
        const sc = Math.fround(m) >= m ? Math.fround(m) : Math.fround(m * (1 + 2 ** -23));
        for (let i = i0; i < i1; i++) out[i] = sc === 0 ? 0 : (Math.round((v[i] * 127) / sc) * sc) / 127;
      }
      residual.set(slot, Float64Array.from(v, (y, i) => y - out[i]));
      return { values: out, length: int8.messageBytes(x.length) };
    },
    decode: (m) => m.values,
    reduce: (slices, o) => int8.reduce(slices, o),
  };
}

function meanOf(a) { let s = 0; for (const x of a) s += x; return s / a.length; }

async function run(codecName, seed, backend, stream) {
  const cfg = makeConfig({ steps: Math.max(STEPS, 100), seed, exchange: codecName === 'f64' ? 'f64' : 'int8' });
  const group = new Group(cfg, 2, stream, backend);
  if (codecName === 'randk') group.collective.codec = randk;
  if (codecName === 'int8ef') group.collective.codec = makeErrorFeedback();
  let bytes = 0;
  const codec = group.collective.codec;
  const counting = Object.create(codec);
  counting.encode = (x, o) => { const m = codec.encode(x, o); bytes += m.length; return m; };
  group.collective.codec = counting;
  const losses = [];
  const t0 = performance.now();
  for (let i = 0; i < STEPS; i++) {
    const r = await group.step();
    if (new Set(r.hashes).size !== 1) throw new Error(`${codecName} seed ${seed}: replicas differ at step ${r.step}`);
    losses.push(r.loss);
  }
  const at = (S) => meanOf(losses.slice(S - 20, S));
  return { codec: codecName, seed, steps: STEPS, loss300: at(Math.min(300, STEPS)), lossEnd: at(STEPS),
    first: losses[0], slotBytesPerStep: bytes / STEPS / 2, seconds: (performance.now() - t0) / 1000 };
}

const stream = loadStream(null);
const backend = await bestBackend();
const rows = [];
for (const seed of SEEDS) {
  for (const c of CODEC_NAMES) {
    const r = await run(c, seed, backend, stream);
    rows.push(r);
    console.log(JSON.stringify(r));
  }
}
console.log(`\nloss (mean of the 20 steps ending at S), default config, 2 peers, ${STEPS} steps`);
console.log('seed   codec   loss@300   vs f64     loss@' + STEPS + '  vs f64');
for (const r of rows) {
  const f = rows.find((x) => x.seed === r.seed && x.codec === 'f64');
  const rel = (a, b) => (f ? `${(100 * (a - b) / b >= 0 ? '+' : '')}${(100 * (a - b) / b).toFixed(2)} %` : '');
  console.log(`${String(r.seed).padEnd(6)} ${r.codec.padEnd(7)} ${r.loss300.toFixed(4)}   ${rel(r.loss300, f?.loss300).padEnd(9)}  ${r.lossEnd.toFixed(4)}     ${rel(r.lossEnd, f?.lossEnd)}`);
}
