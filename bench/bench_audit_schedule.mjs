// The audit schedule's cost in counts, not time (docs/VERIFICATION.md §13 "The schedule", "Rounds
// of local steps"): for P = 2..8, a few audit rates and local steps H, the pages' schedule over
// --steps audited units (steps, or rounds of H local steps) — the reference nonces, auditPairs with
// the auditors' loads (counted in units), and run/audit_schedule.js shareUnits, the function the
// pages run — with no idle time at all (the worst case: a CPU-bound LAN group whose exchange
// hides nothing).
// Every page computes H local steps (U units each) per round plus its share of audit units (an
// audit recomputes one round: H·U units); the group waits at exchanges only, once per round, for
// the busiest page, so a round costs H + max over pages (share / U) local steps, whenever in the
// round each page does its share. Per step: overhead = (that max) / H local steps. Reported per H,
// P and rate: the overhead, the tokens/s ratio to the unaudited group 1 / (1 + overhead), one
// page's mean share and the largest (local steps per step / per round), the verdict lag (from an
// audited unit's exchange to its verdict, in rounds and steps, mean and max; the deadline is W
// rounds) and the states a page keeps for pending verdicts (max), with p per round, E[D] and the
// median in rounds and in steps (H per round) for one persistent forger; with H > 1, the rounds in
// which some page's share starts on an audit drawn at that exchange (its state just asked for).
// Where a page pays its share (--share):
//   rounds  counted in rounds (the default): once per round, at the exchange, shareUnits over a book
//           whose unit is the round (H·U units, deadlines W rounds): a round's share is the per-step
//           rule's share of a step, with rounds for steps. H = 1: the per-step schedule exactly.
//   pages   as run/loop.js calls it: payShare (shareUnits with span H, its deadlines and least
//           share counted in rounds) once per round at the exchange step: the same numbers as
//           `rounds` (tests/js/audit_schedule_bench.test.mjs); before that fix it counted steps and
//           paid about 1/H of a round's share until the last deadline forced the rest.
// Deterministic: the same numbers on any machine.
//   node bench/bench_audit_schedule.mjs [--steps 4000] [--layers 8] [--rates 0.05,0.1,0.125,0.2]
//        [--local-steps 1,4,16] [--share rounds|pages] [--uniform] [--json]
//
// --bytes: the other cost of an audit of a round, computed: the audited slot's Adam state
// (ROUND_STATE, stateTranscriptBytes(N) = 4 + 16·N bytes) against the round's int8 exchange bytes,
// at the default settings, bench_wire.py's "large" and the largest the config allows, converted to
// seconds on tools/netlab/profiles.py's uplinks (nominal rates: a lower bound) and set against a
// round's compute (one page's measured ms/step × H, TEST_RESULTS.md): secondRows() has the model.
//   node bench/bench_audit_schedule.mjs --bytes [--rates ...] [--local-steps 4,16] [--json]
import { AUDIT_WINDOW, auditLoad, auditPairs, beacon, detectionProbability, expectedSteps, medianSteps, referenceNonce,
         stateTranscriptBytes } from '../frontend_js/audit.js';
import { unitsPerStep } from '../frontend_js/run/audit_book.js';
import { shareUnits } from '../frontend_js/run/audit_schedule.js';
import { TIMING } from '../frontend_js/run/record.js';
import { CODECS } from '../frontend_js/exchange_codec.js';
import { topologyFor } from '../frontend_js/collective.js';
import { makeConfig } from '../frontend_js/config.js';
import { paramCount } from '../frontend_js/model.js';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const STEPS = Number(opt('--steps', 4000)), LAYERS = Number(opt('--layers', 8));
const RATES = opt('--rates', '0.05,0.1,0.125,0.2').split(',').map(Number);
const HS = opt('--local-steps', '1').split(',').map(Number);
const SHARE = opt('--share', 'rounds');
const UNIFORM = argv.includes('--uniform'), JSON_OUT = argv.includes('--json'), BYTES = argv.includes('--bytes');
if (!['rounds', 'pages'].includes(SHARE)) throw new Error(`--share is rounds or pages, not ${SHARE}`);
const U = unitsPerStep({ layers: LAYERS });
const LAG = 2;                       // the pairs of a unit are known after the exchange two units later (the reveals)

