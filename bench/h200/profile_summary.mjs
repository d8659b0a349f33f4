// Summarizes the .cpuprofile files of a directory (node --cpu-prof): total sampled time, and the
// functions with the most self time (name, file:line, ms, %), biggest first.
//   node bench/h200/profile_summary.mjs DIR [top=30]
import { readdirSync, readFileSync } from 'node:fs';
import { join, basename } from 'node:path';

const dir = process.argv[2], top = Number(process.argv[3] || 30);
for (const f of readdirSync(dir).filter((n) => n.endsWith('.cpuprofile'))) {
  const p = JSON.parse(readFileSync(join(dir, f), 'utf8'));
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const self = new Map();                  // node id -> microseconds
  for (let i = 0; i < p.samples.length; i++) self.set(p.samples[i], (self.get(p.samples[i]) || 0) + (p.timeDeltas[i] || 0));
  const byFn = new Map();
  let total = 0;
  for (const [id, us] of self) {
    const cf = byId.get(id).callFrame;
    const k = `${cf.functionName || '(anonymous)'} ${cf.url ? `${basename(cf.url)}:${cf.lineNumber + 1}` : ''}`.trim();
    byFn.set(k, (byFn.get(k) || 0) + us); total += us;
  }
  console.log(`${f}: ${(total / 1000).toFixed(0)} ms sampled`);
  for (const [k, us] of [...byFn].sort((a, b) => b[1] - a[1]).slice(0, top)) {
    console.log(`${(us / 1000).toFixed(1).padStart(9)} ms ${(100 * us / total).toFixed(1).padStart(5)}%  ${k}`);
  }
}
