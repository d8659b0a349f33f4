// Frames of a run that just ended (frontend_js/run/controller.js gradientLimit, mesh.js Stale): a
// Stop mid-exchange leaves a peer's gradient on its way (its lanes deliver what it queued before
// the STOP came). They are expected: dropped without counting as bad frames, up to that run's own
// sizes per link (staleBudget); past it they count like any bad frame. Before this rule a large
// run's late gradient (hundreds of frames) passed the mesh's MAX_BAD_FRAMES and closed the link.
// Two controllers over the in-memory transport (run_harness.mjs), frames of 2 KiB so one gradient
// is hundreds of frames, as the largest settings are in 8 KiB frames.
// The budget is shared: frames truly on their way at the Stop spend it too (under load, a whole
// step's parts), so the test waits until the sender has nothing left on its way, reads what is
// used (Mesh.staleBytes) and sends exactly the rest, then one empty frame past it.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Group, TYPES, sleep } from './run_harness.mjs';
import { MAX_BAD_FRAMES } from '../../frontend_js/mesh/mesh.js';
import { staleBudget } from '../../frontend_js/run/controller.js';
import { epochKey } from '../../frontend_js/mesh/roster.js';
import { HEADER_BYTES } from '../../frontend_js/mesh/frames.js';

const SETTINGS = { width: 64, seq_len: 16, batch: 2, layers: 3, heads: 4, steps: 2000 };
const FRAME = 2048;                // the smallest frame a link may have (frames.js)

// `from` sends `to` a message of the run that ended, as its collective would have: the ended
// run's frame run id, its slot, the step after the last, `bytes` of payload
function lateGradient(from, to, run, type, bytes) {
  return from.mesh.send(to.id, { type, slot: run.slot, runId: epochKey(run.desc.runId, run.epoch), step: run.completed,
    payload: new Uint8Array(bytes) });
}

// payload sizes of messages whose frames weigh exactly `bytes` on the wire (>= 64): full frames,
// then what is left in one frame (or two, where it is a header's size past a full frame)
function payloadsFor(bytes, frame) {
  const out = [];
  while (bytes > frame + HEADER_BYTES) { out.push(frame - HEADER_BYTES); bytes -= frame; }
  if (bytes > frame) { out.push(bytes - 2 * HEADER_BYTES); bytes = HEADER_BYTES; }
  out.push(bytes - HEADER_BYTES);
  return out;
}

// every message `node` began sending (its msgIds so far) has all its frames queued on the net:
// a message being encoded (its digest is a later task) or a streamed part still chained would
// spend the budget after the test read it. seen: msgId -> frames queued (watch, from the start).
function nothingOnItsWay(node, seen, counts) {
  for (let id = 1; id < node.mesh.msgId; id++) if ((seen.get(id) ?? 0) < (counts.get(id) ?? 1)) return false;
  return true;
}

