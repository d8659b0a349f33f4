// Memory of one peer's training at a config, per CPU backend (node; the same code a page runs):
// the step arena's peak (the most it holds at once) and capacity (what its chunks hold from the
// system), and the process's resident set / ArrayBuffer bytes at their highest over the steps.
//   node bench/bench_memory.mjs [--config largest] [--steps 3] [--backends wasm-simd,threads2,workers2]
// Each backend runs in a child process of its own, so one's high-water marks are not another's.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { makeConfig } from '../frontend_js/config.js';
import { Group } from '../frontend_js/train.js';
import { bestBackend } from '../frontend_js/engines.js';
import { createThreadedBackend } from '../frontend_js/cpu/threads.js';
import { createUnitWorkersBackend } from '../frontend_js/cpu/unit_workers.js';
import { loadStream } from '../frontend_js/cli.mjs';
import { CONFIGS } from './profile_cpu_step.mjs';

const argv = process.argv.slice(2);
const opt = (name, d) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : d; };
const config = opt('--config', 'largest'), steps = Number(opt('--steps', 3));
const MB = 2 ** 20;
const MAKERS = {
  'wasm-simd': () => bestBackend(),
  threads2: () => createThreadedBackend({ threads: 2 }),
  workers2: () => createUnitWorkersBackend({ threads: 2 }),
};

async function one(name) {
  const be = await MAKERS[name]();
  const g = new Group(makeConfig(CONFIGS[config]), 1, loadStream(null), be);
  let rss = 0, ab = 0, peak = 0, capacity = 0, hash;
  for (let s = 0; s < steps; s++) {
    hash = (await g.step()).hashes[0];
    peak = Math.max(peak, 8 * (g.arena.peak ?? g.arena.used));   // (an arena without rewinds: used)
    capacity = Math.max(capacity, 8 * g.arena.chunks.reduce((n, c) => n + c.length, 0));
    const m = process.memoryUsage();
    rss = Math.max(rss, m.rss); ab = Math.max(ab, m.arrayBuffers);
  }
  be.close?.();
  return { name, arenaPeakMB: peak / MB, arenaCapacityMB: capacity / MB, rssMB: rss / MB, arrayBuffersMB: ab / MB, hash };
}

if (argv.includes('--child')) {
  console.log(JSON.stringify(await one(opt('--child'))));
} else {
  const rows = [];
  for (const name of opt('--backends', 'wasm-simd,threads2,workers2').split(',')) {
    const r = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--child', name, '--config', config, '--steps', String(steps)], { encoding: 'utf8' });
    if (r.status) throw new Error(`${name}: ${r.stderr.slice(-2000)}`);
    rows.push(JSON.parse(r.stdout.trim().split('\n').pop()));
  }
  if (new Set(rows.map((r) => r.hash)).size !== 1) throw new Error(`backends ended on different hashes: ${rows.map((r) => r.hash).join(' ')}`);
  console.log(`config ${config}, ${steps} steps, one peer; MB = 2^20 bytes`);
  console.log('| backend | arena peak | arena capacity | resident set (max) | ArrayBuffers (max) |');
  console.log('|---|---|---|---|---|');
  for (const r of rows) console.log(`| ${r.name} | ${r.arenaPeakMB.toFixed(0)} | ${r.arenaCapacityMB.toFixed(0)} | ${r.rssMB.toFixed(0)} | ${r.arrayBuffersMB.toFixed(0)} |`);
}
