// The step arena (frontend_js/arena.js): arrays held at once never overlap; mark/rewind frees what
// was taken after the mark and nothing before it; a warm step takes the same memory again with no
// new chunk; growth overshoots the peak by about a quarter, and reset() merges only an arena that
// holds far more than its peak; into() hands out the caller's array first, the rest from mem.
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
  const chunks = arena.chunks.slice();
  const places = [];
  for (let s = 0; s < 2; s++) {
    arena.reset();
    const { kept, temps } = step(arena, SIZES);
    assert.deepEqual(arena.chunks, chunks, `warm step ${s + 2} changed the chunks`);
    places.push([...kept, ...temps].map((a) => where(arena, a)));
  }
  assert.deepEqual(places[1], places[0], 'two warm steps placed their arrays differently');
});

test('growth adds a quarter of what is held; reset merges only above 1.5x the peak', () => {
  const arena = new StepArena();
  for (let i = 0; i < 400; i++) arena.take(10_000);             // 4M doubles in small arrays
  assert.ok(arena.capacity <= 1.3 * arena.peak + (1 << 16), `capacity ${arena.capacity} for peak ${arena.peak}`);
  const n = arena.chunks.length;
  arena.reset();
  assert.equal(arena.chunks.length, n, 'merged an arena that holds about its peak');
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
