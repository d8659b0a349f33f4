// Group restore without a browser (frontend_js/peer/group_state.js): real Meshes joined by MemoryNet
// (memory_links.mjs: frames shuffled, duplicated, delayed), each with a real ModelStore and
// GroupRestore. The page's Peer is replaced by the few fields they read (state, a run flag,
// notes); the browser suite (tests/test_group_restore.py) runs the real Peer.
//   1. a state loaded on one device lands on every other, bit for bit, resumable
//   2. hostile or untimely GROUP_STATE messages are refused with a reason, the receiver unchanged
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { MemoryNet } from './memory_links.mjs';
import { Mesh } from '../../frontend_js/mesh/mesh.js';
import { TYPES, encodeMessage } from '../../frontend_js/mesh/frames.js';
import { ModelStore } from '../../frontend_js/peer/model_store.js';
import { GroupRestore } from '../../frontend_js/peer/group_state.js';
import { encodeState, stateLimit, MAX_STATE_BYTES, MAX_STATE_HEADER_BYTES } from '../../frontend_js/state_codec.js';
import { makeConfig, configToDict } from '../../frontend_js/config.js';
import { initParams, paramShapes } from '../../frontend_js/model.js';
import { weightHash } from '../../frontend_js/hashing.js';
import { f64Bits, firstMismatch } from '../../frontend_js/fixtures.js';
import { quietMeshLogs } from './helpers.mjs';

quietMeshLogs();

const CFG = makeConfig({ width: 16, seq_len: 16, batch: 2, layers: 1, heads: 4, steps: 100, seed: 5 });

// the fields of a page's Peer that ModelStore and GroupRestore read; loadStates: the `hashed`
// argument of each ModelStore.loadState call (the weight hash the caller already computed, or null:
// loadState hashes the weights itself)
function device(id, mesh) {
  const peer = {
    loadStates: [],
    s: { peerId: id, name: `dev-${id}`, peers: [], notes: [], runState: 'idle' },
    runs: { busy: false },
    bus: { emit() {}, on() {} },
    set(patch) { Object.assign(this.s, patch); },
    note(text) { this.s.notes.push(text); this.s.message = text; },
    announce() {},
    nameOf(q) { return q; },
  };
  peer.models = new ModelStore(peer);
  const loadState = peer.models.loadState.bind(peer.models);
  peer.models.loadState = (state, hashed = null) => { peer.loadStates.push(hashed); return loadState(state, hashed); };
  peer.restore = new GroupRestore(peer, mesh);
  return peer;
}

async function group(ids) {
  const net = new MemoryNet({ seed: 11, maxFrame: 16 * 1024 });
  for (const id of ids) net.add(new Mesh({ selfId: id }));
  net.connectAll();
  await net.ready();
  const devs = new Map(ids.map((id) => [id, device(id, net.meshes.get(id))]));
  const roster = ids.map((id, i) => ({ id, name: `dev-${id}`, role: i === 0 ? 'host' : 'member', state: 'idle' }));
  for (const d of devs.values()) d.s.peers = roster.map((q) => ({ ...q }));
  return { net, devs };
}

// a seeded state at step 20 (Adam moments distinct from the weights, so a swap would show)
function checkpoint(seed = 5) {
  const cfg = makeConfig({ ...configToDict(CFG), seed });
  const params = initParams(cfg);
  const scaled = (k) => Object.fromEntries(Object.entries(params).map(([n, a]) => [n, a.map((x) => x * k)]));
  return { config: configToDict(cfg), step: 20, adamT: 20, params, m: scaled(0.5), v: scaled(0.25),
           weightHash: weightHash(params), extra: { data: 'builtin', data_id: 'builtin:test' } };
}

function assertSameTensors(label, got, want) {
  for (const name of Object.keys(want)) {
    const i = firstMismatch(got[name], want[name]);
    assert.equal(i, -1, `${label}['${name}']: first mismatch at index ${i}: got ${f64Bits(got[name][i])}, want ${f64Bits(want[name][i])}`);
  }
}

