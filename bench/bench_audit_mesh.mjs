// Audited gradients over the mesh (frontend_js/run/audits.js): what the audits cost a page run,
// measured with the run controllers of tests/js/run_harness.mjs (P controllers in one Node
// process over the in-memory transport, the tiny settings, wasm-simd). For P = 2, 3, 4, 8: one
// 100-step run with auditRate 0 and one with auditRate --rate (default: the default 0.1), alternated --reps times; per run the
// median step interval of the leader (all P pages share this one thread, so the interval is the
// group's compute + the transport), and per page and step the bytes of AUDIT/EVIDENCE frames
// (and TRANSCRIPT_ASK/TRANSCRIPT: the audit of a reduce-scatter shard owner, P >= 4)
// against the gradient bytes (GRAD, GRAD_PART, REDUCED) it sent. Reported: medians over the reps
// and the ratio audited / not audited of the step interval.
//   node bench/bench_audit_mesh.mjs [--reps 3] [--rate 0.1] [--peers 2,3,4,8] [--json]
import { Group, SETTINGS } from '../tests/js/run_harness.mjs';
import { TYPES } from '../frontend_js/mesh/frames.js';
import { median } from '../tests/js/attack_runs.mjs';
import { DEFAULT_AUDIT_RATE } from '../frontend_js/audit.js';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const REPS = Number(opt('--reps', 3)), JSON_OUT = argv.includes('--json');
const RATE = Number(opt('--rate', DEFAULT_AUDIT_RATE)), PEERS = opt('--peers', '2,3,4,8').split(',').map(Number);
const STEPS = 100;
const GRAD_TYPES = new Set([TYPES.GRAD, TYPES.GRAD_PART, TYPES.REDUCED]);
const AUDIT_TYPES = new Set([TYPES.AUDIT, TYPES.EVIDENCE, TYPES.TRANSCRIPT_ASK, TYPES.TRANSCRIPT]);

// one run of P pages: -> {stepMs (the leader's median step interval), auditBytes, gradBytes (per page and step)}
async function oneRun(P, auditRate, seed) {
  const g = new Group({ seed, dup: 0, delay: 0 });
  const nodes = g.add(P);
  const bytes = { audit: 0, grad: 0 };
  for (const n of nodes) {
    const send = n.mesh.send.bind(n.mesh);
    n.mesh.send = (to, m) => {
      const len = m.payload?.length || 0;
      if (AUDIT_TYPES.has(m.type)) bytes.audit += len;
      if (GRAD_TYPES.has(m.type)) bytes.grad += len;
      return send(to, m);
    };
  }
  await g.linked();
  const times = [];
  nodes[0].onEventOrig = nodes[0].onEvent;
  nodes[0].onEvent = (e, p) => { if (e === 'step') times.push(performance.now()); nodes[0].onEventOrig(e, p); };
  await nodes[0].ctl.start({ ...SETTINGS, steps: STEPS, auditRate });
  await g.ended(nodes, 600_000);
  for (const n of nodes) if (n.ended.state !== 'done') throw new Error(`${n.id}: ${n.ended.message}`);
  await g.close();
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  return { stepMs: median(gaps), auditBytes: bytes.audit / P / STEPS, gradBytes: bytes.grad / P / STEPS };
}

const rows = [];
for (const P of PEERS) {
  const runs = { 0: [], [RATE]: [] };
  for (let r = 0; r < REPS; r++) for (const rate of [0, RATE]) runs[rate].push(await oneRun(P, rate, 100 + r));
  const m = (rate, k) => median(runs[rate].map((x) => x[k]));
  rows.push({ P, stepMsOff: m(0, 'stepMs'), stepMsOn: m(RATE, 'stepMs'), ratio: m(RATE, 'stepMs') / m(0, 'stepMs'),
              auditBytes: m(RATE, 'auditBytes'), gradBytes: m(RATE, 'gradBytes') });
}
if (JSON_OUT) console.log(JSON.stringify(rows));
else {
  console.log(`| P | step ms, audits off | step ms, auditRate ${RATE} | ratio | AUDIT+EVIDENCE+TRANSCRIPT bytes / page / step | gradient bytes / page / step |`);
  console.log('|---|---|---|---|---|---|');
  for (const r of rows) console.log(`| ${r.P} | ${r.stepMsOff.toFixed(2)} | ${r.stepMsOn.toFixed(2)} | ${r.ratio.toFixed(2)} | ${Math.round(r.auditBytes)} | ${Math.round(r.gradBytes)} |`);
}
process.exit(0);
