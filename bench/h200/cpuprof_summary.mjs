// A V8 .cpuprofile (node --cpu-prof) -> the functions by self time and by total time (ms), the
// top N of each: where a thread's time goes. node bench/h200/cpuprof_summary.mjs FILE... [N]
// (one file per thread: node writes the main thread's and each worker's)
import { readFileSync } from 'node:fs';
const args = process.argv.slice(2), n = /^[0-9]+$/.test(args.at(-1)) ? args.pop() : '40';
for (const file of args) summarize(file);
function summarize(file) {
const prof = JSON.parse(readFileSync(file, 'utf8'));
const byId = new Map(prof.nodes.map((x) => [x.id, x]));
const parent = new Map();
for (const x of prof.nodes) for (const c of x.children || []) parent.set(c, x.id);
const self = new Map();                          // node id -> ms
prof.samples.forEach((id, i) => self.set(id, (self.get(id) || 0) + (prof.timeDeltas[i] || 0) / 1000));
const name = (x) => { const f = x.callFrame; return `${f.functionName || '(anon)'} ${f.url.split('/').slice(-2).join('/')}:${f.lineNumber + 1}`; };
const selfBy = new Map(), totalBy = new Map();
for (const [id, ms] of self) {
  const key = name(byId.get(id));
  selfBy.set(key, (selfBy.get(key) || 0) + ms);
  const seen = new Set();
  for (let at = id; at !== undefined; at = parent.get(at)) {
    const k2 = name(byId.get(at));
    if (!seen.has(k2)) { seen.add(k2); totalBy.set(k2, (totalBy.get(k2) || 0) + ms); }
  }
}
const top = (m) => [...m].sort((a, b) => b[1] - a[1]).slice(0, Number(n)).map(([k, v]) => `${v.toFixed(1).padStart(9)}  ${k}`).join('\n');
const all = [...self.values()].reduce((a, b) => a + b, 0);
console.log(`${file}: ${all.toFixed(0)} ms sampled\n--- self\n${top(selfBy)}\n--- total\n${top(totalBy)}`);
}
