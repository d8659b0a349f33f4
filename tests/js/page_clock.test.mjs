// page_clock.js: the run's waits end on the event that makes them ready, not on a poll, and a
// deadline still ends a wait for something that never comes (docs/ARCHITECTURE.md "Background tabs").
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Bus } from '../../frontend_js/peer/bus.js';
import { waitUntil, yieldToPage } from '../../frontend_js/page_clock.js';

test('waitUntil resolves on the event that makes it ready and unsubscribes', async () => {
  const bus = new Bus();
  let ready = false;
  const waiting = waitUntil(() => ready, 60_000, (wake) => bus.on('fin', wake));
  bus.emit('fin');                                   // woken, not ready yet: keeps waiting
  assert.equal(bus.listeners.get('fin').size, 1);
  ready = true;
  bus.emit('fin');
  assert.equal(await waiting, true);
  assert.equal(bus.listeners.get('fin').size, 0, 'the wake listener is removed once ready');
});

test('waitUntil is true at once when ready, false at the deadline otherwise', async () => {
  assert.equal(await waitUntil(() => true, 60_000, () => { throw new Error('no subscription needed'); }), true);
  const bus = new Bus();
  const t0 = performance.now();
  assert.equal(await waitUntil(() => false, 30, (wake) => bus.on('x', wake)), false);
  assert.ok(performance.now() - t0 >= 25, 'the deadline ended the wait early');
  assert.equal(bus.listeners.get('x').size, 0, 'the wake listener is removed at the deadline');
});

test('waitUntil listens to every subscription it is given', async () => {
  const a = new Bus(), b = new Bus();
  let ready = false;
  const waiting = waitUntil(() => ready, 60_000, (wake) => a.on('fin', wake), (wake) => b.on('run-ended', wake));
  ready = true;
  b.emit('run-ended');
  assert.equal(await waiting, true);
  assert.equal(a.listeners.get('fin').size + b.listeners.get('run-ended').size, 0);
});

test('yieldToPage lets other tasks run before it resumes', async () => {
  let ran = false;
  setTimeout(() => { ran = true; }, 0);
  const t0 = performance.now();
  while (!ran) {
    await yieldToPage();
    assert.ok(performance.now() - t0 < 5_000, 'a timer task never ran between yields');
  }
});