// one schedule of P pages at `rate`, H local steps a round, over STEPS rounds -> its counts.
// A queued audit's t is what its book's deadline counts in: the round's index (share 'rounds': a
// book of span 1 whose unit is a round of H·U units) or its exchange step (share 'pages': span H)
function schedule(P, rate, H, seed = 1) {
  const assigned = new Map();
  const book = () => (SHARE === 'rounds' ? { rate, span: 1, queued: [], units: { perStep: U * H } }
    : { rate, span: H, queued: [], units: { perStep: U } });
  const books = Array.from({ length: P }, book);
  const exchange = (r) => r * H + H - 1;                      // the exchange step of round r
  const clock = (r) => (SHARE === 'rounds' ? r : exchange(r)); // where shareUnits is asked, in its book's count
  let cost = 0, shareSum = 0, shareMax = 0, lagSum = 0, lagMax = 0, verdicts = 0, keptMax = 0, headRounds = 0;
  for (let r = 0; r < STEPS; r++) {
    const k = r - LAG;
    let head = false;     // some page's audit drawn now is first in its queue: its share starts on it at once
    if (k >= 0) {
      const t = exchange(k);                                  // the audited round's exchange step (H = 1: k)
      const nonces = Array.from({ length: P }, (_, i) => referenceNonce(seed, t, i));
      const pairs = auditPairs(seed, t, P, rate, beacon([], nonces), UNIFORM ? null : auditLoad(assigned, k, P));
      assigned.set(k, pairs.map(([a]) => a));
      assigned.delete(k - AUDIT_WINDOW);
      for (const [a] of pairs) { head ||= !books[a].queued.length; books[a].queued.push({ t: clock(k), k, done: 0, stateReady: true }); }
    }
    headRounds += head && H > 1 ? 1 : 0;
    let busiest = 0;
    for (const b of books) {
      let left = shareUnits(b, clock(r));
      busiest = Math.max(busiest, left);
      shareSum += left; shareMax = Math.max(shareMax, left);
      while (left > 0 && b.queued.length) {
        const a = b.queued[0], n = Math.min(left, U * H - a.done);
        a.done += n; left -= n;
        if (a.done === U * H) { b.queued.shift(); verdicts++; lagSum += r - a.k; lagMax = Math.max(lagMax, r - a.k); }
      }
      keptMax = Math.max(keptMax, new Set(b.queued.map((a) => a.k)).size);
    }
    cost += H + busiest / U;
  }
  const overhead = cost / STEPS / H - 1, p = detectionProbability(P, rate);
  return { H, P, rate, overhead, ratio: 1 / (1 + overhead), perPage: shareSum / STEPS / P / U / H, shareMax: shareMax / U,
           lagMean: lagSum / verdicts, lagMax, keptMax, headRounds: headRounds / STEPS, p, expected: expectedSteps(p), median: medianSteps(p) };
}

// ---- --bytes: a round's state transfer against its exchange and its compute -----------------------
// the settings (frontend_js/config.js; layers and heads as the config's defaults unless named) and one
// page's ms per local step alone: measured (TEST_RESULTS.md "Together faster than alone, after the
// idle-CPU fixes", bench_wire.py's "one page alone", CPU path), or at the largest, estimated from
// bench_wire large by the matmul count (unitsPerStep: 147 / 39 units a step): not measured
const SETTINGS = [
  { name: 'default', cfg: {}, msPerStep: 19, measured: true },
  { name: 'bench_wire large', cfg: { width: 128, seq_len: 128, batch: 32 }, msPerStep: 691, measured: true },
  { name: 'largest (8 layers, 8 heads)', cfg: { width: 128, seq_len: 128, batch: 32, layers: 8, heads: 8 },
    msPerStep: Math.round((691 * unitsPerStep({ layers: 8 })) / unitsPerStep({ layers: 2 })), measured: false },
];
// tools/netlab/profiles.py PROFILES: the uplink (Mbit/s) and the page <-> app round trip (two pages
// see one such round trip as one hop between them: 2 x half of it)
const LINKS = [{ name: 'lan', upMbps: 1000, rttMs: 1 }, { name: 'home', upMbps: 20, rttMs: 40 }, { name: 'far', upMbps: 10, rttMs: 120 }];
const PEERS = [2, 3, 4, 8];

