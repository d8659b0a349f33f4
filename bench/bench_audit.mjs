// Audited gradients (docs/VERIFICATION.md §13), in node, simulated (one process, no network):
//  1. steps to detection per attack at the default audit rate: the median and mean over --seeds
//     run seeds (each a different run, so a different audit schedule) against the documented
//     probability p per step (audit.js detectionProbability: expected 1/p, median ceil(ln .5 / ln(1-p)));
//  2. the audit's overhead at P = 2, 3, 4, 8 at the default settings (the CLI's wasm-simd backend): per peer and step, the
//     medians over --reps steps of one local step, of SHA-256 over its messages (the commitment)
//     and over the messages it receives (the receivers' check), of the audit's recomputation
//     shared over the group (rate local steps per peer), of a state snapshot (one per passed
//     audit); and the bytes: commitments and nonces vs the gradient bytes of the topology.
//  3. audit before applying vs apply then audit: the step's critical path modeled from (2)'s
//     measured compute (P = 3, f64, default settings) and home-link figures (upload 10 and 30
//     Mbit/s, round trips 20 and 100 ms): no audit T_local + T_x + RTT/2; before applying
//     T_local + max(T_x + RTT/2, RTT + T_audit) + RTT/2 (commitments, then the nonce reveal, the
//     auditor's recomputation beside the transfer, then its verdict before anyone applies);
//     apply then audit T_local + max(T_x, T_audit) + RTT/2 + T_snapshot (nonces and verdicts
//     ride on the next steps' frames, the recomputation beside the next transfer).
//   node bench/bench_audit.mjs [--seeds 24] [--reps 15] [--json]
import { makeConfig } from '../frontend_js/config.js';
import { Group, cloneReplica } from '../frontend_js/train.js';
import { flattenGrads } from '../frontend_js/collective.js';
import { paramShapes } from '../frontend_js/model.js';
import { DEFAULT_AUDIT_RATE, detectionProbability, expectedSteps, medianSteps, messageHashes, slotMessages, messageBounds } from '../frontend_js/audit.js';
import { codecFor } from '../frontend_js/exchange_codec.js';
import { loadStream } from '../frontend_js/cli.mjs';
import { bestBackend } from '../frontend_js/engines.js';
import { attackedRun, median, stepsToDetection } from '../tests/js/attack_runs.mjs';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const SEEDS = Number(opt('--seeds', 24)), REPS = Number(opt('--reps', 15)), JSON_OUT = argv.includes('--json');
const TINY = { width: 16, seq_len: 16, batch: 2, layers: 1, heads: 4 };
const FROM = 3, CAP = 250;
const backend = await bestBackend();       // the CLI's (wasm-simd); the same bits as the mirror

// attack -> [peers, spec, attacker ids, p per step]
const ATTACKS = {
  'scale:-1000': [3, 'kind=scale:-1000', [1]], nan: [3, 'kind=nan', [1]], noise: [3, 'kind=noise', [1]],
  const: [3, 'kind=const', [1]], stale: [3, 'kind=stale', [1]], otherbatch: [3, 'kind=otherbatch', [1]],
  mismatch: [3, 'kind=mismatch', [1]], 'liar-auditor': [3, 'kind=liar-auditor', [1]],
  'collude 2 of 5': [5, 'kind=scale:-1000', [1, 3]],
};
const probability = (name, P, ids) => (name === 'nan' ? 1 : detectionProbability(P, DEFAULT_AUDIT_RATE, ids.length, name === 'liar-auditor'));

async function detection() {
  const rows = [];
  for (const [name, [P, spec, ids]] of Object.entries(ATTACKS)) {
    const slots = ids.join('+');
    const first = [], both = [];
    for (let seed = 1; seed <= SEEDS; seed++) {
      const { rec } = await attackedRun({ settings: { ...TINY, seed }, peers: P, attack: `slot=${slots},from=${FROM},${spec}`,
        steps: FROM + CAP, backend, until: (r) => ids.every((id) => r.events.some((e) => e.peer === id)) });
      const d = ids.map((id) => stepsToDetection(rec, id, FROM));
      if (d.some((x) => x === null)) throw new Error(`${name} seed ${seed}: not detected within ${CAP} steps`);
      first.push(Math.min(...d));
      both.push(Math.max(...d));
    }
    const p = probability(name, P, ids);
    rows.push({ attack: name, P, p, expected: expectedSteps(p), expectedMedian: medianSteps(p),
      median: median(first), mean: first.reduce((a, b) => a + b, 0) / SEEDS, max: Math.max(...first),
      ...(ids.length > 1 ? { medianBoth: median(both) } : {}) });
  }
  return rows;
}

const timeMs = (f) => { const t = process.hrtime.bigint(); f(); return Number(process.hrtime.bigint() - t) / 1e6; };
const timeMsAsync = async (f) => { const t = process.hrtime.bigint(); await f(); return Number(process.hrtime.bigint() - t) / 1e6; };

