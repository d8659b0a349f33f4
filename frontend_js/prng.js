// Counter-based PRNG, mirroring daisy/prng.py: a pure function of (key, counter), 32-bit ops only.
//   mix32(x)         = lowbias32: x ^= x>>16; x *= 0x7feb352d; x ^= x>>15; x *= 0x846ca68b; x ^= x>>16
//   key(w0, w1, ...) = h = 0; for w: h = mix32(h ^ mix32(w + 0x9e3779b9)); return h
//   draw(key, i)     = mix32(mix32(i ^ key) + 0x632be5ab)            (all mod 2^32)
//   uniform(key, i)  = (draw(key, i) >> 8) * 2^-24                   in [0, 1), exact in float64
// Math.imul wraps mod 2^32 like numpy's uint32 multiply; >>> 0 reads the result as uint32.

export const GOLDEN = 0x9e3779b9;
export const PURPOSE_INIT = 1;
export const PURPOSE_DATA = 2;
export const PURPOSE_SAMPLE = 3;
export const PURPOSE_EXCHANGE = 4;            // a slot's int8 exchange message (exchange_codec.js)
export const PURPOSE_EXCHANGE_REDUCED = 5;    // the re-quantized reduced gradient G

export function mix32(x) {
  x = x >>> 0;
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

// Fold uint32 words (purpose, seed, step, ...) into one stream key. w + GOLDEN < 2^33 is exact.
export function key(...words) {
  let h = 0;
  for (const w of words) h = mix32(h ^ mix32((w + GOLDEN) >>> 0));
  return h;
}

// The i-th uint32 of stream k (0 <= i < 2^32).
export function draw(k, i) {
  return mix32((mix32((i ^ k) >>> 0) + 0x632be5ab) >>> 0);
}

export function uniform(k, i) {
  return (draw(k, i) >>> 8) * 2 ** -24;
}
