// The streamed GRAD against the whole one (issue 21 §3; TEST_RESULTS.md "Streamed exchange"):
// exchange wait per step with and without streaming, P pages, each page a worker thread of its
// own (its own event loop, as a tab) with real Meshes and MeshCollectives
// (frontend_js/mesh/mesh_collective.js), the one-thread CPU backend (engines.js bestBackend), the
// built-in corpus, real training steps. Links are emulated per direction: a sender-side queue at
// `rate` (bytes leave one after another at the uplink's rate, as an SCTP association's send
// buffer drains) and a one-way `delay`; the receiver delivers each frame to its mesh at
// the computed arrival time (or when its thread is next free). The frames' digests are the page's
// (WebCrypto, asynchronous). Modes alternate step by step in the same run (even steps whole, odd
// steps streamed; both pages agree), so both see the same load: medians over the measured steps.
// Per page and step: compute = Trainer.localStep (forward + backward; streamed: with the parts'
// encoding, posting and the sink's event-loop turns), exchange = the exchange() call after it
// (sending what is left, waiting, reducing), step = both.
//   node bench/bench_stream_exchange.mjs [--steps 16] [--only default|largest] [--exchange f64|int8] [--profile lan|home] [--json]
import { Worker, isMainThread, parentPort, workerData, MessageChannel } from 'node:worker_threads';
import { fileURLToPath } from 'node:url';

const PROFILES = {
  lan: { rateMbit: 1000, delayMs: 0.5 },        // issue 21 §1 profiles (uplink rate, half the RTT)
  home: { rateMbit: 20, delayMs: 20 },
};
const SETTINGS = {
  default: {},
  largest: { width: 128, seq_len: 128, layers: 8, heads: 8 },
};
const MAX_FRAME = 256 * 1024;       // Chromium's data channel maxMessageSize
const RUN_ID = 0x51;

const nowAbs = () => performance.timeOrigin + performance.now();

// ---- one page (a worker) --------------------------------------------------------------------
async function page({ slot, roster, settings, exchange, steps, profile, ports }) {
  const { Mesh } = await import('../frontend_js/mesh/mesh.js');
  const { TYPES } = await import('../frontend_js/mesh/frames.js');
  const { MeshCollective } = await import('../frontend_js/mesh/mesh_collective.js');
  const { makeConfig } = await import('../frontend_js/config.js');
  const { initParams, paramShapes } = await import('../frontend_js/model.js');
  const { adamInit } = await import('../frontend_js/optim.js');
  const { bestBackend } = await import('../frontend_js/engines.js');
  const { StreamBatches } = await import('../frontend_js/batch_source.js');
  const { Replica, Trainer } = await import('../frontend_js/train.js');
  const { loadStream } = await import('../frontend_js/cli.mjs');

  const cfg = makeConfig({ ...settings, exchange });
  const selfId = roster[slot];
  const backend = await bestBackend();
  const params = initParams(cfg);
  const trainer = new Trainer(cfg, new Replica(params, adamInit(params)), new StreamBatches(loadStream(null), cfg), backend);
  // the collective and its limits first: the other page may send as soon as the links are up
  const mesh = new Mesh({ selfId });
  const c = new MeshCollective(mesh, { runId: RUN_ID, roster, selfId, shapes: paramShapes(cfg), deadlineMs: 30_000,
    exchange, seed: cfg.seed });
  for (const type of [TYPES.GRAD, TYPES.GRAD_PART, TYPES.REDUCED]) mesh.setLimit(type, () => c.maxPayload(type));
  const bytesPerMs = (profile.rateMbit * 1e6) / 8 / 1000;
  for (const [peer, port] of Object.entries(ports)) {
    let busyUntil = 0;                            // when this uplink has sent everything queued
    const link = {
      maxFrame: MAX_FRAME,
      async send(bytes) {
        const start = Math.max(nowAbs(), busyUntil);
        busyUntil = start + bytes.length / bytesPerMs;
        port.postMessage({ bytes: Uint8Array.from(bytes), at: busyUntil + profile.delayMs });
      },
      close() {},
    };
    port.on('message', ({ bytes, at }) => {
      setTimeout(() => mesh.receive(peer, bytes), Math.max(0, at - nowAbs()));
    });
    mesh.addLink(peer, link);
  }
  while (!roster.every((id) => id === selfId || mesh.isReady(id))) await new Promise((r) => setTimeout(r, 5));
  const arena = backend.newArena();
  let hash = null;
  const rows = [];
  for (let s = 0; s < steps; s++) {
    const streamed = s % 2 === 1;
    arena.reset();
    const t0 = performance.now();
    const local = await trainer.localStep(s, slot, arena, streamed ? c.beginStep(s) : null);
    const t1 = performance.now();
    const w0 = c.waitMs;
    const out = await c.exchange(s, roster, slot, local.loss, local.grads, hash);
    const t2 = performance.now();
    if (!out.hashes.every((h) => h === hash)) throw new Error(`step ${s}: the pages' hashes differ`);
    hash = (await trainer.apply(out.grads)).hash;
    rows.push({ step: s, streamed, compute: t1 - t0, exchange: t2 - t1, wait: c.waitMs - w0, total: t2 - t0 });
  }
  return { rows, hash, bytes: c.bytesSent };
}

