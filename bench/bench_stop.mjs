// The cost of a Stop now that a run's end is a barrier (docs/PROTOCOL.md "Audited gradients",
// issue 27 §1): N run controllers in one process over the in-memory transport (tests/js/
// run_harness.mjs, real tiny steps), trained to step --at and stopped by one member; the time from
// the Stop to the last page's end, audits on (the default rate 0.1: the owed audits, the FINs and
// the recomputation of every contribution since its sender's last settled pass) against audits off
// (no barrier: the Stop ends at once), medians over --reps runs, and their ratio. The pages share
// one process, so a page's recomputation delays the others: the figure is the group's total end
// work, an upper bound on one device's wait.
//   node bench/bench_stop.mjs [--reps 5] [--at 30] [--peers 2,3,4] [--json]
import { Group, SETTINGS } from '../tests/js/run_harness.mjs';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const REPS = Number(opt('--reps', 5)), AT = Number(opt('--at', 30)), JSON_OUT = argv.includes('--json');
const PEERS = String(opt('--peers', '2,3,4')).split(',').map(Number);
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };

// -> ms from the Stop to the last page's end
async function stopTime(P, auditRate, seed) {
  const g = new Group({ seed });
  const nodes = g.add(P);
  await g.linked();
  try {
    await nodes[0].ctl.start({ ...SETTINGS, auditRate });
    await g.until(() => nodes.every((n) => n.ctl.phase === 'running' && n.completed >= AT), `step ${AT}`, 120_000);
    const t0 = performance.now();
    nodes[P - 1].ctl.stop();
    await g.ended(nodes, 120_000);
    for (const n of nodes) if (n.ended.state !== 'stopped' || n.ended.error) throw new Error(`${n.id}: ${n.ended.message}`);
    return performance.now() - t0;
  } finally { await g.close(); }
}

const rows = [];
for (const P of PEERS) {
  const off = [], on = [];
  for (let r = 0; r < REPS; r++) {            // interleaved: the machine's drift falls on both alike
    off.push(await stopTime(P, 0, 100 + r));
    on.push(await stopTime(P, 0.1, 100 + r));
  }
  rows.push({ peers: P, offMs: median(off), onMs: median(on), ratio: median(on) / median(off) });
}
if (JSON_OUT) console.log(JSON.stringify({ at: AT, reps: REPS, rows }));
else for (const r of rows) console.log(`P=${r.peers}: Stop to end ${r.offMs.toFixed(0)} ms audits off, ${r.onMs.toFixed(0)} ms audits on (the barrier): ${r.ratio.toFixed(1)}x (medians of ${REPS}, stopped after step ${AT})`);
