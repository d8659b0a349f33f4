// The mesh's bounds against a member that sends valid but useless frames (issue 19, "Bounded work
// per peer"; docs/PROTOCOL.md "Mesh limits"): Mesh instances (frontend_js/mesh/mesh.js) over the
// in-memory transport (memory_links.mjs), the hostile side's frames injected raw. Each test
// measures what the receiver holds (its Reassembler's heldBytes) and when it cuts the sender off.
//   1. 20,000 valid HELLOs: every one after the first is a bad frame; the sender is cut off
//   2. 20,000 never-finished 64 KiB messages: each abandoned one is a bad frame; memory = bytes received
//   3. 450 GROUP_STATE first chunks claiming 39.8 MB each: nothing reserved for what a header claims
//   4. the per-link byte budget of unfinished messages; honest interleaved messages still complete
//   5. the time bound: an unfinished message that stalls is abandoned, its bytes given back
//   6. 20,000 one-byte frames of a run that just ended (a Stale limit): each costs its header too,
//      so the uncounted allowance ends after budget / 65 frames and the rest count as bad
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { MemoryNet } from './memory_links.mjs';
import { BAD_WINDOW_MS, MAX_BAD_FRAMES, Mesh, Stale } from '../../frontend_js/mesh/mesh.js';
import { FrameError, HEADER_BYTES, MAGIC, MAX_FRAME_BYTES, MAX_JSON_BYTES, MAX_PENDING, PARTIAL_TIMEOUT_MS, PROTOCOL_VERSION,
  Reassembler, TYPES, encodeMessage, jsonPayload } from '../../frontend_js/mesh/frames.js';
import { jsSha } from '../../frontend_js/hashing.js';
import { quietMeshLogs } from './helpers.mjs';

// the mesh logs every drop with console.info; the tests read mesh.drops instead
quietMeshLogs();

// an honest mesh 'a' linked to an honest 'b' and to 'h', whose frames the test injects;
// clocks: {id: clock} for meshes that run on a test's clock. The floods below give 'a' a clock that
// stands still (manualClock, never advanced): their exact counts need every bad frame inside one
// BAD_WINDOW_MS, which on the system clock holds only while the machine is fast enough
async function meshes(clocks = {}) {
  const net = new MemoryNet({ seed: 19, dup: 0, delay: 0 });
  const [a, b, h] = ['a', 'b', 'h'].map((id) => net.add(new Mesh({ selfId: id, sha: jsSha, ...(clocks[id] ? { clock: clocks[id] } : {}) })));
  net.connectAll();
  await net.ready();
  return { net, a, b, h };
}

// chunk `index` (the first by default) of a message whose header claims `length` bytes in chunks
// of `per` payload bytes; its digest is junk (nothing checks it before the last chunk)
function chunkOf({ type, msgId, length, per, index = 0 }) {
  const frame = new Uint8Array(HEADER_BYTES + per);
  const dv = new DataView(frame.buffer);
  dv.setUint32(0, MAGIC, true);
  dv.setUint8(4, PROTOCOL_VERSION); dv.setUint8(5, type); dv.setUint16(6, 0xffff, true);
  dv.setUint32(16, msgId, true); dv.setUint16(20, index, true);
  dv.setUint16(22, Math.ceil(length / per), true); dv.setUint32(24, length, true); dv.setUint32(28, index * per, true);
  frame.fill(0x5a, 32, 64);
  return frame;
}

// inject `count` frames made by make(i) from 'h' into 'a', one at a time, until a cuts h off ->
// {sent, peak: the most a's reassembler for h held}
async function flood(net, a, count, make) {
  const reasm = a.links.get('h').reasm;
  let sent = 0, peak = 0;
  while (sent < count && a.links.has('h')) {
    net.inject('h', 'a', await make(sent++));
    await a.links.get('h')?.chain;
    peak = Math.max(peak, reasm.heldBytes);
  }
  return { sent, peak };
}

test('20,000 valid HELLOs: each after the first is a bad frame, the sender is cut off, the other link is untouched', async () => {
  const { net, a, b } = await meshes({ a: manualClock() });
  const hello = jsonPayload({ protocol: PROTOCOL_VERSION, peerId: 'h' });
  const n0 = a.drops.count;
  const { sent } = await flood(net, a, 20_000, async (i) => (await encodeMessage({ type: TYPES.HELLO, payload: hello }, 0x60000000 + i, 64 * 1024))[0]);
  assert.ok(!a.links.has('h'), `after ${sent} repeated HELLOs h is still linked`);
  assert.equal(sent, MAX_BAD_FRAMES + 1, `cut off after ${sent} HELLOs, not ${MAX_BAD_FRAMES + 1} (${MAX_BAD_FRAMES} within ${BAD_WINDOW_MS} ms)`);
  assert.equal(a.drops.count - n0, MAX_BAD_FRAMES + 1);
  assert.match(a.drops.recent.at(-1), /repeated HELLO/);
  assert.ok(a.isReady('b') && b.isReady('a'), 'the honest link went down with the hostile one');
});

