// Frames of a run that just ended (frontend_js/run/controller.js gradientLimit, mesh.js Stale): a
// Stop mid-exchange leaves a peer's gradient on its way (its lanes deliver what it queued before
// the STOP came). They are expected: dropped without counting as bad frames, up to that run's own
// sizes per link (staleBudget); past it they count like any bad frame. Before this rule a large
// run's late gradient (hundreds of frames) passed the mesh's MAX_BAD_FRAMES and closed the link.
// Two controllers over the in-memory transport (run_harness.mjs), frames of 2 KiB so one gradient
// is hundreds of frames, as the largest settings are in 8 KiB frames.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Group, TYPES, sleep } from './run_harness.mjs';
import { MAX_BAD_FRAMES } from '../../frontend_js/mesh/mesh.js';
import { staleBudget } from '../../frontend_js/run/controller.js';
import { epochKey } from '../../frontend_js/mesh/roster.js';

const SETTINGS = { width: 64, seq_len: 16, batch: 2, layers: 3, heads: 4, steps: 2000 };
const FRAME = 2048;                // the smallest frame a link may have (frames.js)

// `from` sends `to` a message of the run that ended, as its collective would have: the ended
// run's frame run id, its slot, the step after the last, `bytes` of payload
function lateGradient(from, to, run, type, bytes) {
  return from.mesh.send(to.id, { type, slot: run.slot, runId: epochKey(run.desc.runId, run.epoch), step: run.completed,
    payload: new Uint8Array(bytes) });
}

test('a stopped run\'s late gradient frames are dropped uncounted up to the run\'s sizes; past them they count', { timeout: 120_000 }, async () => {
  const g = new Group({ seed: 5, dup: 0 });
  g.net.maxFrame = FRAME;
  const [a, b] = g.add(2);
  try {
    await g.linked();
    await a.ctl.start(SETTINGS);
    await g.until(() => a.completed >= 2 && b.completed >= 2, 'two steps', 60_000);
    a.ctl.stop();
    const ends = await g.ended([a, b], 60_000);
    for (const e of ends) assert.equal(e.state, 'stopped', g.describe());
    for (const e of ends) assert.equal(e.error, '', `a clean stop, no alarm: ${e.message}`);
    const run = b.ctl.lastRun, grad = run.collective.maxPayload(TYPES.GRAD), reduced = run.collective.maxPayload(TYPES.REDUCED);
    const budget = staleBudget(a.ctl.lastRun);
    const perFrame = FRAME - 64;                     // a frame's payload after its header
    const wire = (bytes) => bytes + 64 * Math.ceil(bytes / perFrame);
    assert.ok(budget >= 2 * (wire(grad) + wire(reduced)), `a budget of ${budget} bytes holds two steps' GRAD and REDUCED`);
    const frames = Math.ceil(grad / perFrame) * 2 + Math.ceil(reduced / perFrame) * 2;
    assert.ok(frames > MAX_BAD_FRAMES, `${frames} frames: a test of the bad-frame limit needs more than ${MAX_BAD_FRAMES}`);
    const badBefore = a.mesh.drops.count;
    // what b may have had on its way: the step's GRAD and REDUCED, and the next step's GRAD and REDUCED
    for (const [type, bytes] of [[TYPES.GRAD, grad], [TYPES.REDUCED, reduced], [TYPES.GRAD, grad], [TYPES.REDUCED, reduced]]) {
      await lateGradient(b, a, run, type, bytes);
    }
    await g.net.settle();
    assert.equal(a.mesh.drops.count, badBefore, `late frames counted as bad: ${a.mesh.drops.recent.slice(-3).join(' | ')}`);
    assert.ok(a.mesh.drops.stale >= frames - 4, `${a.mesh.drops.stale} stale drops for ${frames} frames`);
    assert.ok(a.mesh.isReady(b.id) && b.mesh.isReady(a.id), 'the link stays up');
    // past the run's sizes: counted as bad, with the reason
    const left = budget - 2 * (wire(grad) + wire(reduced));    // the budget's slack for smaller frames
    await lateGradient(b, a, run, TYPES.REDUCED, left + 20 * perFrame);
    await g.net.settle();
    assert.ok(a.mesh.drops.count >= badBefore + 20, `${a.mesh.drops.count - badBefore} bad frames past the budget`);
    assert.match(a.mesh.drops.recent.at(-1), /which ended \(over \d+ bytes of it\)/);
    // past the budget every frame is bad, an empty one too
    const bad = a.mesh.drops.count;
    await lateGradient(b, a, run, TYPES.GRAD, 0);
    await g.net.settle();
    assert.equal(a.mesh.drops.count, bad + 1, 'an empty frame past the budget counts as bad');
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
