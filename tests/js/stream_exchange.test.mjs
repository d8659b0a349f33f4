// The streamed GRAD (issue 21 §3, docs/PROTOCOL.md "Streamed GRAD"): a page sends the parts of its
// GRAD as the backward pass finalizes the gradient (MeshCollective.beginStep -> the sink of
// Trainer.localStep), the receiver puts the same payload bytes back together. Over the in-memory
// transport (memory_links.mjs: frames shuffled, duplicated, delayed from a seeded PRNG):
//   1. the part schedule tiles each GRAD payload exactly, cuts on the codec's blocks
//   2. streamed training = Group (train.js) at every step, f64 and int8, both topologies, every
//      reassembled GRAD byte-identical to the unstreamed one; a run mixing streamed and whole GRADs
//   3. a local step recomputed with the same sink sends nothing twice; bad parts are dropped with a reason
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { MemoryNet } from './memory_links.mjs';
import { Mesh } from '../../frontend_js/mesh/mesh.js';
import { TYPES, encodeMessage } from '../../frontend_js/mesh/frames.js';
import { flattenGrads } from '../../frontend_js/collective.js';
import { codecFor, CODECS } from '../../frontend_js/exchange_codec.js';
import { MeshCollective, MIN_PART_BYTES, PART_INDEX_BYTES, gradParts, streamCuts } from '../../frontend_js/mesh/mesh_collective.js';
import { quietMeshLogs, stream32, exchangeAndApply } from './helpers.mjs';
import { f64Bits } from '../../frontend_js/fixtures.js';
import { configToDict, makeConfig } from '../../frontend_js/config.js';
import { initParams, paramShapes } from '../../frontend_js/model.js';
import { adamInit } from '../../frontend_js/optim.js';
import { weightHash } from '../../frontend_js/hashing.js';
import { StepArena } from '../../frontend_js/arena.js';
import { StreamBatches } from '../../frontend_js/batch_source.js';
import { Group, Replica, Trainer, cloneParams } from '../../frontend_js/train.js';
import { loadStream } from '../../frontend_js/cli.mjs';

const RUN_ID = 0x5a17;
const HEADER = 40;
quietMeshLogs();

const firstDiff = (a, b) => {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
};

// ---- 1. the part schedule ------------------------------------------------------------------------

test('parts: every GRAD payload tiled exactly (tail first, header last), cuts on blocks; random sizes, P, both codecs', () => {
  const seed = 2101;
  const r = stream32(seed);
  for (let trial = 0; trial < 200; trial++) {
    const T = 1 + (r() % 12);
    const sizes = Array.from({ length: T }, () => 1 + (r() % (r() % 2 ? 4000 : 40000)));
    const N = sizes.reduce((a, b) => a + b, 0);
    for (const codec of Object.values(CODECS)) {
      const minPart = trial % 2 ? MIN_PART_BYTES : 1 + (r() % 2000);
      const cuts = streamCuts(sizes, codec, minPart);
      assert.equal(cuts[0], N); assert.equal(cuts.at(-1), 0);
      for (let i = 1; i < cuts.length; i++) {
        assert.ok(cuts[i] < cuts[i - 1] && cuts[i] % codec.block === 0, `seed ${seed} trial ${trial}: cuts ${cuts}`);
        if (i < cuts.length - 1) assert.ok(codec.messageBytes(cuts[i - 1] - cuts[i]) >= minPart, `seed ${seed} trial ${trial}: a part under the minimum`);
      }
      const P = 1 + (r() % 6);
      const bounds = codec.shardBounds(N, P);
      for (let k = 0; k < P; k++) {
        const lo = bounds[k], hi = bounds[k + 1];
        const parts = gradParts(cuts, lo, hi, codec);
        const total = HEADER + codec.messageBytes(hi - lo);
        // send order: descending values; bytes tile [0, total) exactly, the header in the last part
        let end = total;
        for (const p of parts) {
          assert.equal(p.to, end, `seed ${seed} trial ${trial} ${codec.name} P=${P} k=${k}: parts ${JSON.stringify(parts)}`);
          end = p.from;
          assert.ok(p.vlo >= lo && p.vhi <= hi && (p.vhi - p.vlo) >= 0);
          assert.ok((p.vlo - lo) % codec.block === 0 && (p.vlo % codec.block === 0));
        }
        assert.equal(end, 0, `seed ${seed} trial ${trial}: the parts do not start at byte 0`);
      }
    }
  }
});

