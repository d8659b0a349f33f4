// Training-step timing for the H200 bench (run_all.mjs, step_profile.mjs): the default config on
// one engine, 20 steps of train20.dsyf with every step's hashes checked against the reference.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { readFixture } from '../../frontend_js/fixtures.js';
import { Group } from '../../frontend_js/train.js';
import { makeConfig } from '../../frontend_js/config.js';
import { lossAndGrads } from '../../frontend_js/model.js';
import { reduceGradients, reduceLosses } from '../../frontend_js/reduce.js';
import { bestBackend, withEngine } from '../../frontend_js/engines.js';
import { StepArena } from '../../frontend_js/arena.js';

// an INT8 engine (GPU, CPU, or a view of one) -> a backend: its GEMMs, the rest as the page's
const cpuBackend = await bestBackend();
export const onEngine = (engine) => withEngine(cpuBackend, engine);

export const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };

export function loadFixture(dir, name) {
  const b = readFileSync(join(dir, name));
  return readFixture(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength), name);
}

// What-if for train.js: the peers' lossAndGrads issued together (one arena each), so the GPU
// engine batches the two peers' calls of the same layer into one submit. Same bits as Group.
export class ConcurrentPeersGroup extends Group {
  async step() {
    const cfg = this.cfg, s = this.replicas[0].step;
    this.arenas ||= this.replicas.map(() => new StepArena());
    for (const a of this.arenas) a.reset();
    const rs = await Promise.all(this.replicas.map(async (rep, slot) => {
      const { x, y } = await this.batches.get(s, slot);
      return lossAndGrads(rep.params, cfg, x, y, cfg.batch, cfg.seq_len, this.backend, this.arenas[slot]);
    }));
    const G = reduceGradients(rs.map((r) => r.grads), this.arenas[0]);
    for (const r of this.replicas) this.backend.adamStep(r.params, G, r.adam, cfg.lr);
    return { step: s + 1, loss: reduceLosses(rs.map((r) => r.loss)), hashes: await Promise.all(this.replicas.map((r) => this.backend.weightHashAsync(r.params))) };
  }
}

// An engine view whose calls wait for each other: one submit per call (no batching).
export function oneByOne(engine, method) {
  let last = Promise.resolve();
  return { name: `${engine.name} one by one`, [method]: (...args) => (last = last.then(() => engine[method](...args), () => engine[method](...args))) };
}

// `steps` group steps of (cfg, peers, stream) on one engine -> { ms: [per group step], hashes }
export async function runSteps(cfg, peers, stream, engine, steps) {
  const g = new Group(cfg, peers, stream, onEngine(engine));
  const ms = [], hashes = [];
  for (let s = 0; s < steps; s++) {
    const t = performance.now();
    const r = await g.step();
    ms.push(performance.now() - t);
    hashes.push(r.hashes);
  }
  return { ms, hashes };
}

// fx: train20.dsyf; -> { ms: [per 2-peer step], firstBad, submits (per step, when counted) }
export async function timeSteps(fx, engine, { GroupClass = Group, steps = fx.header.meta.steps, counter = null } = {}) {
  const cfg = makeConfig(fx.header.config);
  const g = new GroupClass(cfg, fx.header.meta.peers, fx.tensors.stream.data, onEngine(engine));
  const ms = [], submits = [];
  let firstBad = null;
  for (let s = 0; s < steps; s++) {
    const c0 = counter ? counter() : 0, t = performance.now();
    const r = await g.step();
    ms.push(performance.now() - t);
    if (counter) submits.push(counter() - c0);
    const want = fx.header.meta.hashes[s];
    if (want && !firstBad && JSON.stringify(r.hashes) !== JSON.stringify(want)) firstBad = { step: s + 1, got: r.hashes, want };
  }
  return { ms, firstBad, submits };
}