test('20,000 never-finished 64 KiB messages: each abandoned one is a bad frame; held bytes are bytes received', async () => {
  const { net, a } = await meshes({ a: manualClock() });
  const per = 16 * 1024;
  const { sent, peak } = await flood(net, a, 20_000, (i) => chunkOf({ type: TYPES.STATUS, msgId: 0x61000000 + i, length: MAX_JSON_BYTES, per }));
  assert.ok(!a.links.has('h'), `after ${sent} unfinished messages h is still linked`);
  // the first MAX_PENDING wait; each one after abandons the oldest: a bad frame each
  assert.equal(sent, MAX_PENDING + MAX_BAD_FRAMES + 1);
  assert.match(a.drops.recent.at(-1), /abandoned unfinished \(16384 of 65536 bytes\)/);
  assert.equal(peak, MAX_PENDING * per, `held ${peak} bytes: not the ${MAX_PENDING} × ${per} received`);
  console.log(`# never-finished 64 KiB messages: cut off after ${sent}; the reassembler held at most ${peak} bytes `
    + `(claimed: ${MAX_PENDING} × ${MAX_JSON_BYTES} = ${MAX_PENDING * MAX_JSON_BYTES})`);
});

test('450 GROUP_STATE first chunks claiming 39.8 MB each: only the chunks received are held', async () => {
  const { net, a } = await meshes({ a: manualClock() });
  const claimed = 39_838_728, per = MAX_FRAME_BYTES - HEADER_BYTES;
  a.setLimit(TYPES.GROUP_STATE, claimed);                 // an idle page accepts a group restore that large
  const { sent, peak } = await flood(net, a, 450, (i) => chunkOf({ type: TYPES.GROUP_STATE, msgId: 0x62000000 + i, length: claimed, per }));
  assert.equal(sent, MAX_PENDING + MAX_BAD_FRAMES + 1, `cut off after ${sent} first chunks`);
  assert.ok(!a.links.has('h'));
  assert.equal(peak, MAX_PENDING * per);
  console.log(`# GROUP_STATE first chunks: the reassembler held at most ${(peak / 2 ** 20).toFixed(1)} MiB; reserving what the `
    + `headers claimed would hold ${(MAX_PENDING * claimed / 2 ** 20).toFixed(0)} MiB`);
});

test('the byte budget of unfinished messages: the oldest make room (each reported), a message alone over it is dropped; honest interleaved messages complete', async () => {
  const per = 1024, maxFrame = per + HEADER_BYTES;
  const abandoned = [];
  const re = new Reassembler({ limitFor: () => 1 << 20, maxPartialBytes: 6 * per, onAbandon: (h, why) => abandoned.push([h.msgId, why]) });
  const big = (id, chunks) => encodeMessage({ type: TYPES.STATE, payload: new Uint8Array(chunks * per).fill(id) }, id, maxFrame);
  const [m1, m2, m3] = [await big(1, 4), await big(2, 4), await big(3, 7)];
  // two honest messages, chunks interleaved: 3 + 2 chunks held, then m1 completes (6 held for a moment)
  for (const c of [m1[0], m2[0], m1[1], m1[2], m2[1]]) assert.equal(await re.accept(c), null);
  assert.equal(re.heldBytes, 5 * per);
  const one = await re.accept(m1[3]);
  assert.ok(one && one.message.payload.every((x) => x === 1) && one.message.payload.length === 4 * per);
  assert.equal(re.heldBytes, 2 * per);
  // m2 stops (a transfer cut short); a retry m3 needs room: m2, the oldest, is abandoned for it
  for (const c of m3.slice(0, 6)) assert.equal(await re.accept(c), null);
  assert.deepEqual(abandoned.map(([id]) => id), [2]);
  assert.match(abandoned[0][1], /message 2 abandoned unfinished \(2048 of 4096 bytes\): unfinished messages would hold over 6144 bytes/);
  assert.equal(re.heldBytes, 6 * per);
  // m3 alone passes the budget with its seventh chunk: it is dropped, its bytes given back
  await assert.rejects(re.accept(m3[6]), (err) => err instanceof FrameError && /message 3 \(STATE\): unfinished messages would hold over 6144 bytes/.test(err.message));
  assert.equal(re.heldBytes, 0);
  await assert.rejects(re.accept(m2[2]), /duplicate chunk of message 2/);      // m2 was dropped for good
});

