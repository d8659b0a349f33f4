// Group sizes this machine cannot host as browsers (issue 25 §3): P run controllers
// (frontend_js/run/controller.js) in one Node process over the in-memory transport
// (tests/js/memory_links.mjs) with a one-way delay and a rate on every link, each training real
// steps on the JS mirror (tests/js/run_harness.mjs). A benchmark, not a test.
//
// One process, one thread: the P controllers' compute runs one after another, so a step of the
// group costs the sum of their local steps where devices would overlap them. The bench reports
// both the raw ms/step and `parallel` = ms/step - (sum - max) of the members' own compute per step
// (run.ownMs, frontend_js/run/speed.js): the step a group of separate devices would take, if its
// exchange waits are as measured here. A member's own compute is timed around awaits that other
// controllers' work may interleave with, so it can read high: `parallel` is then low and
// `scaling` an upper estimate (it can exceed P); read the raw ms/step beside it. Per row:
//   ms/step    mean step interval on the leader between two exchanges after --skip steps (local
//              steps: pages run ahead between exchanges, so only whole rounds are timed)
//   own        the leader's own compute per step (local step + apply), ms
//   parallel   ms/step minus the other members' compute (above)
//   scaling    P * (one controller alone's ms/step) / parallel   (tokens/s against one device alone)
//   panel      the leader's panel ratio (speed.js), raw: it sees the serialized step
//
//   node bench/bench_group_links.mjs                                  # P 1,2,4,8; 40 ms; 1.25 MB/s
//   node bench/bench_group_links.mjs --peers 1,4,8 --latency-ms 40 --rate-kbps 10000 --steps 40
//   node bench/bench_group_links.mjs --peers 1,2 --steps 8 --skip 2     # a quick check
//   node bench/bench_group_links.mjs --local-steps 1,4,16 --audit-rate 0 --steps 64   # local steps (docs/VERIFICATION.md)
// Every run uses --audit-rate (default 0: audits are another engineer's schedule; local steps need 0).
import { Group, SETTINGS, TIMING } from '../tests/js/run_harness.mjs';

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

const PEERS = arg('--peers', '1,2,4,8').split(',').map(Number);
const LATENCY = Number(arg('--latency-ms', '40'));            // one way: 80 ms between pages, as `home`
const RATE_KBPS = Number(arg('--rate-kbps', '10000'));         // kbit/s per directed link
const STEPS = Number(arg('--steps', '30'));
const SKIP = Number(arg('--skip', '5'));
const SETTINGS_NAME = arg('--settings', 'tiny');
const LOCAL = arg('--local-steps', '1').split(',').map(Number);
const AUDIT_RATE = Number(arg('--audit-rate', '0'));
const SIZES = {
  tiny: SETTINGS,                                                        // the run tests' (width 16, 1 layer)
  default: { width: 32, seq_len: 32, batch: 8, layers: 2, heads: 4, steps: 2000 },
};


async function bench(P, H) {
  const timing = { ...TIMING, deadlineMs: 60_000, acceptWaitMs: 60_000, goWaitMs: 60_000 };
  const g = new Group({ seed: 25, timing, dup: 0, delay: 0, latencyMs: P > 1 ? LATENCY : 0, bytesPerMs: RATE_KBPS / 8 });
  const nodes = g.add(P);
  await g.linked();
  const times = new Map();      // step -> when the leader reported it
  const lead = nodes[0];
  const onEvent = lead.onEvent.bind(lead);
  lead.onEvent = (event, payload) => { if (event === 'step') times.set(payload.step, performance.now()); onEvent(event, payload); };
  await lead.ctl.start({ ...SIZES[SETTINGS_NAME], auditRate: AUDIT_RATE, ...(H > 1 ? { local_steps: H } : {}) });
  await g.until(() => lead.completed >= STEPS, `${STEPS} steps`, 600_000);
  const run = lead.ctl.run;
  const owns = nodes.map((n) => n.ctl.run.ownMs.slice(-Math.max(1, STEPS - SKIP)));
  const meanOwn = owns.map((o) => o.reduce((a, b) => a + b, 0) / o.length);
  const speed = lead.state.speed;
  lead.ctl.stop();
  await g.ended(nodes);
  await g.close();
  const a = Math.ceil(SKIP / H) * H, b = Math.floor(STEPS / H) * H;     // whole rounds: exchange to exchange
  if (!(b > a)) throw new Error(`--steps ${STEPS} leaves no whole round of ${H} after --skip ${SKIP}`);
  const ms = (times.get(b) - times.get(a)) / (b - a);
  const serialized = meanOwn.reduce((a, b) => a + b, 0) - Math.max(...meanOwn);
  return { P, ms, own: meanOwn[0], parallel: ms - serialized, panel: speed?.ratio ?? null, topology: run.collective.topology };
}

console.log(`settings ${SETTINGS_NAME}, one-way latency ${LATENCY} ms, ${RATE_KBPS} kbit/s per link, ${STEPS} steps (skip ${SKIP})`);
console.log('| P | local steps | topology | ms/step | own compute, ms | parallel, ms/step | scaling vs alone | panel ratio (raw) |\n|---|---|---|---|---|---|---|---|');
let alone = null;
for (const P of PEERS) {
  for (const H of P === 1 ? [1] : LOCAL) {
    const r = await bench(P, H);
    if (P === 1) alone = r.ms;
    const scaling = alone === null ? '–' : `${((P * alone) / r.parallel).toFixed(2)}×`;
    console.log(`| ${P} | ${H} | ${r.topology} | ${r.ms.toFixed(1)} | ${r.own.toFixed(1)} | ${r.parallel.toFixed(1)} | ${scaling} | ${r.panel === null ? '–' : r.panel.toFixed(2)} |`);
  }
}
process.exit(0);