// the int8 bytes a page uploads per exchange: all-gather, its message to each other page; reduce-
// scatter, shard k to its owner k and its reduced shard to each other page (the largest over slots)
function exchangeUpload(N, P) {
  const codec = CODECS.int8;
  if (topologyFor(P) === 'allgather') return (P - 1) * codec.messageBytes(N);
  const b = codec.shardBounds(N, P), shard = (k) => codec.messageBytes(b[k + 1] - b[k]);
  let most = 0;
  for (let slot = 0; slot < P; slot++) {
    let up = (P - 1) * shard(slot);
    for (let k = 0; k < P; k++) if (k !== slot) up += shard(k);
    most = Math.max(most, up);
  }
  return most;
}

// per settings and P: the state S against the exchange E a page uploads per round
function byteRows() {
  const rows = [];
  for (const s of SETTINGS) {
    const N = paramCount(makeConfig(s.cfg)), S = stateTranscriptBytes(N);
    for (const P of PEERS) {
      const E = exchangeUpload(N, P);
      rows.push({ settings: s.name, N, P, topology: topologyFor(P), state: S, exchange: E, message: CODECS.int8.messageBytes(N),
                  perRate: RATES.map((q) => ({ q, up: (E + q * S) / E })) });
    }
  }
  return rows;
}

// per settings, link and H (P = 2, all-gather): seconds on the audited page's uplink (nominal rate:
// a lower bound) against a round, R = H·C + T_exchange + one hop. The audited page sends its state
// when it draws the pairs, right after an exchange, then computes its next round (H·C); the link
// is one ordered queue (rtc_peer.js: up to MAX_LINK_QUEUED bytes buffered ahead), so its next GRAD
// leaves behind what is left of the state:
//   behind       = max(0, T_state − H·C)      the exchange after an audit waits this long
//   slowdown(q)  = (1 − (1 − q)^2) · behind / R   a round holds some page's state with that chance
//   paced(q)     = q·T_state <= H·C            a state sent only while its page computes (never ahead
//                  of a GRAD) spreads over rounds: hidden on average when the uplink's idle time covers it
//   today(q)     = head · (T_state + hop) / R  the pages before the sixth session's fix (docs/VERIFICATION.md
//                  §13 "Pages", race (c)): an auditor whose share started on an audit drawn at this
//                  exchange waited for its state inside the lockstep (head: schedule()'s rounds a share
//                  starts on a state just asked, P = 2); the share now counts only audits whose state
//                  is here, so this column is what that fix removed
//   deadline     = max(TIMING.deadlineMs, deadlineSteps x the mean step R / H) (loop.js), the ask's
//                  wait: a state slower than it and the auditor counts the page gone
function secondRows() {
  const rows = [];
  for (const s of SETTINGS) {
    const N = paramCount(makeConfig(s.cfg)), S = stateTranscriptBytes(N), E = exchangeUpload(N, 2);
    for (const link of LINKS) {
      const secs = (bytes) => (bytes * 8) / (link.upMbps * 1e6);
      for (const H of HS) {
        const compute = (s.msPerStep * H) / 1000, round = compute + secs(E) + link.rttMs / 1000;
        const behind = Math.max(0, secs(S) - compute);
        const waits = (q) => (schedule(2, q, H).headRounds * (secs(S) + link.rttMs / 1000)) / round;
        rows.push({ settings: s.name, measured: s.measured, link: link.name, H, state: secs(S), exchange: secs(E), compute, round,
                    rounds: secs(S) / round, behind, deadline: Math.max(TIMING.deadlineMs / 1000, (TIMING.deadlineSteps * round) / H),
                    perRate: RATES.map((q) => ({ q, slowdown: ((1 - (1 - q) ** 2) * behind) / round, paced: q * secs(S) <= compute, today: waits(q) })) });
      }
    }
  }
  return rows;
}

