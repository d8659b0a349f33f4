// The lanes of one link (frontend_js/peer/rtc_peer.js): frames go out on several connections,
// each with a sequence number, and LaneOrder hands them on in sending order whatever the
// interleaving of the lanes; bad sequence numbers are refused with a reason, and what waits for
// a late frame is bounded. Seeded (frontend_js/prng.js); the seed is printed.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { LANES, LaneError, LaneOrder, PAGE_CONNECTIONS, SEQ_BYTES, lanesFor, withSeq } from '../../frontend_js/peer/rtc_peer.js';
import { draw, key } from '../../frontend_js/prng.js';

const SEED = Number(process.env.LANES_SEED ?? 21);

function frame(i, n) {
  const f = new Uint8Array(n);
  for (let k = 0; k < n; k++) f[k] = (i * 31 + k) & 0xff;
  return f;
}

test(`frames striped over 1..8 lanes come out in sending order (seed ${SEED})`, () => {
  const k = key(0x4c414e45, SEED);
  let n = 0;
  for (let lanes = 1; lanes <= 8; lanes++) {
    // the sender deals 500 frames to lanes at random; each lane is FIFO; the receiver takes the
    // head of a random non-empty lane each time (any interleaving the network may give)
    const queues = Array.from({ length: lanes }, () => []);
    const sent = [];
    for (let i = 0; i < 500; i++) {
      const f = frame(i, 1 + (draw(k, n++) % 300));
      sent.push(f);
      queues[draw(k, n++) % lanes].push(withSeq(i, f));
    }
    const order = new LaneOrder();
    const got = [];
    while (queues.some((q) => q.length)) {
      const live = queues.filter((q) => q.length);
      got.push(...order.accept(live[draw(k, n++) % live.length].shift()));
    }
    assert.equal(got.length, sent.length, `${lanes} lanes`);
    got.forEach((f, i) => assert.deepEqual(f, sent[i], `${lanes} lanes: frame ${i} out of order`));
    assert.equal(order.held.size, 0);
    assert.equal(order.heldBytes, 0);
  }
});

test('sequence numbers wrap at 2^32 like the sender\'s counter', () => {
  const order = new LaneOrder();
  order.next = 2 ** 32 - 2;
  assert.deepEqual(order.accept(withSeq(2 ** 32 - 1, frame(1, 4))), []);
  assert.deepEqual(order.accept(withSeq(0, frame(2, 4))), []);
  assert.deepEqual(order.accept(withSeq(2 ** 32 - 2, frame(0, 4))), [frame(0, 4), frame(1, 4), frame(2, 4)]);
  assert.equal(order.next, 1);
});

test('a repeated frame, a message with no frame and too much held are refused with a reason', () => {
  const order = new LaneOrder({ maxHeld: 1000 });
  order.accept(withSeq(0, frame(0, 10)));
  assert.throws(() => order.accept(withSeq(0, frame(0, 10))), (e) => e instanceof LaneError && /frame 0 came twice/.test(e.message));
  order.accept(withSeq(2, frame(2, 10)));
  assert.throws(() => order.accept(withSeq(2, frame(2, 10))), /frame 2 came twice \(next expected 1\)/);
  assert.throws(() => order.accept(new Uint8Array(SEQ_BYTES)), /has no frame after its sequence number/);
  assert.throws(() => order.accept(withSeq(3, frame(3, 995))), /over 1000 bytes or 8192 frames wait for frame 1/);
  // honest frames still flow after a refusal was thrown (the link closes; nothing is corrupted)
  assert.deepEqual(order.accept(withSeq(1, frame(1, 10))), [frame(1, 10), frame(2, 10)]);
  // many tiny frames far ahead: bounded by count too
  const few = new LaneOrder({ maxHeldFrames: 3 });
  for (const seq of [5, 6, 7]) few.accept(withSeq(seq, frame(seq, 1)));
  assert.throws(() => few.accept(withSeq(8, frame(8, 1))), /or 3 frames wait for frame 0/);
});

test('lanesFor: LANES per link in a small group, fewer in a large one, never past PAGE_CONNECTIONS, never none', () => {
  assert.equal(lanesFor(1), LANES);
  for (let links = 1; links <= 64; links++) {
    const k = lanesFor(links);
    assert.ok(k >= 1 && k <= LANES, `${links} links: ${k} lanes`);
    if (links * k > PAGE_CONNECTIONS) assert.equal(k, 1, `${links} links x ${k} lanes passes ${PAGE_CONNECTIONS}`);
  }
  assert.equal(lanesFor(31), Math.floor(PAGE_CONNECTIONS / 31));   // a full group of 32
});