// ---- 2. streamed training = Group ------------------------------------------------------------------

let corpus = null;
const builtinStream = () => (corpus ||= loadStream(null));
const SMALL = makeConfig({ width: 16, seq_len: 16, batch: 2, layers: 2, heads: 4, steps: 100 });
const SMALL_PART = 256;         // the tiny model's GRADs in several parts (a run's default: MIN_PART_BYTES)

// P pages training `steps` steps over the memory net; streams(slot) says whether that page streams.
// Every GRAD payload a receiver assembles from parts is kept (received) to compare with the whole one.
// encodes(slot): that page's trainer hands over its gradient's message (the resident step's way: it
// feeds no sink, the message comes with the gradient; here encoded by `encodeOwn`).
async function trainOverMesh({ P, exchange, topology = null, steps, seed, maxFrame, streams, recompute = null, encodes = () => false, encodeOwn = null }) {
  const cfg = makeConfig({ ...configToDict(SMALL), exchange });
  const stream = builtinStream();
  const net = new MemoryNet({ seed, maxFrame, dup: 0.03, delay: 0.25 });
  const roster = Array.from({ length: P }, (_, s) => `peer-${s}`);
  for (const id of roster) net.add(new Mesh({ selfId: id }));
  net.connectAll();
  await net.ready();
  const params = initParams(cfg);
  const batches = new StreamBatches(stream, cfg);
  const got = roster.map(() => []);
  const sent = roster.map(() => []);              // [slot][step] -> {grads flat, loss, prevHash}
  const assembled = [];                           // {to, from slot, step, payload}
  const cs = [];
  await Promise.all(roster.map(async (id, slot) => {
    const mesh = net.meshes.get(id);
    const c = new MeshCollective(mesh, { runId: RUN_ID, roster, selfId: id, shapes: paramShapes(cfg), deadlineMs: 5000,
      exchange: cfg.exchange, seed: cfg.seed, topology, minPartBytes: SMALL_PART });
    cs[slot] = c;
    for (const type of [TYPES.GRAD, TYPES.GRAD_PART, TYPES.REDUCED]) mesh.setLimit(type, () => c.maxPayload(type));
    const onGrad = c.onGrad.bind(c);
    c.onGrad = (from, m, payload, what) => {         // observe what the receiver decodes
      if (m.type === TYPES.GRAD_PART) assembled.push({ to: slot, from: m.slot, step: m.step, payload: Uint8Array.from(payload) });
      onGrad(from, m, payload, what);
    };
    const trainer = new Trainer(cfg, new Replica(cloneParams(params), adamInit(params)), batches);
    const arena = new StepArena();
    let hash = weightHash(params);
    for (let s = 0; s < steps; s++) {
      arena.reset();
      const sink = streams(slot) ? c.beginStep(s) : null;
      let local = await trainer.localStep(s, slot, arena, encodes(slot) ? null : sink);
      if (encodes(slot)) local = { ...local, encoded: encodeOwn(flattenGrads(local.grads, c.names), { seed: cfg.seed, step: s, slot, offset: 0 }) };
      if (recompute && recompute(slot, s)) {
        await Promise.all(sink.chains.values());      // the first pass's parts are out
        const bytes0 = c.bytesSent;
        arena.reset();
        local = await trainer.localStep(s, slot, arena, c.beginStep(s));
        assert.equal(c.bytesSent, bytes0, `${id} step ${s}: the recomputed local step sent parts again`);
      }
      if (sink && !encodes(slot)) {
        // before exchange is called, every part but the header's went out during the backward pass
        for (const sl of sink.slices) assert.equal(sl.next, sl.parts.length - 1, `${id} step ${s}: parts posted before exchange`);
      }
      sent[slot][s] = { flat: flattenGrads(local.grads, c.names), loss: local.loss, prevHash: hash };
      const done = await exchangeAndApply(c, trainer, { id, s, roster, slot, local, hash });
      hash = done.hash;
      got[slot].push(done);
    }
    c.close();
  }));
  return { cfg, net, roster, got, sent, assembled, cs };
}

