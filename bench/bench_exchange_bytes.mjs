// Bytes per peer per step of the gradient exchange, f64 against int8 (issue 21 §2; TEST_RESULTS.md
// "Exchange codec"): real MeshCollectives (frontend_js/mesh/mesh_collective.js) over the in-memory
// transport (tests/js/memory_links.mjs, no duplicates: a real channel sends each frame once),
// P peers, the default and the largest settings' shapes, 2 steps each. Reports per peer and step:
// the payload bytes the collective sent (its bytesSent) and the bytes on the wire (payload +
// the 64-byte header of every chunk; maxFrame 256 KiB as Chromium's data channels), and the ratio
// f64 / int8. The bytes do not depend on the values (exact lengths), so the gradients are seeded
// random values of gradient-like magnitude. Then the codec's own time per step (f64 the baseline).
//   node bench/bench_exchange_bytes.mjs [--json]
import { MemoryNet } from '../tests/js/memory_links.mjs';
import { Mesh } from '../frontend_js/mesh/mesh.js';
import { TYPES } from '../frontend_js/mesh/frames.js';
import { MeshCollective } from '../frontend_js/mesh/mesh_collective.js';
import { topologyFor } from '../frontend_js/collective.js';
import { makeConfig } from '../frontend_js/config.js';
import { paramShapes } from '../frontend_js/model.js';
import { key, uniform } from '../frontend_js/prng.js';

const SETTINGS = {
  default: {},
  largest: { width: 128, seq_len: 128, batch: 2, layers: 8, heads: 8 },
};
const STEPS = 2;
const MAX_FRAME = 256 * 1024;

async function measure(settingsName, P, exchange) {
  const cfg = makeConfig({ ...SETTINGS[settingsName], exchange });
  const shapes = paramShapes(cfg);
  const net = new MemoryNet({ seed: P, maxFrame: MAX_FRAME, dup: 0, delay: 0 });
  const roster = Array.from({ length: P }, (_, s) => `p${s}`);
  for (const id of roster) net.add(new Mesh({ selfId: id }));
  net.connectAll();
  await net.ready();
  await net.settle();
  const before = new Map([...net.stats].map(([k, v]) => [k, { ...v }]));
  const cs = roster.map((id) => {
    const mesh = net.meshes.get(id);
    const c = new MeshCollective(mesh, { runId: 7, roster, selfId: id, shapes, deadlineMs: 60_000, exchange, seed: cfg.seed });
    for (const type of [TYPES.GRAD, TYPES.REDUCED]) mesh.setLimit(type, () => c.maxPayload(type));
    return c;
  });
  await Promise.all(cs.map(async (c, slot) => {
    for (let step = 0; step < STEPS; step++) {
      const k = key(0xb17e, P, step, slot);
      let i = 0;
      const grads = Object.fromEntries(shapes.map(([name, shape]) => [name,
        Float64Array.from({ length: shape.reduce((x, y) => x * y, 1) }, () => (uniform(k, i++) - 0.5) * 1e-3)]));
      await c.exchange(step, roster, slot, 1.0, grads, null);
    }
  }));
  await net.settle();
  let wire = 0;
  for (const [k, v] of net.stats) wire += v.bytes - (before.get(k)?.bytes ?? 0);
  const payload = cs.reduce((n, c) => n + c.bytesSent, 0);
  for (const c of cs) c.close();
  return { settings: settingsName, P, topology: topologyFor(P), exchange, N: cs[0].N,
    payloadPerPeerStep: payload / P / STEPS, wirePerPeerStep: wire / P / STEPS };
}

const rows = [];
for (const settingsName of Object.keys(SETTINGS)) {
  for (const P of [2, 3, 4, 5]) {
    const f = await measure(settingsName, P, 'f64');
    const q = await measure(settingsName, P, 'int8');
    rows.push({ ...f, int8: q, ratio: f.wirePerPeerStep / q.wirePerPeerStep });
  }
}
// the codec's own time per step and peer (all-gather, P = 2: encode own, decode two, reduce),
// median of 7, f64 the baseline in the same run
import { codecFor } from '../frontend_js/exchange_codec.js';
const timing = [];
for (const settingsName of Object.keys(SETTINGS)) {
  const N = paramShapes(makeConfig(SETTINGS[settingsName])).reduce((n, [, s]) => n + s.reduce((x, y) => x * y, 1), 0);
  const k = key(0xc0de, N);
  const x = Float64Array.from({ length: N }, (_, i) => (uniform(k, i) - 0.5) * 1e-3);
  const y = Float64Array.from({ length: N }, (_, i) => (uniform(k, N + i) - 0.5) * 1e-3);
  const ms = {};
  for (const name of ['f64', 'int8']) {
    const codec = codecFor(name), times = [];
    for (let r = 0; r < 7; r++) {
      const t0 = performance.now();
      const a = codec.encode(x, { seed: 1, step: r, slot: 0, offset: 0 });
      const b = codec.encode(y, { seed: 1, step: r, slot: 1, offset: 0 });
      codec.reduce([codec.decode(a, N), codec.decode(b, N)], { seed: 1, step: r, offset: 0 });
      times.push(performance.now() - t0);
    }
    ms[name] = times.sort((p, q) => p - q)[3];
  }
  timing.push({ settings: settingsName, N, f64Ms: ms.f64, int8Ms: ms.int8 });
}
if (process.argv.includes('--json')) console.log(JSON.stringify({ rows, timing }));
else {
  console.log('settings  N        P  topology   f64 B/peer/step (wire)   int8 B/peer/step (wire)   f64/int8');
  for (const r of rows) {
    console.log(`${r.settings.padEnd(9)} ${String(r.N).padEnd(8)} ${r.P}  ${r.topology.padEnd(9)}  `
      + `${String(Math.round(r.payloadPerPeerStep)).padStart(9)} (${String(Math.round(r.wirePerPeerStep)).padStart(9)})   `
      + `${String(Math.round(r.int8.payloadPerPeerStep)).padStart(9)} (${String(Math.round(r.int8.wirePerPeerStep)).padStart(9)})    ${r.ratio.toFixed(2)}`);
  }
  console.log('\ncodec time per peer and step (P = 2: two encodes, two decodes, the reduce), median of 7');
  for (const t of timing) console.log(`${t.settings.padEnd(9)} N ${t.N}: f64 ${t.f64Ms.toFixed(2)} ms, int8 ${t.int8Ms.toFixed(2)} ms`);
}