async function overhead() {
  const cfg = makeConfig({}), names = paramShapes(cfg).map(([n]) => n);
  const g = new Group(cfg, 1, loadStream(null), backend);
  const rows = [];
  for (const [P, exchange] of [[2, 'f64'], [3, 'f64'], [4, 'f64'], [8, 'f64'], [3, 'int8'], [8, 'int8']]) {
    const codec = codecFor(exchange);
    const local = [], hashOwn = [], hashWasm = [], hashIn = [], snap = [];
    for (let i = 0; i < REPS + 2; i++) {
      let flat;
      g.arena.reset();
      local.push(await timeMsAsync(async () => {
        const r = await g.trainers[0].localStep(i, 0, g.arena);
        flat = flattenGrads(r.grads, names);
      }));
      const msgs = slotMessages(flat, P, cfg.seed, i, 0, codec);
      hashOwn.push(timeMs(() => messageHashes(msgs)));
      hashWasm.push(timeMs(() => msgs.map((m) => backend.sha.hexOf([m]))));     // the backend's gated SHA-256
      // what a peer receives and checks: all-gather P-1 whole messages, reduce-scatter P-1 slices of
      // its shard (msgs[0] is the one or the other)
      hashIn.push(timeMs(() => { for (let k = 0; k < P - 1; k++) backend.sha.hexOf([msgs[0]]); }));
      snap.push(timeMs(() => cloneReplica(g.replicas[0])));
    }
    const N = names.reduce((n, k) => n + g.replicas[0].params[k].length, 0);
    const m = (xs) => median(xs.slice(2));
    const messages = messageBounds(N, P, codec).length;
    const msgBytes = codec.messageBytes(N);
    const gradBytes = P <= 3 ? (P - 1) * msgBytes : 2 * ((P - 1) / P) * msgBytes;           // sent per peer per step
    const auditBytes = (P - 1) * (32 + 32 * messages + 32 + 32);             // digest, hashes, nonce hash, nonce
    const auditor = DEFAULT_AUDIT_RATE * P * (m(local) + m(hashWasm));      // the group's recomputations per step: rate x P
    const extra = m(hashWasm) + m(hashIn) + auditor / P + m(snap);           // every peer's, on average
    rows.push({ P, exchange, N, localMs: m(local), hashOwnMs: m(hashOwn), hashOwnBackendMs: m(hashWasm), shaBackend: backend.sha.name,
      hashInMs: m(hashIn), snapshotMs: m(snap),
      auditorExtraMs: auditor, perPeerExtraMs: extra, perPeerOverhead: extra / m(local),
      gradBytes, auditBytes, bytesOverhead: auditBytes / gradBytes });
  }
  return rows;
}

function schedules(over) {
  const r = over.find((x) => x.P === 3 && x.exchange === 'f64');
  const tAudit = r.auditorExtraMs;
  const rows = [];
  for (const mbit of [10, 30]) {
    for (const rtt of [20, 100]) {
      const tx = (r.gradBytes * 8) / (mbit * 1e3);                           // ms
      const none = r.localMs + tx + rtt / 2;
      const before = r.localMs + Math.max(tx + rtt / 2, rtt + tAudit) + rtt / 2;
      const after = r.localMs + Math.max(tx, tAudit) + rtt / 2 + r.snapshotMs;
      rows.push({ mbit, rtt, txMs: tx, noneMs: none, beforeMs: before, afterMs: after });
    }
  }
  return rows;
}

const over = await overhead();
const out = { seeds: SEEDS, from: FROM, detection: await detection(), overhead: over, schedules: schedules(over) };
if (JSON_OUT) console.log(JSON.stringify(out, null, 1));
else {
  console.log(`steps to detection, audit rate ${DEFAULT_AUDIT_RATE}, ${SEEDS} seeds (median / mean / max; documented p, 1/p, median)`);
  for (const r of out.detection) {
    console.log(`  ${r.attack.padEnd(15)} P=${r.P}  ${r.median} / ${r.mean.toFixed(2)} / ${r.max}   p=${r.p.toFixed(3)} `
      + `E=${r.expected.toFixed(2)} median=${r.expectedMedian}${r.medianBoth === undefined ? '' : `  (both removed: median ${r.medianBoth})`}`);
  }
  console.log(`overhead per peer and step, default settings (ms medians, ${over[0].shaBackend} SHA-256; bytes per peer per step)`);
  for (const r of out.overhead) {
    console.log(`  P=${r.P} ${r.exchange} N=${r.N}: local ${r.localMs.toFixed(2)}, hash own ${r.hashOwnBackendMs.toFixed(2)} `
      + `(JS SHA-256: ${r.hashOwnMs.toFixed(2)}), hash received `
      + `${r.hashInMs.toFixed(2)}, snapshot ${r.snapshotMs.toFixed(2)}; per peer +${(100 * r.perPeerOverhead).toFixed(1)}% `
      + `(the auditor: +${r.auditorExtraMs.toFixed(2)} ms); bytes ${r.auditBytes} vs ${Math.round(r.gradBytes)} `
      + `(+${(100 * r.bytesOverhead).toFixed(3)}%)`);
  }
  console.log('step time modeled, P = 3 f64 default settings (ms): no audit / audit before applying / apply then audit');
  for (const r of out.schedules) {
    console.log(`  ${r.mbit} Mbit/s, RTT ${r.rtt} ms (transfer ${r.txMs.toFixed(0)}): ${r.noneMs.toFixed(0)} / `
      + `${r.beforeMs.toFixed(0)} (+${(100 * (r.beforeMs / r.noneMs - 1)).toFixed(1)}%) / ${r.afterMs.toFixed(0)} `
      + `(+${(100 * (r.afterMs / r.noneMs - 1)).toFixed(1)}%)`);
  }
}