if (!isMainThread) {
  page(workerData).then((r) => parentPort.postMessage({ ok: r }), (err) => parentPort.postMessage({ err: err.stack || String(err) }));
}

// ---- the driver -----------------------------------------------------------------------------
const median = (xs) => { const a = xs.slice().sort((x, y) => x - y); const n = a.length; return n % 2 ? a[n >> 1] : (a[n / 2 - 1] + a[n / 2]) / 2; };

async function measure(settingsName, exchange, profileName, P, steps) {
  const roster = Array.from({ length: P }, (_, s) => `page-${s}`);
  const ports = roster.map(() => ({}));
  for (let i = 0; i < P; i++) for (let j = i + 1; j < P; j++) {
    const ch = new MessageChannel();
    ports[i][roster[j]] = ch.port1; ports[j][roster[i]] = ch.port2;
  }
  const results = await Promise.all(roster.map((_, slot) => new Promise((resolve, reject) => {
    const w = new Worker(fileURLToPath(import.meta.url), {
      workerData: { slot, roster, settings: SETTINGS[settingsName], exchange, steps, profile: PROFILES[profileName], ports: ports[slot] },
      transferList: Object.values(ports[slot]),
    });
    w.once('message', (m) => { w.terminate(); if (m.err) reject(new Error(m.err)); else resolve(m.ok); });
    w.once('error', reject);
  })));
  if (!results.every((r) => r.hash === results[0].hash)) throw new Error('the pages ended with different weights');
  const summary = {};
  for (const mode of ['whole', 'streamed']) {
    // step 0 and 1 are warm-up (the first of each mode); every page's steps pooled
    const rows = results.flatMap((r) => r.rows.filter((x) => x.step >= 2 && x.streamed === (mode === 'streamed')));
    summary[mode] = Object.fromEntries(['compute', 'exchange', 'wait', 'total'].map((k) => [k, median(rows.map((x) => x[k]))]));
    summary[mode].n = rows.length;
  }
  return { settings: settingsName, exchange, profile: profileName, P, ...summary };
}

if (isMainThread) {
  const args = process.argv.slice(2);
  const opt = (name, dflt) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : dflt; };
  const steps = Number(opt('--steps', 10));
  const only = opt('--only', null), onlyExchange = opt('--exchange', null), onlyProfile = opt('--profile', null);
  const json = args.includes('--json');
  const cases = [];
  for (const settingsName of Object.keys(SETTINGS)) {
    if (only && only !== settingsName) continue;
    for (const exchange of ['f64', 'int8']) {
      if (onlyExchange && onlyExchange !== exchange) continue;
      for (const profileName of Object.keys(PROFILES)) if (!onlyProfile || onlyProfile === profileName) cases.push([settingsName, exchange, profileName]);
    }
  }
  const fmt = (x) => x.toFixed(1).padStart(8);
  if (!json) console.log('settings | exchange | profile | mode     | compute ms | exchange ms | wait ms | step ms | steps');
  for (const [settingsName, exchange, profileName] of cases) {
    const r = await measure(settingsName, exchange, profileName, 2, steps);
    if (json) { console.log(JSON.stringify(r)); continue; }
    for (const mode of ['whole', 'streamed']) {
      const m = r[mode];
      console.log(`${settingsName.padEnd(8)} | ${exchange.padEnd(8)} | ${profileName.padEnd(7)} | ${mode.padEnd(8)} | ${fmt(m.compute)}   | ${fmt(m.exchange)}    | ${fmt(m.wait)} | ${fmt(m.total)} | ${m.n}`);
    }
    console.log(`${''.padEnd(8)} | ${''.padEnd(8)} | ${''.padEnd(7)} | ratio    | exchange streamed/whole ${(r.streamed.exchange / r.whole.exchange).toFixed(2)}, step ${(r.streamed.total / r.whole.total).toFixed(2)}`);
  }
}
