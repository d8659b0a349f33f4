// What a stalled joiner costs the group (issue 27, property 4; frontend_js/run/join.js): the run
// controllers of tests/js/run_harness.mjs (one Node process, the in-memory transport) with the
// app's own TIMING (resync interval, ack waits: frontend_js/run/record.js). A group of 2 trains;
// a third device that never reads what it is sent asks to join, and asks again at once each time
// the leader drops its stalled sync (a liar doing its worst). The leader's steps are counted in
// windows of --window-s seconds, alternating no joiner / the stalled joiner, --reps times each;
// reported: the medians and their ratio (stalled / quiet: at least 0.9 is the property). Run it
// on a quiet machine: every page shares this one thread. The run is capped at 10,000 steps (the
// settings' bound): keep 2 x reps x window within it (at width 16 the group makes ~175 steps/s).
//   node bench/bench_stalled_joiner.mjs [--width 64] [--layers 2] [--window-s 60] [--reps 3] [--json]
import { Group, SETTINGS, TYPES } from '../tests/js/run_harness.mjs';
import { TIMING } from '../frontend_js/run/record.js';
import { median } from '../tests/js/attack_runs.mjs';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const WINDOW_MS = Number(opt('--window-s', 60)) * 1000, REPS = Number(opt('--reps', 3)), JSON_OUT = argv.includes('--json');
const settings = { ...SETTINGS, steps: 10_000, width: Number(opt('--width', SETTINGS.width)), layers: Number(opt('--layers', SETTINGS.layers)) };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const g = new Group({ seed: 7, timing: TIMING, dup: 0, delay: 0 });
const [L, P1] = g.add(2);
await g.linked();
await L.ctl.start(settings);
await g.until(() => P1.ctl.phase === 'running' && L.completed >= 5, 'the group running', 120_000);
const [J] = g.add(1, { faults: { noJoin: true } });      // linked once the group trains
await g.linked();
await g.until(() => L.mesh.isReady(J.id), 'the link to the joiner', 60_000);
J.mesh.receive = () => {};                        // from now on it never reads what it is sent
let fwd = 0, states = 0;
const send = L.mesh.send.bind(L.mesh);
L.mesh.send = (to, m) => { if (to === J.id) { if (m.type === TYPES.FWD) fwd++; if (m.type === TYPES.STATE) states++; } return send(to, m); };

// steps of the leader in one window; stalled: the joiner asks whenever it is not being synced
async function window(stalled) {
  const at = L.completed;
  const asking = stalled ? setInterval(() => {
    if (!L.ctl.run.joiners.has(J.id)) J.sendJson(L.id, TYPES.JOIN, { protocol: J.mesh.version, dataId: 'builtin:test' });
  }, 100) : null;
  await sleep(WINDOW_MS);
  clearInterval(asking);
  return L.completed - at;
}

const quiet = [], stalled = [];
for (let r = 0; r < REPS; r++) {
  quiet.push(await window(false));
  stalled.push(await window(true));
}
L.ctl.stop();
await g.ended([L, P1], 120_000);
await g.close();
const row = { settings: { width: settings.width, layers: settings.layers }, windowS: WINDOW_MS / 1000, quiet, stalled,
  ratio: median(stalled) / median(quiet), states, forwarded: fwd };
if (JSON_OUT) console.log(JSON.stringify(row));
else {
  console.log('| width | layers | window s | steps, no joiner (median) | steps, stalled joiner (median) | ratio | states / forwarded steps sent to it |');
  console.log('|---|---|---|---|---|---|---|');
  console.log(`| ${row.settings.width} | ${row.settings.layers} | ${row.windowS} | ${median(quiet)} | ${median(stalled)} | ${row.ratio.toFixed(3)} | ${states} / ${fwd} |`);
}
process.exit(0);