function checkAgainstGroup(cfg, P, steps, got, label) {
  return (async () => {
    const group = new Group(cfg, P, builtinStream());
    for (let i = 0; i < steps; i++) {
      const w = await group.step();
      for (let slot = 0; slot < P; slot++) {
        const g = got[slot][i];
        assert.equal(g.step, w.step);
        assert.equal(f64Bits(g.loss), f64Bits(w.loss), `${label}: step ${w.step} slot ${slot}: loss ${g.loss} vs Group ${w.loss}`);
        assert.equal(g.hash, w.hashes[slot], `${label}: step ${w.step} slot ${slot}: hash differs from Group's`);
      }
    }
  })();
}

// the whole (unstreamed) GRAD payload the sender of slot s sends to slot `to` at `step`
function wholePayload(run, c, s, to, step) {
  const { flat, loss, prevHash } = run.sent[s][step];
  const k = c.topology === 'allgather' ? 0 : to;
  const lo = c.bounds[k], hi = c.bounds[k + 1];
  const message = codecFor(run.cfg.exchange).encode(flat.subarray(lo, hi), { seed: run.cfg.seed, step, slot: s, offset: lo });
  return c.gradPayload(prevHash, loss, message);
}

// [P, exchange, topology, maxFrame, streams]
for (const [P, exchange, topology, maxFrame, streams] of [
  [2, 'f64', null, 4096, 'all'], [2, 'int8', null, 1200, 'all'], [4, 'f64', null, 64 * 1024, 'all'],
  [4, 'int8', null, 4096, 'all'], [3, 'int8', 'rsag', 4096, 'some']]) {
  const label = `${P} peers (${topology || (P >= 4 ? 'rsag' : 'allgather')}), ${exchange}, ${streams === 'all' ? 'every page streams' : 'slots 0 and 2 stream, slot 1 sends whole GRADs'}`;
  test(`streamed training: ${label}, 4 steps, shuffled/delayed frames: hashes equal Group at every step, GRADs byte-identical`, async () => {
    const steps = 4;
    const streamsOf = streams === 'all' ? () => true : (slot) => slot !== 1;
    const run = await trainOverMesh({ P, exchange, topology, steps, seed: 90 + P, maxFrame, streams: streamsOf });
    await checkAgainstGroup(run.cfg, P, steps, run.got, label);
    assert.ok(run.net.reordered > 0, 'the net did not reorder frames');
    // every GRAD that came in parts is the unstreamed GRAD, byte for byte
    const streamedSenders = [...Array(P).keys()].filter(streamsOf);
    assert.equal(run.assembled.length, steps * streamedSenders.length * (P - 1), 'GRADs assembled from parts');
    for (const a of run.assembled) {
      const want = wholePayload(run, run.cs[a.from], a.from, a.to, a.step);
      const i = firstDiff(a.payload, want);
      assert.equal(i, -1, `${label}: step ${a.step} GRAD ${a.from} -> ${a.to}: first differing byte ${i} (${a.payload[i]} vs ${want[i]})`);
    }
    const parts = Math.max(...run.cs.map((c) => c.inParts.length));
    assert.ok(parts >= 3, `the GRADs here have at most ${parts} parts: too few to show streaming`);
  });
}

