// The host's side of the resident step's unit self-audit (gpu/resident.js checkUnitAudits,
// docs/VERIFICATION.md §9.2): one step's gathered samples — UNIT_AUDIT_SAMPLES elements of every
// unit call with their rows and columns — recomputed and compared. The calls' K are the step's own
// (recorded from one CPU local step at the settings); the gathered values are consistent, so every
// check passes and each is timed whole. Medians of REPS after a warm-up.
//   node bench/bench_unit_audit_check.mjs [--reps 15] [--width 128 --seq-len 128 --batch 32]
import { checkUnitAudits, UNIT_AUDIT_SAMPLES } from '../frontend_js/gpu/resident.js';
import { unitDot } from '../frontend_js/units.js';
import { referenceBackend } from '../frontend_js/engines.js';
import { initParams, lossAndGrads } from '../frontend_js/model.js';
import { makeConfig } from '../frontend_js/config.js';

const arg = (name, dflt) => { const i = process.argv.indexOf(`--${name}`); return i > 0 ? Number(process.argv[i + 1]) : dflt; };
const REPS = arg('reps', 15);
const cfg = makeConfig({ width: arg('width', 128), seq_len: arg('seq-len', 128), batch: arg('batch', 32) });

// the K of every unit call of one local step, in order (the CPU engine's GEMMs see the same calls)
const ks = [], engine = referenceBackend.engine;     // gemm(qa, qb, batch, M, K, N): K is the 5th
const spy = Object.fromEntries(['gemm', 'gemmBT'].filter((f) => engine[f]).map((f) => [f, (...a) => { ks.push(a[4]); return engine[f](...a); }]));
const backend = { ...referenceBackend, engine: { ...engine, ...spy } };
const N = cfg.batch * cfg.seq_len, x = Int32Array.from({ length: N }, (_, i) => (i * 7) % 200), y = Int32Array.from({ length: N }, (_, i) => (i * 11) % 250);
await lossAndGrads(initParams(cfg), cfg, x, y, cfg.batch, cfg.seq_len, backend);

const audits = ks.map((kk, call) => {
  const values = Float64Array.from({ length: UNIT_AUDIT_SAMPLES * (2 * kk + 1) }, (_, i) => Math.sin(i * 1.7 + call) * 3);
  for (let s = 0; s < UNIT_AUDIT_SAMPLES; s++) {
    const at = s * (2 * kk + 1);
    values[at + 2 * kk] = unitDot(values.subarray(at, at + kk), values.subarray(at + kk, at + 2 * kk), kk);
  }
  return { kk, samples: Array.from({ length: UNIT_AUDIT_SAMPLES }, (_, e) => ({ e })), values };
});
if (process.env.SHOW_K) console.error(ks.join(" "));
if (checkUnitAudits(audits) !== null) throw new Error('consistent samples failed their check');
const ms = [];
for (let r = 0; r < REPS + 2; r++) { const t0 = performance.now(); checkUnitAudits(audits); ms.push(performance.now() - t0); }
const med = [...ms.slice(2)].sort((a, b) => a - b)[REPS >> 1];
console.log(JSON.stringify({ settings: { width: cfg.width, seq_len: cfg.seq_len, batch: cfg.batch, layers: cfg.layers }, unitCalls: ks.length,
  largestK: Math.max(...ks), samplesPerCall: UNIT_AUDIT_SAMPLES, gatheredMB: +(audits.reduce((n, a) => n + a.values.length * 8, 0) / 2 ** 20).toFixed(2), checkMs: +med.toFixed(2) }));