const snapshot = (d) => ({ step: d.models.step, hash: d.s.hash ?? null, resumable: d.models.resumable,
                           model: d.models.model });

test('the largest allowed state bound equals the server\'s MAX_STATE_BYTES', () => {
  assert.equal(MAX_STATE_BYTES, 39_838_728);         // daisy/files/state_codec.py MAX_STATE_BYTES
});

test('a full state body of some settings fits their stateLimit, with no more slack than the header bound', () => {
  const body = encodeState(paramShapes(CFG), checkpoint()).byteLength;
  const limit = stateLimit(CFG);
  assert.ok(body <= limit && limit - body < MAX_STATE_HEADER_BYTES, `body ${body} B, limit ${limit} B`);
});

test('a state loaded on one device lands on every other, bit for bit and resumable', async () => {
  const { net, devs } = await group(['a', 'b', 'c']);
  const ck = checkpoint();
  const r = await devs.get('a').models.load(ck);
  assert.equal(r.hash, ck.weightHash);
  // load() resolves before the sending is done (it goes on in the background)
  for (let t0 = Date.now(); !['b', 'c'].every((id) => devs.get(id).s.hash); await net.settle()) {
    if (Date.now() - t0 > 30_000) assert.fail(`not every device took the state: ${[...devs.values()].map((d) => d.s.notes.join('; ')).join(' | ')}`);
    await new Promise((res) => setTimeout(res, 5));
  }
  assert.match(devs.get('a').s.notes.join('\n'), /Sent the checkpoint to 2 other device\(s\)\./);
  for (const id of ['b', 'c']) {
    const d = devs.get(id);
    assert.match(d.s.message, new RegExp(`^Loaded from dev-a's file: step 20, hash ${ck.weightHash.slice(0, 16)}…$`), d.s.notes.join('\n'));
    assert.equal(d.models.step, 20);
    assert.equal(d.models.resumable, true);
    assert.deepEqual(d.models.extra, ck.extra);
    assert.equal(d.s.hash, ck.weightHash);
    assert.equal(d.s.runState, 'loaded');
    // readPeerState hashed the received weights; loadState is handed that hash, so it hashes nothing again
    assert.deepEqual(d.loadStates, [ck.weightHash], 'a group restore hashes the received weights once');
    assert.deepEqual(configToDict(d.models.model.cfg), ck.config);
    const rep = d.models.model.replicas[0];
    assert.equal(rep.adam.t, 20);
    assertSameTensors(`${id} params`, rep.params, ck.params);
    assertSameTensors(`${id} m`, rep.adam.m, ck.m);
    assertSameTensors(`${id} v`, rep.adam.v, ck.v);
    const bad = net.meshes.get(id).drops.recent.filter((line) => !line.includes('duplicate chunk'));   // the net's own dups
    assert.deepEqual(bad, []);
  }
});

