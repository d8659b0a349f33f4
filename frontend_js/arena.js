// A bump allocator for the float64 arrays of one training step, reused step after step, so a warm
// step allocates no fresh memory. Fresh typed arrays are expensive where the allocator returns
// pages to the system between uses: headless Chromium here pays ~200 us to allocate and touch
// 64 KB (node ~6 us; TEST_RESULTS "JS CPU mirror"), and a step allocates ~11 MB.
//   arena.reset()     start a step: every array handed out before is free again
//   arena.take(n)     Float64Array(n), NOT zeroed: the caller writes every element
//   arena.zeros(n)    Float64Array(n) of +0.0
// Chunks are plain ArrayBuffers (never detached), so arrays stay valid until the next reset even
// when a step outgrows the arena; reset() then merges the chunks into one of the peak size.
// A backend may place the chunks elsewhere (threads.js: in the worker pool's shared memory, so its
// kernels read and write the arrays in place): new StepArena({ chunk(n), drop(chunk) }).
const MIN_CHUNK = 1 << 16;                         // doubles (512 KB)

export class StepArena {
  constructor({ chunk = (n) => new Float64Array(n), drop = () => {} } = {}) {
    this.newChunk = chunk; this.dropChunk = drop;
    this.chunks = [];          // Float64Array each
    this.index = 0;            // the chunk being filled
    this.offset = 0;           // doubles used in it
    this.used = 0;             // doubles handed out since reset
  }

  reset() {
    if (this.chunks.length > 1) {
      const peak = Math.max(this.used, MIN_CHUNK);
      for (const c of this.chunks) this.dropChunk(c);
      this.chunks.splice(0, this.chunks.length, this.newChunk(peak));   // the same array (threads.js holds it)
    }
    this.index = 0; this.offset = 0; this.used = 0;
  }

  take(n) {
    let chunk = this.chunks[this.index];
    if (!chunk || this.offset + n > chunk.length) {
      this.index = chunk ? this.index + 1 : 0;
      chunk = this.chunks[this.index];
      if (!chunk || n > chunk.length) {
        chunk = this.newChunk(Math.max(n, MIN_CHUNK, this.used));
        this.chunks.splice(this.index, 0, chunk);
      }
      this.offset = 0;
    }
    const out = chunk.subarray(this.offset, this.offset + n);
    this.offset += n; this.used += n;
    return out;
  }

  zeros(n) { return this.take(n).fill(0); }
}

// the allocator of code that runs without an arena: fresh arrays, zeroed
export const freshF64 = { take: (n) => new Float64Array(n), zeros: (n) => new Float64Array(n) };
