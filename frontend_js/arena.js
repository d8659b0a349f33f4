// A bump allocator for the float64 arrays of one training step, reused step after step, so a warm
// step allocates no fresh memory. Fresh typed arrays are expensive where the allocator returns
// pages to the system between uses: headless Chromium here pays ~200 us to allocate and touch
// 64 KB (node ~6 us; TEST_RESULTS "JS CPU mirror"), and a step allocates ~11 MB.
//   arena.reset()     start a step: every array handed out before is free again
//   arena.take(n)     Float64Array(n), NOT zeroed: the caller writes every element
//   arena.zeros(n)    Float64Array(n) of +0.0
//   arena.mark() / arena.rewind(mark)   every array taken after the mark is free again (the
//                     backward pass frees each layer's temporaries: model.js)
// Chunks are plain ArrayBuffers (never detached), so arrays stay valid until the next reset even
// when a step outgrows the arena. A growing arena adds a chunk of a quarter of what is handed out
// at that moment (or the array, if larger), so the first step overshoots the peak by ~25% at most
// (doubling overshot by up to 100%: TEST_RESULTS "Memory"); reset() then makes them one chunk of
// the peak, which every later step of the same shapes reuses (a single chunk is a stack: offset =
// used), and remakes a single chunk holding more than 1.5x the peak.
// A backend may place the chunks elsewhere (cpu/threads.js: in the worker pool's shared memory, so its
// kernels read and write the arrays in place): new StepArena({ chunk(n), drop(chunk) }).
const MIN_CHUNK = 1 << 16;                         // doubles (512 KB)
const MERGE_ABOVE = 1.5;                           // reset() remakes a single chunk holding more than this x the peak

export class StepArena {
  constructor({ chunk = (n) => new Float64Array(n), drop = () => {} } = {}) {
    this.newChunk = chunk; this.dropChunk = drop;
    this.chunks = [];          // Float64Array each
    this.index = 0;            // the chunk being filled
    this.offset = 0;           // doubles used in it
    this.used = 0;             // doubles held now (handed out since reset, less those rewound)
    this.peak = 0;             // the most held at once since reset
  }

  reset() {
    // one chunk of the peak from the second step on: chunks added in a step that rewinds (model.js's
    // backward) are not replayed in the same order by the next step, which then adds more (at the
    // largest settings step 2 added ~1 GB to step 1's 1.2 GB); one chunk is a stack that the same
    // step never outgrows. A single chunk far above the peak (a smaller step) is also remade. The
    // old chunks are dropped before the new one is made (cpu/threads.js's shared memory reuses them).
    if (this.chunks.length > 1 || (this.chunks.length === 1 && this.capacity > MERGE_ABOVE * Math.max(this.peak, MIN_CHUNK))) {
      const peak = Math.max(this.peak, MIN_CHUNK);
      for (const c of this.chunks) this.dropChunk(c);
      this.chunks.splice(0, this.chunks.length, this.newChunk(peak));   // the same array (cpu/threads.js holds it)
    }
    this.index = 0; this.offset = 0; this.used = 0; this.peak = 0;
  }

  take(n) {
    let chunk = this.chunks[this.index];
    if (!chunk || this.offset + n > chunk.length) {
      this.index = chunk ? this.index + 1 : 0;
      chunk = this.chunks[this.index];
      if (!chunk || n > chunk.length) {
        chunk = this.newChunk(Math.max(n, MIN_CHUNK, this.used >> 2));
        this.chunks.splice(this.index, 0, chunk);
      }
      this.offset = 0;
    }
    const out = chunk.subarray(this.offset, this.offset + n);
    this.offset += n; this.used += n;
    if (this.used > this.peak) this.peak = this.used;
    return out;
  }

  zeros(n) { return this.take(n).fill(0); }

  mark() { return { index: this.index, offset: this.offset, used: this.used }; }

  rewind({ index, offset, used }) { this.index = index; this.offset = offset; this.used = used; }

  // doubles in the arena's chunks (what it holds from the system)
  get capacity() { return this.chunks.reduce((s, c) => s + c.length, 0); }
}

// the allocator of code that runs without an arena: fresh arrays, zeroed (nothing to rewind)
export const freshF64 = { take: (n) => new Float64Array(n), zeros: (n) => new Float64Array(n), mark: () => null, rewind: () => {} };

// an allocator whose first array is `out` and the rest from `mem`: a row piece takes its result
// first and its scratch after (model.js, engines.js, cpu/threads.js), so it writes its result where
// the caller already holds it (model.js keeps what backward needs below its temporaries)
export const into = (out, mem) => {
  let given = false;
  return {
    take(n) {
      if (given) return mem.take(n);
      if (n !== out.length) throw new RangeError(`into(): the first array asked for is ${n} doubles, the one held ${out.length}`);
      given = true;
      return out;
    },
    zeros(n) { return this.take(n).fill(0); },
    mark: () => mem.mark(), rewind: (m) => mem.rewind(m),
  };
};