test('hostile or untimely GROUP_STATE messages are refused and change nothing', async () => {
  const { net, devs } = await group(['a', 'b']);
  const b = devs.get('b'), mesh = net.meshes.get('b');
  await b.models.loadState(checkpoint(9));             // b holds a model of its own
  const before = snapshot(b);
  const shapes = paramShapes(CFG);
  const good = checkpoint(5);
  const body = (st) => new Uint8Array(encodeState(shapes, st));
  let msgId = 0x70000000;
  const send = async (payload, fields = {}) => {
    for (const f of await encodeMessage({ type: TYPES.GROUP_STATE, payload, ...fields }, msgId++, 16 * 1024)) net.inject('a', 'b', f);
    await net.settle();
  };
  const expectRefused = async (label, payload, needle, fields) => {
    const n = mesh.drops.count;
    await send(payload, fields);
    assert.ok(mesh.drops.count > n, `${label}: not dropped`);
    const said = mesh.drops.recent.slice(n - mesh.drops.count).join('\n');
    assert.ok(said.includes(needle), `${label}: no ${JSON.stringify(needle)} in:\n${said}`);
    const now = snapshot(b);
    assert.equal(now.model, before.model, `${label}: the model changed`);
    assert.deepEqual({ ...now, model: null }, { ...before, model: null }, label);
  };
  await expectRefused('wrong hash', body({ ...good, weightHash: '0'.repeat(64) }), 'weight hash mismatch');
  await expectRefused('no hash', body({ ...good, weightHash: null }), 'carries no weight hash');
  await expectRefused('garbage', new Uint8Array(4096).map((_, i) => (i * 131 + 7) & 0xff), 'bad header length');
  await expectRefused('weights only', body({ ...good, m: null, v: null }), 'no Adam moments');
  await expectRefused('bad settings', patchedWidth(body(good)), 'must be a multiple of heads');
  await expectRefused('inside a run', body(good), 'restore travels outside runs', { runId: 7 });
  // oversized: the first chunk declares more than the largest allowed state; nothing allocated
  const [first] = await encodeMessage({ type: TYPES.GROUP_STATE, payload: new Uint8Array(2048) }, msgId++, 16 * 1024);
  new DataView(first.buffer).setUint32(24, 39_838_729, true);
  let n = mesh.drops.count;
  net.inject('a', 'b', first);
  await net.settle();
  assert.match(mesh.drops.recent.slice(n - mesh.drops.count).join('\n'), /GROUP_STATE of 39838729 bytes is over its limit of 39838728/);
  // from a device that is not an admitted member (a pending one, or gone from the roster)
  b.s.peers = b.s.peers.map((q) => (q.id === 'a' ? { ...q, role: 'pending' } : q));
  await expectRefused('pending sender', body(good), 'not an admitted member');
  b.s.peers = b.s.peers.filter((q) => q.id !== 'a');
  await expectRefused('unknown sender', body(good), 'not an admitted member');
  b.s.peers = devs.get('a').s.peers.map((q) => ({ ...q }));
  // during a run (or one being set up): refused before allocation, with a note
  b.runs.busy = true;
  n = b.s.notes.length;
  await expectRefused('during a run', body(good), 'while a run is going');
  assert.match(b.s.notes.slice(n).join('\n'), /a run is going on this device/);
  b.runs.busy = false;
  // the same good state, now welcome: b holds a model, so it is an offer (so every refusal above
  // was the check's doing); b keeps its own model until its user clicks
  await send(body(good));
  assert.deepEqual(b.s.restoreOffer, { from: 'a', name: 'dev-a', step: 20, steps: 100, hash: good.weightHash }, b.s.notes.join('\n'));
  assert.match(b.s.notes.at(-1), /dev-a offers its checkpoint \(step 20, hash [0-9a-f]{16}…\): Load or Ignore/);
  assert.deepEqual(snapshot(b), before, 'an offer changes nothing');
  b.restore.decline();                                   // Ignore: nothing changes
  assert.equal(b.s.restoreOffer, null);
  assert.deepEqual(snapshot(b), before, 'declined: the model is unchanged');
  await assert.rejects(b.restore.accept(), /no checkpoint is offered/);
  await send(body(good));                                 // offered again; Load this time
  await b.restore.accept();
  assert.equal(b.s.hash, good.weightHash, b.s.notes.join('\n'));
  assert.equal(b.models.step, 20);
  assert.equal(b.s.restoreOffer, null);
});

// the state body with its config's width set to 17 (not a multiple of 4 heads), same length
function patchedWidth(u8) {
  const text = new TextDecoder().decode(u8.subarray(0, 400));
  const at = text.indexOf('"width":16');
  assert.ok(at > 0, 'no width in the header');
  const out = Uint8Array.from(u8);
  out[at + '"width":1'.length] = '7'.charCodeAt(0);
  return out;
}
