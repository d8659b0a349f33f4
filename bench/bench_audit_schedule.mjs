// The audit schedule's cost in counts, not time (docs/VERIFICATION.md §13 "The schedule"): for
// P = 2..8 and a few audit rates, the pages' schedule over --steps steps (the reference nonces,
// auditPairs with the auditors' loads, and run/audit_schedule.js shareUnits, the function the pages run)
// with no idle time at all (the worst case: a CPU-bound LAN group whose exchange hides nothing).
// Every page computes one local step (U units) per step plus its share of audit units; the
// lockstep waits for the busiest page, so a group step costs 1 + max over pages (share / U) local
// steps. Reported per P and rate: that cost's mean (the overhead), the tokens/s ratio to the
// unaudited group 1 / (1 + overhead), the mean and largest share of one page, the verdict lag
// (steps from an audited step to its verdict, mean and max; the deadline is W) and the states a
// page keeps for pending verdicts (max), with p, E[D] and the median steps to catch one forger.
// Deterministic: the same numbers on any machine.
//   node bench/bench_audit_schedule.mjs [--steps 4000] [--layers 8] [--rates 0.05,0.1,0.125,0.2] [--uniform] [--json]
import { AUDIT_WINDOW, auditLoad, auditPairs, beacon, detectionProbability, expectedSteps, medianSteps, referenceNonce } from '../frontend_js/audit.js';
import { unitsPerStep } from '../frontend_js/run/audit_book.js';
import { shareUnits } from '../frontend_js/run/audit_schedule.js';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const STEPS = Number(opt('--steps', 4000)), LAYERS = Number(opt('--layers', 8));
const RATES = opt('--rates', '0.05,0.1,0.125,0.2').split(',').map(Number);
const UNIFORM = argv.includes('--uniform'), JSON_OUT = argv.includes('--json');
const U = unitsPerStep({ layers: LAYERS });
const LAG = 2;                       // the pairs of step t are known after the exchange of t + 2 (the reveals)

// one schedule of P pages at `rate` -> its counts
function schedule(P, rate, seed = 1) {
  const assigned = new Map();
  const books = Array.from({ length: P }, () => ({ rate, span: 1, queued: [], units: { perStep: U } }));
  let cost = 0, shareSum = 0, shareMax = 0, lagSum = 0, lagMax = 0, verdicts = 0, keptMax = 0;
  for (let s = 0; s < STEPS; s++) {
    const t = s - LAG;
    if (t >= 0) {
      const nonces = Array.from({ length: P }, (_, i) => referenceNonce(seed, t, i));
      const pairs = auditPairs(seed, t, P, rate, beacon([], nonces), UNIFORM ? null : auditLoad(assigned, t, P));
      assigned.set(t, pairs.map(([a]) => a));
      assigned.delete(t - AUDIT_WINDOW);
      for (const [a] of pairs) books[a].queued.push({ t, done: 0 });
    }
    let busiest = 0;
    for (const b of books) {
      let left = shareUnits(b, s);
      busiest = Math.max(busiest, left);
      shareSum += left; shareMax = Math.max(shareMax, left);
      while (left > 0 && b.queued.length) {
        const a = b.queued[0], n = Math.min(left, U - a.done);
        a.done += n; left -= n;
        if (a.done === U) { b.queued.shift(); verdicts++; lagSum += s - a.t; lagMax = Math.max(lagMax, s - a.t); }
      }
      keptMax = Math.max(keptMax, new Set(b.queued.map((a) => a.t)).size);
    }
    cost += 1 + busiest / U;
  }
  const overhead = cost / STEPS - 1, p = detectionProbability(P, rate);
  return { P, rate, overhead, ratio: 1 / (1 + overhead), perPage: shareSum / STEPS / P / U, shareMax: shareMax / U,
           lagMean: lagSum / verdicts, lagMax, keptMax, p, expected: expectedSteps(p), median: medianSteps(p) };
}

const rows = [];
for (const rate of RATES) for (let P = 2; P <= 8; P++) rows.push(schedule(P, rate));
if (JSON_OUT) console.log(JSON.stringify({ steps: STEPS, layers: LAYERS, units: U, window: AUDIT_WINDOW, uniform: UNIFORM, rows }));
else {
  console.log(`${STEPS} steps, ${LAYERS} layers (${U} units a local step), W = ${AUDIT_WINDOW}, auditors ${UNIFORM ? 'uniform' : 'balanced by load'}, no idle time`);
  console.log('| rate | P | p | E[D] | median D | overhead (local steps / step) | ratio to unaudited | one page\'s mean share | largest share | verdict lag mean / max | states pending (max) |');
  console.log('|---|---|---|---|---|---|---|---|---|---|---|');
  for (const r of rows) {
    console.log(`| ${r.rate} | ${r.P} | ${r.p.toFixed(3)} | ${r.expected.toFixed(1)} | ${r.median} | ${r.overhead.toFixed(3)} | ${r.ratio.toFixed(3)} | `
      + `${r.perPage.toFixed(3)} | ${r.shareMax.toFixed(2)} | ${r.lagMean.toFixed(1)} / ${r.lagMax} | ${r.keptMax} |`);
  }
}
