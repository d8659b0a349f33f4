// Group sizes this machine cannot host as browsers (issue 25 §3): P run controllers
// (frontend_js/run/controller.js) in one Node process over the in-memory transport
// (tests/js/memory_links.mjs) with a one-way delay and a rate on every link, each training real
// steps on the JS mirror (tests/js/run_harness.mjs). A benchmark, not a test.
//
// One process, one thread: the P controllers' compute runs one after another, so a step of the
// group costs the sum of their local steps where devices would overlap them. The bench reports
// both the raw ms/step and `parallel` = ms/step - (sum - max) of the members' own compute per step
// (run.ownMs, frontend_js/run/speed.js): the step a group of separate devices would take, if its
// exchange waits are as measured here. Per row:
//   ms/step    median step-to-step interval on the leader after --skip steps
//   own        the leader's own compute per step (local step + apply), ms
//   parallel   ms/step minus the other members' compute (above)
//   scaling    P * (one controller alone's ms/step) / parallel   (tokens/s against one device alone)
//   panel      the leader's panel ratio (speed.js), raw: it sees the serialized step
//
//   node bench/bench_group_links.mjs                                  # P 1,2,4,8; 40 ms; 1.25 MB/s
//   node bench/bench_group_links.mjs --peers 1,4,8 --latency-ms 40 --rate-kbps 10000 --steps 40
//   node bench/bench_group_links.mjs --peers 1,2 --steps 8 --skip 2     # a quick check
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
const SIZES = {
  tiny: SETTINGS,                                                        // the run tests' (width 16, 1 layer)
  default: { width: 32, seq_len: 32, batch: 8, layers: 2, heads: 4, steps: 2000 },
};

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };

async function bench(P) {
  const timing = { ...TIMING, deadlineMs: 60_000, acceptWaitMs: 60_000, goWaitMs: 60_000 };
  const g = new Group({ seed: 25, timing, dup: 0, delay: 0, latencyMs: P > 1 ? LATENCY : 0, bytesPerMs: RATE_KBPS / 8 });
  const nodes = g.add(P);
  await g.linked();
  const times = [];
  const lead = nodes[0];
  const onEvent = lead.onEvent.bind(lead);
  lead.onEvent = (event, payload) => { if (event === 'step') times.push(performance.now()); onEvent(event, payload); };
  await lead.ctl.start(SIZES[SETTINGS_NAME]);
  await g.until(() => lead.completed >= STEPS, `${STEPS} steps`, 600_000);
  const run = lead.ctl.run;
  const owns = nodes.map((n) => n.ctl.run.ownMs.slice(-Math.max(1, STEPS - SKIP)));
  const meanOwn = owns.map((o) => o.reduce((a, b) => a + b, 0) / o.length);
  const speed = lead.state.speed;
  lead.ctl.stop();
  await g.ended(nodes);
  await g.close();
  const steady = times.slice(SKIP).map((t, i, a) => (i ? t - a[i - 1] : null)).filter((x) => x !== null);
  const ms = median(steady);
  const serialized = meanOwn.reduce((a, b) => a + b, 0) - Math.max(...meanOwn);
  return { P, ms, own: meanOwn[0], parallel: ms - serialized, panel: speed?.ratio ?? null, topology: run.collective.topology };
}

console.log(`settings ${SETTINGS_NAME}, one-way latency ${LATENCY} ms, ${RATE_KBPS} kbit/s per link, ${STEPS} steps (skip ${SKIP})`);
console.log('| P | topology | ms/step | own compute, ms | parallel, ms/step | scaling vs alone | panel ratio (raw) |\n|---|---|---|---|---|---|---|');
let alone = null;
for (const P of PEERS) {
  const r = await bench(P);
  if (P === 1) alone = r.ms;
  const scaling = alone === null ? '–' : `${((P * alone) / r.parallel).toFixed(2)}×`;
  console.log(`| ${P} | ${r.topology} | ${r.ms.toFixed(1)} | ${r.own.toFixed(1)} | ${r.parallel.toFixed(1)} | ${scaling} | ${r.panel === null ? '–' : r.panel.toFixed(2)} |`);
}
process.exit(0);