// A page whose trainer made its gradient's message (the resident step encodes it on the GPU) sends
// that message's bytes, cut to its shards and parts, and encodes none of its own: whether it
// streams (a sink no one feeds) or sends whole GRADs; the run equals Group, every GRAD is the
// unstreamed one byte for byte.
for (const [P, topology] of [[3, 'rsag'], [2, null]]) {
  test(`a trainer's own message (the resident step's): ${P} peers ${topology || 'allgather'}, int8; none re-encoded, hashes equal Group`, async () => {
    const steps = 3, codec = CODECS.int8, realEncode = codec.encode;
    const ownEncodes = new Map([[0, 0], [1, 0]]);          // encode calls of the message pages, in their exchange
    codec.encode = function (values, opts) {
      if (ownEncodes.has(opts.slot)) ownEncodes.set(opts.slot, ownEncodes.get(opts.slot) + 1);
      return realEncode.call(this, values, opts);
    };
    let run;
    try {
      run = await trainOverMesh({ P, exchange: 'int8', topology, steps, seed: 71 + P, maxFrame: 4096,
        streams: (slot) => slot !== 1, encodes: (slot) => slot <= 1, encodeOwn: (flat, opts) => realEncode.call(codec, flat, opts) });
    } finally {
      codec.encode = realEncode;
    }
    assert.deepEqual([...ownEncodes.values()], [0, 0], 'a page with its own message encoded its GRAD again');
    await checkAgainstGroup(run.cfg, P, steps, run.got, `own messages, ${P} peers`);
    for (const a of run.assembled) {
      const want = wholePayload(run, run.cs[a.from], a.from, a.to, a.step);
      assert.equal(firstDiff(a.payload, want), -1, `step ${a.step} GRAD ${a.from} -> ${a.to}`);
    }
    assert.ok(run.assembled.some((a) => a.from === 0), 'slot 0 (a sink, its message) sent no parts');
  });
}

test('a message cut on block boundaries is the message of those values (sliceMessage), both codecs; misuse refused', () => {
  const seed = 4242;
  console.log(`seed ${seed}`);
  let s = seed;
  const rnd = () => { s = (Math.imul(s, 1103515245) + 12345) >>> 0; return s / 2 ** 32 - 0.5; };
  for (const codec of Object.values(CODECS)) {
    for (const N of [1, 255, 256, 257, 1000, 4096 + 17]) {
      const x = Float64Array.from({ length: N }, rnd), opts = { seed: 7, step: 3, slot: 2 };
      const whole = codec.encode(x, { ...opts, offset: 0 });
      for (let lo = 0; lo < N; lo += 256) {
        for (const hi of [Math.min(N, lo + 256), N, Math.min(N, lo + 512)]) {
          const want = codec.encode(x.subarray(lo, hi), { ...opts, offset: lo });
          assert.equal(firstDiff(codec.sliceMessage(whole, N, lo, hi), want), -1, `${codec.name} N=${N} [${lo}, ${hi})`);
        }
      }
    }
    const m600 = codec.encode(new Float64Array(600), { seed: 1, step: 1, slot: 0, offset: 0 });
    assert.throws(() => codec.sliceMessage(m600, 600, 512, 700), /not cut on blocks/);
    assert.throws(() => codec.sliceMessage(m600, 601, 0, 256), /does not hold 601 values/);
  }
  // a cut inside a block: that block's scale is the whole block's, not the cut's
  const m = CODECS.int8.encode(new Float64Array(1000).fill(1), { seed: 1, step: 1, slot: 0, offset: 0 });
  for (const [lo, hi] of [[100, 256], [0, 300], [256, 700]]) assert.throws(() => CODECS.int8.sliceMessage(m, 1000, lo, hi), /not cut on blocks of 256/);
});

// ---- 3. recompute, bad parts ---------------------------------------------------------------------

test('a local step recomputed with the same sink (a GPU fault\'s redo) sends no part twice; hashes equal Group', async () => {
  const steps = 3;
  const run = await trainOverMesh({ P: 2, exchange: 'int8', steps, seed: 97, maxFrame: 4096, streams: () => true,
    recompute: (slot, s) => slot === 0 && s === 1 });
  await checkAgainstGroup(run.cfg, 2, steps, run.got, 'recomputed');
  // the transport's own duplicates are dropped by the mesh ("duplicate chunk"); nothing else is
  for (const mesh of run.net.meshes.values()) {
    const other = mesh.drops.recent.filter((line) => !/duplicate chunk of message/.test(line));
    assert.deepEqual(other, [], 'drops other than the transport\'s duplicates');
  }
});

