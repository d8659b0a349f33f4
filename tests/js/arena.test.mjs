// The step arena (frontend_js/arena.js): arrays held at once never overlap; mark/rewind frees what
// was taken after the mark and nothing before it; growth overshoots the peak by about a quarter;
// reset() makes the chunks one of the peak, and warm steps then take the same memory with no new
// chunk, also for a pattern of marks and rewinds whose chunks a second step would not replay;
// into() hands out the caller's array first, the rest from mem.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { StepArena, freshF64, into } from '../../frontend_js/arena.js';

// an array's place: [which chunk, byte offset, length]
const where = (arena, a) => [arena.chunks.findIndex((c) => c.buffer === a.buffer), a.byteOffset, a.length];
const overlaps = (a, b) => a.buffer === b.buffer && a.byteOffset < b.byteOffset + 8 * b.length && b.byteOffset < a.byteOffset + 8 * a.length;

// one "step": kept arrays, then per layer a mark, temporaries, a rewind (as model.js's backward)
function step(arena, sizes) {
  const kept = [], temps = [];
  for (const [keep, tmp] of sizes) {
    kept.push(arena.take(keep));
    const m = arena.mark();
    for (const n of tmp) temps.push(arena.take(n));
    arena.rewind(m);
  }
  return { kept, temps };
}
const SIZES = [[70_000, [300_000, 5, 120_000]], [1, [90_000]], [200_000, [400_000, 7]]];

test('held arrays never overlap; a rewind frees only what came after its mark', () => {
  const arena = new StepArena();
  const { kept } = step(arena, SIZES);
  for (let i = 0; i < kept.length; i++) for (let j = i + 1; j < kept.length; j++) assert.ok(!overlaps(kept[i], kept[j]), `kept ${i} and ${j} overlap`);
  const a = arena.take(10);
  const m = arena.mark();
  const b = arena.take(1000);
  arena.rewind(m);
  const c = arena.take(1000);
  assert.deepEqual(where(arena, c), where(arena, b), 'the rewound array is not handed out again');
  assert.ok(!overlaps(a, c));
  for (const k of kept) assert.ok(!overlaps(k, c), 'an array from before the mark was handed out again');
});

test('warm steps take the same memory with no new chunk, and the peak counts rewinds', () => {
  const arena = new StepArena();
  step(arena, SIZES);
  const peak = arena.peak;
  // the most held at once: all kept arrays of layers so far + one layer's temporaries
  let held = 0, most = 0;
  for (const [keep, tmp] of SIZES) { held += keep; most = Math.max(most, held + tmp.reduce((x, y) => x + y, 0)); }
  assert.equal(peak, most);
  assert.ok(arena.capacity <= 1.5 * peak, `capacity ${arena.capacity} for peak ${peak}`);
  arena.reset();
  assert.deepEqual(arena.chunks.map((c) => c.length), [peak], 'the first reset makes one chunk of the peak');
  const chunks = arena.chunks.slice();
  const places = [];
  for (let s = 0; s < 2; s++) {
    const { kept, temps } = step(arena, SIZES);
    assert.deepEqual(arena.chunks, chunks, `warm step ${s + 2} changed the chunks`);
    places.push([...kept, ...temps].map((a) => where(arena, a)));
    arena.reset();
    assert.deepEqual(arena.chunks, chunks, `the reset after warm step ${s + 2} remade the chunk`);
  }
  assert.deepEqual(places[1], places[0], 'two warm steps placed their arrays differently');
});

// model.js's pattern: the forward pass keeps arrays; the backward pass, per layer, keeps a gradient,
// marks, takes temporaries, rewinds. With chunks added mid-step a second step did not replay the
// first's placements and added chunks (at the largest settings ~1 GB more than step 1's 1.2 GB, and
// cpu/threads.js ran out of its 2 GiB). 50 seeded shapes (the old rule grew on 4 of them).
function backwardLike(seed) {
  let x = seed;
  const rnd = (n) => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return 1 + ((x >>> 8) % n); };
  const ops = [];
  for (let l = 0; l < 6; l++) ops.push(['take', rnd(400_000)]);
  for (let l = 0; l < 6; l++) {
    ops.push(['take', rnd(200_000)], ['mark']);
    for (let k = rnd(4); k > 0; k--) ops.push(['take', rnd(800_000)]);
    ops.push(['rewind']);
  }
  return ops;
}
function replay(arena, ops) {
  const marks = [];
  for (const [op, n] of ops) { if (op === 'take') arena.take(n); else if (op === 'mark') marks.push(arena.mark()); else arena.rewind(marks.pop()); }
}

test('a backward-like step of marks and rewinds never grows the arena after the first reset', () => {
  for (let seed = 1; seed <= 50; seed++) {
    const arena = new StepArena(), ops = backwardLike(seed);
    replay(arena, ops);
    arena.reset();
    const chunks = arena.chunks.slice();
    for (let s = 0; s < 3; s++) {
      replay(arena, ops);
      assert.deepEqual(arena.chunks, chunks, `shape seed ${seed}: warm step ${s + 2} added a chunk (capacity ${arena.capacity})`);
      arena.reset();
    }
  }
});

test('growth adds a quarter of what is held; reset makes one chunk of the peak, and remakes one far above it', () => {
  const arena = new StepArena();
  for (let i = 0; i < 400; i++) arena.take(10_000);             // 4M doubles in small arrays
  assert.ok(arena.capacity <= 1.3 * arena.peak + (1 << 16), `capacity ${arena.capacity} for peak ${arena.peak}`);
  assert.ok(arena.chunks.length > 1);
  const peak = arena.peak;
  arena.reset();
  assert.deepEqual(arena.chunks.map((c) => c.length), [peak]);
  for (let i = 0; i < 300; i++) arena.take(10_000);             // a smaller step, within 1.5x
  arena.reset();
  assert.deepEqual(arena.chunks.map((c) => c.length), [peak], 'remade a chunk within 1.5x of the peak');
  arena.take(1000);                                              // a much smaller step
  arena.reset();
  assert.equal(arena.chunks.length, 1, 'kept chunks holding 1000x the peak');
  assert.equal(arena.capacity, 1 << 16);
});

test('into() gives the held array first, the rest from mem, and refuses a wrong size', () => {
  const arena = new StepArena(), out = new Float64Array(12);
  const mem = into(out, arena);
  assert.equal(mem.take(12), out);
  const scratch = mem.take(12);
  assert.notEqual(scratch, out);
  assert.equal(scratch.buffer, arena.chunks[0].buffer);
  assert.throws(() => into(out, arena).take(11), /into\(\): the first array asked for is 11 doubles, the one held 12/);
  assert.equal(freshF64.mark(), null);
});