// a clock the test moves: now() and after(ms, fn) as Mesh's SYSTEM_CLOCK, the timers fired by advance()
function manualClock() {
  let t = 0;
  const timers = new Set();
  return {
    now: () => t,
    after(ms, fn) { const x = { at: t + ms, fn }; timers.add(x); return () => timers.delete(x); },
    advance(ms) {
      t += ms;
      for (const x of [...timers].sort((p, q) => p.at - q.at)) if (x.at <= t) { timers.delete(x); x.fn(); }
    },
    pending: () => timers.size,
  };
}

test('an unfinished message with no new chunk for PARTIAL_TIMEOUT_MS is abandoned: a bad frame, its bytes given back (injected clock)', async () => {
  const clock = manualClock();
  const { net, a } = await meshes({ a: clock });
  const per = 16 * 1024, length = 4 * per;
  const entry = a.links.get('h');
  const send = async (msgId, index) => { net.inject('h', 'a', chunkOf({ type: TYPES.STATUS, msgId, length, per, index })); await entry.chain; };
  const n0 = a.drops.count;
  await send(0x63000001, 0);                 // t = 0: message 1 starts, and message 2
  await send(0x63000002, 0);
  assert.equal(entry.reasm.heldBytes, 2 * per);
  clock.advance(PARTIAL_TIMEOUT_MS / 2);     // message 1 goes on; message 2 stalls
  await send(0x63000001, 1);
  clock.advance(PARTIAL_TIMEOUT_MS / 2 - 1);
  await entry.chain;
  assert.equal(a.drops.count, n0, 'abandoned before its time');
  clock.advance(1);                          // message 2: no chunk for PARTIAL_TIMEOUT_MS
  await entry.chain;
  assert.equal(a.drops.count - n0, 1);
  assert.match(a.drops.recent.at(-1), new RegExp(`from h: message ${0x63000002} abandoned unfinished \\(16384 of 65536 bytes\\): no chunk for ${PARTIAL_TIMEOUT_MS / 1000} s`));
  assert.equal(entry.reasm.heldBytes, 2 * per, 'message 1 (a chunk within the bound) is kept');
  clock.advance(PARTIAL_TIMEOUT_MS / 2);     // message 1: no chunk since its second
  await entry.chain;
  assert.equal(a.drops.count - n0, 2);
  assert.equal(entry.reasm.heldBytes, 0, 'the stalled messages still hold bytes');
  assert.equal(entry.expiry, null, 'a deadline is left with nothing unfinished');
  assert.equal(clock.pending(), 0);
  await send(0x63000001, 2);                 // a late chunk of an abandoned message is refused, holds nothing
  assert.match(a.drops.recent.at(-1), new RegExp(`duplicate chunk of message ${0x63000001}`));
  assert.equal(entry.reasm.heldBytes, 0);
  assert.ok(a.links.has('h') && a.isReady('b'), 'three bad frames closed a link');
});

test('20,000 one-byte frames of a run that just ended: each costs its header too, so the uncounted allowance is budget / 65 frames, then they count', async () => {
  const { net, a, b } = await meshes({ a: manualClock() });
  const budget = 100 * (HEADER_BYTES + 1);
  a.setLimit(TYPES.GRAD, () => new Stale('a gradient frame of run 7, which ended', 7, budget));
  const n0 = a.drops.count;
  const { sent } = await flood(net, a, 20_000, (i) => chunkOf({ type: TYPES.GRAD, msgId: 0x62000000 + i, length: 1, per: 1 }));
  assert.ok(!a.links.has('h'), `after ${sent} late one-byte frames h is still linked`);
  assert.equal(a.drops.stale, 100, `${a.drops.stale} frames dropped uncounted for a budget of ${budget} bytes`);
  assert.equal(sent, 100 + MAX_BAD_FRAMES + 1);
  assert.equal(a.drops.count - n0, MAX_BAD_FRAMES + 1);
  assert.match(a.drops.recent.at(-1), /which ended \(over 6500 bytes of it\)/);
  assert.ok(a.isReady('b') && b.isReady('a'), 'the honest link went down with the hostile one');
});