const f = (x, d = 2) => (x === null ? '–' : x.toFixed(d));
if (BYTES) {
  const bytes = byteRows(), seconds = secondRows();
  if (JSON_OUT) console.log(JSON.stringify({ deadlineMs: TIMING.deadlineMs, bytes, seconds }));
  else {
    const n = (x) => x.toLocaleString('en-US');
    console.log('ROUND_STATE (4 + 16·N bytes) against the int8 exchange bytes a page uploads per round (uplink per round with audits: (E + q·S) / E)');
    console.log(`| settings | N | P | topology | state S | exchange E up / round | S / E | ${RATES.map((q) => `q ${q}`).join(' | ')} |`);
    console.log(`|---|---|---|---|---|---|---|${RATES.map(() => '---|').join('')}`);
    for (const r of bytes) {
      console.log(`| ${r.settings} | ${n(r.N)} | ${r.P} | ${r.topology} | ${n(r.state)} | ${n(r.exchange)} | ${f(r.state / r.exchange)} | ${r.perRate.map((x) => `${f(x.up)}×`).join(' | ')} |`);
    }
    console.log(`\nP = 2: seconds on the audited page's uplink at its nominal rate (a lower bound) against a round (C ms a local step: `
      + `${SETTINGS.map((s) => `${s.name} ${s.msPerStep}${s.measured ? '' : ' est.'}`).join(', ')}); the ask's deadline max(${TIMING.deadlineMs / 1000} s, ${TIMING.deadlineSteps} · R / H); `
      + 'behind: the next exchange waits max(0, T_state − H·C); slowdown = (1 − (1 − q)^2) · behind / R; paced hidden: q·T_state <= H·C; today: the auditor waits for the state in the lockstep, head · (T_state + hop) / R');
    console.log(`| settings | link | H | T_state s | T_exchange s | H·C s | round R s | state in rounds | behind s | the ask's deadline s | ${RATES.map((q) => `q ${q}: slowdown / paced hidden / today`).join(' | ')} |`);
    console.log(`|---|---|---|---|---|---|---|---|---|---|${RATES.map(() => '---|').join('')}`);
    for (const r of seconds) {
      console.log(`| ${r.settings} | ${r.link} | ${r.H} | ${f(r.state, 3)} | ${f(r.exchange, 3)} | ${f(r.compute, 3)}${r.measured ? '' : ' est.'} | ${f(r.round, 3)} | ${f(r.rounds)} | `
        + `${f(r.behind, 3)} | ${f(r.deadline, 1)}${r.state > r.deadline ? ' **(over)**' : ''} | ${r.perRate.map((x) => `${(100 * x.slowdown).toFixed(0)} % / ${x.paced ? 'yes' : 'no'} / ${(100 * x.today).toFixed(0)} %`).join(' | ')} |`);
    }
  }
} else {
  const rows = [];
  for (const H of HS) for (const rate of RATES) for (let P = 2; P <= 8; P++) rows.push(schedule(P, rate, H));
  if (JSON_OUT) console.log(JSON.stringify({ steps: STEPS, layers: LAYERS, units: U, window: AUDIT_WINDOW, uniform: UNIFORM, share: SHARE, rows }));
  else {
    console.log(`${STEPS} audited units (steps, or rounds of H local steps), ${LAYERS} layers (${U} units a local step), W = ${AUDIT_WINDOW} rounds, `
      + `auditors ${UNIFORM ? 'uniform' : 'balanced by load'}, share counted in ${SHARE}, no idle time`);
    console.log('| H | rate | P | p (per round) | E[D] rounds (median) | E[D] steps (median) | overhead (local steps / step) | ratio to unaudited | one page\'s mean share (local steps / step) | largest share (local steps / round) | verdict lag rounds mean / max | verdict lag steps mean / max | states pending (max) | rounds a share starts on a state just asked |');
    console.log('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
    for (const r of rows) {
      console.log(`| ${r.H} | ${r.rate} | ${r.P} | ${r.p.toFixed(3)} | ${r.expected.toFixed(1)} (${r.median}) | ${(r.H * r.expected).toFixed(0)} (${r.H * r.median}) | `
        + `${r.overhead.toFixed(3)} | ${r.ratio.toFixed(3)} | ${r.perPage.toFixed(3)} | ${r.shareMax.toFixed(2)} | ${r.lagMean.toFixed(1)} / ${r.lagMax} | `
        + `${(r.H * r.lagMean).toFixed(0)} / ${r.H * r.lagMax} | ${r.keptMax} | ${r.H > 1 ? `${(100 * r.headRounds).toFixed(0)} %` : '–'} |`);
    }
  }
}