test('bad GRAD_PART frames are dropped with a reason: an index past the parts, a wrong length, no index, a part twice', async () => {
  const cfg = makeConfig({ ...configToDict(SMALL), exchange: 'int8' });
  const net = new MemoryNet({ seed: 98, maxFrame: 4096, dup: 0, delay: 0 });
  const roster = ['a', 'b'];
  for (const id of roster) net.add(new Mesh({ selfId: id }));
  net.connectAll();
  await net.ready();
  const shapes = paramShapes(cfg);
  const cs = roster.map((id) => {
    const c = new MeshCollective(net.meshes.get(id), { runId: RUN_ID, roster, selfId: id, shapes, exchange: 'int8', seed: cfg.seed, deadlineMs: 3000, minPartBytes: SMALL_PART });
    for (const type of [TYPES.GRAD, TYPES.GRAD_PART, TYPES.REDUCED]) net.meshes.get(id).setLimit(type, () => c.maxPayload(type));
    return c;
  });
  const b = net.meshes.get('b'), c = cs[1];
  let msgId = 0x7100_0000;
  const inject = async (payload, step = 0) => {
    for (const f of await encodeMessage({ type: TYPES.GRAD_PART, slot: 0, runId: RUN_ID, step, payload }, msgId++, 4096)) net.inject('a', 'b', f);
    await net.settle();
  };
  const partFrame = (index, len) => {
    const f = new Uint8Array(len);
    new DataView(f.buffer).setUint32(0, index, true);
    return f;
  };
  const cases = [
    [partFrame(c.inParts.length, 8), /GRAD_PART index \d+, a GRAD here has \d+ parts/],
    [partFrame(0, PART_INDEX_BYTES + (c.inParts[0].to - c.inParts[0].from) + 1), /GRAD_PART 0 of \d+ bytes, expected \d+/],
    [new Uint8Array(2), /shorter than its index/],
  ];
  for (const [payload, why] of cases) {
    const n0 = b.drops.count;
    await inject(payload);
    assert.equal(b.drops.count, n0 + 1, `${why}: ${b.drops.recent.at(-1)}`);
    assert.match(b.drops.recent.at(-1), why);
  }
  // a good part (zero codes, a valid message) then the same index again
  const p0 = c.inParts[0];
  const good = partFrame(0, PART_INDEX_BYTES + p0.to - p0.from);
  await inject(good);
  const n0 = b.drops.count;
  await inject(good);
  assert.equal(b.drops.count, n0 + 1);
  assert.match(b.drops.recent.at(-1), /second GRAD_PART 0 from slot 0/);
  // a part of a step not in flight
  const n1 = b.drops.count;
  await inject(good, 5);
  assert.equal(b.drops.count, n1 + 1);
  assert.match(b.drops.recent.at(-1), /step 5 is not in flight/);
  for (const col of cs) col.close();
});

test('a closed or failed collective\'s sink posts no part (a departure or the run\'s end mid-backward)', async () => {
  const cfg = makeConfig({ ...configToDict(SMALL), exchange: 'f64' });
  const net = new MemoryNet({ seed: 99, maxFrame: 4096, dup: 0, delay: 0 });
  const roster = ['a', 'b'];
  for (const id of roster) net.add(new Mesh({ selfId: id }));
  net.connectAll();
  await net.ready();
  const shapes = paramShapes(cfg);
  const grads = shapes.map(([name, s]) => [name, new Float64Array(s.reduce((x, y) => x * y, 1)).fill(0.5)]);
  for (const end of ['close', 'fail']) {
    const c = new MeshCollective(net.meshes.get('a'), { runId: RUN_ID, roster, selfId: 'a', shapes, exchange: 'f64', deadlineMs: 1000, minPartBytes: SMALL_PART });
    const sink = c.beginStep(0);
    const [first, ...rest] = grads.slice().reverse();
    await sink.grad(...first);                      // head.weight: its part goes
    await Promise.all(sink.chains.values());
    const sent = c.bytesSent;
    assert.ok(sent > 0, 'the first part was not sent');
    if (end === 'close') c.close(); else c.fail(new Error('a departure'));
    for (const [name, g] of rest) await sink.grad(name, g);
    await Promise.all(sink.chains.values());
    assert.equal(c.bytesSent, sent, `${end}: parts posted after the collective ended`);
    c.close();
  }
});