test('a stopped run\'s late gradient frames are dropped uncounted up to the run\'s sizes; past them they count', { timeout: 120_000 }, async () => {
  const g = new Group({ seed: 5, dup: 0 });
  g.net.maxFrame = FRAME;
  const seen = new Map(), counts = new Map();      // p1's frames queued per msgId, and each message's frame count
  g.net.watch((from, to, bytes) => {
    if (from !== 'p1') return;
    const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const id = dv.getUint32(16, true);
    seen.set(id, (seen.get(id) ?? 0) + 1); counts.set(id, dv.getUint16(22, true));
  });
  const [a, b] = g.add(2);
  assert.equal(b.id, 'p1');
  try {
    await g.linked();
    await a.ctl.start(SETTINGS);
    await g.until(() => a.completed >= 2 && b.completed >= 2, 'two steps', 60_000);
    a.ctl.stop();
    const ends = await g.ended([a, b], 60_000);
    for (const e of ends) assert.equal(e.state, 'stopped', g.describe());
    for (const e of ends) assert.equal(e.error, '', `a clean stop, no alarm: ${e.message}`);
    await g.until(() => nothingOnItsWay(b, seen, counts), `p1's last sends of the run`, 60_000);
    await g.net.settle();
    const run = b.ctl.lastRun, grad = run.collective.maxPayload(TYPES.GRAD), reduced = run.collective.maxPayload(TYPES.REDUCED);
    const budget = staleBudget(a.ctl.lastRun), key = a.ctl.lastRun.desc.runId;
    const perFrame = FRAME - HEADER_BYTES;           // a frame's payload after its header
    const wire = (bytes) => bytes + HEADER_BYTES * Math.max(1, Math.ceil(bytes / perFrame));
    assert.ok(budget >= 2 * (wire(grad) + wire(reduced)), `a budget of ${budget} bytes holds two steps' GRAD and REDUCED`);
    const used = a.mesh.staleBytes(b.id, key);      // what p1 truly had on its way at the stop
    assert.ok(used <= budget - HEADER_BYTES, `${used} bytes on their way at the stop: not a frame left of the budget of ${budget}`);
    // the rest of the budget: the run's GRAD and REDUCED while they fit, then smaller messages to the byte
    const sizes = [];
    let rest = budget - used;
    for (let i = 0; ; i++) {
      const [type, bytes] = i % 2 ? [TYPES.REDUCED, reduced] : [TYPES.GRAD, grad];
      if (rest < wire(bytes) + FRAME) break;
      sizes.push([type, bytes]); rest -= wire(bytes);
    }
    for (const bytes of payloadsFor(rest, FRAME)) sizes.push([TYPES.REDUCED, bytes]);
    const frames = sizes.reduce((n, [, bytes]) => n + Math.max(1, Math.ceil(bytes / perFrame)), 0);
    assert.equal(sizes.reduce((n, [, bytes]) => n + wire(bytes), 0), budget - used, 'the late messages fill the budget exactly');
    const badBefore = a.mesh.drops.count, staleBefore = a.mesh.drops.stale;
    for (const [type, bytes] of sizes) await lateGradient(b, a, run, type, bytes);
    await g.net.settle();
    assert.equal(a.mesh.drops.count, badBefore, `late frames within the budget counted as bad (${used} bytes were on their way): ${a.mesh.drops.recent.slice(-3).join(' | ')}`);
    assert.equal(a.mesh.staleBytes(b.id, key), budget, 'the budget is spent to the byte');
    assert.ok(a.mesh.drops.stale >= staleBefore + frames, `${a.mesh.drops.stale - staleBefore} stale drops for ${frames} frames`);
    assert.ok(a.mesh.drops.stale > MAX_BAD_FRAMES, `${a.mesh.drops.stale} frames: a test of the bad-frame limit needs more than ${MAX_BAD_FRAMES}`);
    assert.ok(a.mesh.isReady(b.id) && b.mesh.isReady(a.id), 'the link stays up');
    // one byte past the budget is one frame past it: an empty frame counts as bad, with the reason
    await lateGradient(b, a, run, TYPES.GRAD, 0);
    await g.net.settle();
    assert.equal(a.mesh.drops.count, badBefore + 1, 'an empty frame past the budget counts as bad');
    assert.match(a.mesh.drops.recent.at(-1), /which ended \(over \d+ bytes of it\)/);
    // past the budget every frame is bad
    await lateGradient(b, a, run, TYPES.REDUCED, 20 * perFrame);
    await g.net.settle();
    assert.ok(a.mesh.drops.count >= badBefore + 21, `${a.mesh.drops.count - badBefore} bad frames past the budget`);
    // a frame of a run this device never had is bad at once, as before
    const stale = a.mesh.drops.stale;
    await b.mesh.send(a.id, { type: TYPES.GRAD, slot: 1, runId: (run.desc.runId + 5000) >>> 0, step: 0, payload: new Uint8Array(10) });
    await g.net.settle();
    assert.equal(a.mesh.drops.stale, stale);
    assert.match(a.mesh.drops.recent.at(-1), /not a run or epoch of this device/);
  } finally {
    await g.close();
    await sleep(5);
  }
});
