// The exchange codec, mirroring daisy/exchange_codec.py (read it for the rules; docs/VERIFICATION.md
// §12 has them bit for bit, docs/PROTOCOL.md the GRAD and REDUCED payloads):
//   const codec = codecFor(cfg.exchange);                      // 'f64' | 'int8'
//   codec.encode(values, {seed, step, slot, offset}) -> Uint8Array   a slot's message
//   codec.decode(bytes, n) -> Float64Array (n)                 throws CodecError if malformed
//   codec.shardBounds(N, P) -> the reduce-scatter's P + 1 cut points (int8: on block boundaries)
//   codec.block                -> 1 (f64) or 256 (int8): a message of values [lo, hi) with lo, hi
//                                 multiples of it is exactly those bytes of a longer one (streamed GRADs)
//   codec.sliceMessage(message, n, lo, hi) -> the message of values [lo, hi) of `message` (n values
//                                 from offset 0), cut on blocks (lo, and hi unless it is n, multiples
//                                 of block): its bytes, no copy
//   codec.reduce(slices in slot order, {seed, step, offset}) -> G
//     = codec.decode(codec.reduceMessage(...), n)              (the REDUCED payload decoded)
// A slot's message is a pure function of (its gradient, run seed, step, slot, offset): any peer
// can recompute it (gradient audits), churn needs no hidden per-peer state.
import { key, mix32, PURPOSE_EXCHANGE, PURPOSE_EXCHANGE_REDUCED } from './prng.js';
import { LITTLE_ENDIAN } from './host.js';

export const BLOCK = 256;            // values per int8 block (a slice's last block may be shorter)
export const SCALE_BYTES = 4;        // float32 little-endian, before the block's codes
export const MAX_SCALE = 2 ** 64;    // a scale at or above it is refused

export class CodecError extends Error {
  constructor(msg) { super(msg); this.name = 'CodecError'; }
}

// Python's repr() of a non-finite float, for the message both twins print
const nonFiniteRepr = (x) => (x !== x ? 'nan' : x > 0 ? 'inf' : '-inf');

function finiteOrRefuse(x, what) {
  for (let i = 0; i < x.length; i++) {
    if (!Number.isFinite(x[i])) throw new CodecError(`${what} value ${nonFiniteRepr(x[i])} at index ${i} is not finite`);
  }
}

function checkSlotKey(seed, step, slot) {
  for (const [name, v] of [['seed', seed], ['step', step], ['slot', slot]]) {
    if (!(Number.isInteger(v) && v >= 0 && v <= 0xffffffff)) throw new RangeError(`${name} ${v} is not a uint32`);
  }
}

// The message of values [lo, hi) of a message of n values (from offset 0) is its own bytes when
// the cut falls on blocks (lo a multiple of the block, hi too or hi = n): every value's key is its
// index from offset 0, each block's scale is its own, and values [0, lo) take messageBytes(lo)
function sliceOf(codec, message, n, lo, hi) {
  if (message.length !== codec.messageBytes(n)) throw new RangeError(`a message of ${message.length} bytes does not hold ${n} values`);
  if (!(Number.isInteger(lo) && Number.isInteger(hi) && lo >= 0 && hi >= lo && hi <= n && lo % codec.block === 0 && (hi % codec.block === 0 || hi === n))) {
    throw new RangeError(`values [${lo}, ${hi}) of ${n} are not cut on blocks of ${codec.block}`);
  }
  const at = codec.messageBytes(lo);
  return message.subarray(at, at + codec.messageBytes(hi - lo));
}

// ---- f64: today's bytes ---------------------------------------------------------------------

// the P + 1 cut points of N values into P shards: [floor(k*N/P) for k = 0..P]
export function evenBounds(N, P) {
  if (!(P >= 1 && N >= 0)) throw new RangeError(`need P >= 1 and N >= 0, got P=${P}, N=${N}`);
  const b = [];
  for (let k = 0; k <= P; k++) b.push(Math.floor((k * N) / P));
  return b;
}

// the reduce rule of reduce.js on slices in slot order: acc = g_0; acc = acc + g_s (s ascending);
// acc / P  (P = 1: g_0 / 1 = g_0, the same bits)
// (each element's sum in slot order then its division, in one pass: the same operations as the
// rule's acc array, without three passes over it; P = 2, the common group, has its own loop)
export function slotMean(slices, out = null) {
  const P = slices.length;
  if (!P) throw new RangeError('no slices to reduce');
  const n = slices[0].length, acc = out || new Float64Array(n), g0 = slices[0];
  if (P === 2) {
    const g1 = slices[1];
    for (let i = 0; i < n; i++) acc[i] = (g0[i] + g1[i]) / 2;
    return acc;
  }
  for (let i = 0; i < n; i++) {
    let a = g0[i];
    for (let s = 1; s < P; s++) a = a + slices[s][i];
    acc[i] = a / P;
  }
  return acc;
}

// any float64 travels as it is (non-finite values too: the step's loss check stops a run that
// diverged, as before the codec existed)
class F64Codec {
  get name() { return 'f64'; }

  get block() { return 1; }        // a slice's message is cut only at multiples of it (streamed GRADs)

  messageBytes(n) { return 8 * n; }

  encode(values, { seed, step, slot, offset }) {
    const out = new Uint8Array(8 * values.length);
    if (LITTLE_ENDIAN) new Float64Array(out.buffer).set(values);
    else {
      const dv = new DataView(out.buffer);
      for (let i = 0; i < values.length; i++) dv.setFloat64(8 * i, values[i], true);
    }
    return out;
  }

  decode(bytes, n) {
    if (bytes.length !== 8 * n) throw new CodecError(`f64 message of ${bytes.length} bytes, expected ${8 * n} for ${n} values`);
    let x;
    if (LITTLE_ENDIAN) {
      x = new Float64Array(n);
      new Uint8Array(x.buffer).set(bytes);
    } else {
      const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      x = Float64Array.from({ length: n }, (_, i) => dv.getFloat64(8 * i, true));
    }
    return x;
  }

  shardBounds(N, P) { return evenBounds(N, P); }

  sliceMessage(message, n, lo, hi) { return sliceOf(this, message, n, lo, hi); }

  reduceMessage(slices, { seed, step, offset }) {
    return this.encode(slotMean(slices), { seed, step, slot: 0, offset });
  }

  reduce(slices, { seed, step, offset }) { return slotMean(slices); }
}

// ---- int8: blocks, float32 scales, unbiased stochastic rounding -----------------------------

const f32 = new Float32Array(1);
const f32bits = new Uint32Array(f32.buffer);

// float64 m >= 0 -> the smallest float32 >= m
function roundUpF32(m) {
  f32[0] = m;                                      // round to nearest even
  if (f32[0] < m) f32bits[0] += 1;                 // the next float32 up (positive: bits + 1)
  return f32[0];
}

const blocksOf = (n) => Math.ceil(n / BLOCK);

// values (n), key = the stream's key -> per block a float32 scale and int8 codes, written into
// `message` (per block [float32 scale][codes int8]) and/or as the values they decode to into
// `values` (n; Int8Codec.decode's (q * s) / 127, zero where the scale is): a reduce that only needs
// the reduced values skips the message and its decode (the same bits, tests/js/exchange_codec.test.mjs)
function quantize(x, k, offset, { message = null, values = null }) {
  if (offset % BLOCK) throw new RangeError(`offset ${offset} is not a multiple of the block size ${BLOCK}`);
  finiteOrRefuse(x, 'gradient');
  const n = x.length, nb = blocksOf(n);
  const dv = message && new DataView(message.buffer, message.byteOffset, message.byteLength);
  const codes = message && new Int8Array(message.buffer, message.byteOffset, message.byteLength);
  for (let j = 0; j < nb; j++) {
    const i0 = j * BLOCK, i1 = Math.min(n, i0 + BLOCK);
    let m = 0;
    for (let i = i0; i < i1; i++) { const a = Math.abs(x[i]); if (a > m) m = a; }
    const s = roundUpF32(m);
    if (!(s < MAX_SCALE)) {
      throw new CodecError(`gradient block ${j} is out of the int8 exchange's range (max |value| must be below 2^64)`);
    }
    const at = j * (SCALE_BYTES + BLOCK);
    if (message) dv.setFloat32(at, s, true);
    if (s === 0) continue;                          // codes stay 0, and so do the values
    for (let i = i0; i < i1; i++) {
      const y = (x[i] * 127) / s;                   // |y| <= 127: |x| <= s, both ops monotone
      const f = Math.floor(y);
      const idx = offset + i;
      const u = (mix32((mix32((idx ^ k) >>> 0) + 0x632be5ab) >>> 0) >>> 8) * 2 ** -24;   // prng.uniform(k, idx)
      const q = f + (u < y - f ? 1 : 0);            // -127..127 (+0 for a -0 floor: as the Int8Array stores it)
      if (message) codes[at + SCALE_BYTES + (i - i0)] = q;
      if (values) values[i] = (q * s) / 127;
    }
  }
}

class Int8Codec {
  get name() { return 'int8'; }

  get block() { return BLOCK; }

  messageBytes(n) { return SCALE_BYTES * blocksOf(n) + n; }

  encode(values, { seed, step, slot, offset }) {
    checkSlotKey(seed, step, slot);
    const message = new Uint8Array(this.messageBytes(values.length));
    quantize(values, key(PURPOSE_EXCHANGE, seed, step, slot), offset, { message });
    return message;
  }

  decode(bytes, n) {
    const want = this.messageBytes(n), nb = blocksOf(n);
    if (bytes.length !== want) {
      throw new CodecError(`int8 message of ${bytes.length} bytes, expected ${want} for ${n} values in ${nb} blocks of ${BLOCK}`);
    }
    const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const codes = new Int8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    for (let j = 0; j < nb; j++) {
      const at = j * (SCALE_BYTES + BLOCK);
      const s = dv.getFloat32(at, true);
      const bits = dv.getUint32(at, true);
      if (bits >>> 31 || !(s < MAX_SCALE)) {
        throw new CodecError(`block ${j}: scale (float32 bits 0x${bits.toString(16).padStart(8, '0')}) is out of range (finite, non-negative, below 2^64)`);
      }
    }
    const out = new Float64Array(n);
    for (let j = 0; j < nb; j++) {
      const at = j * (SCALE_BYTES + BLOCK);
      const s = dv.getFloat32(at, true);
      const i0 = j * BLOCK, i1 = Math.min(n, i0 + BLOCK);
      for (let i = i0; i < i1; i++) {
        const q = codes[at + SCALE_BYTES + (i - i0)];
        if (q === -128 || (s === 0 && q !== 0)) {
          const why = q === -128 ? 'code -128' : 'scale 0 with a non-zero code';
          throw new CodecError(`block ${j}: ${why} at index ${i} (codes are -127..127, all 0 when the scale is 0)`);
        }
        out[i] = (q * s) / 127;
      }
    }
    return out;
  }

  // cut points on block boundaries: [min(N, BLOCK * floor(k * nb / P))], nb = ceil(N / BLOCK)
  shardBounds(N, P) { return evenBounds(blocksOf(N), P).map((b) => Math.min(N, BLOCK * b)); }

  sliceMessage(message, n, lo, hi) { return sliceOf(this, message, n, lo, hi); }

  reduceMessage(slices, { seed, step, offset }) {
    checkSlotKey(seed, step, 0);
    const message = new Uint8Array(this.messageBytes(slices[0].length));
    quantize(slotMean(slices), key(PURPOSE_EXCHANGE_REDUCED, seed, step), offset, { message });
    return message;
  }

  // = decode(reduceMessage(slices)), without the message
  reduce(slices, { seed, step, offset }) {
    checkSlotKey(seed, step, 0);
    const values = new Float64Array(slices[0].length);
    quantize(slotMean(slices), key(PURPOSE_EXCHANGE_REDUCED, seed, step), offset, { values });
    return values;
  }
}

export const CODECS = Object.freeze({ f64: new F64Codec(), int8: new Int8Codec() });

// the codec of the run setting `exchange`
export function codecFor(name) {
  if (!Object.hasOwn(CODECS, name)) {
    throw new RangeError(`unknown exchange codec ${typeof name === 'string' ? `'${name}'` : String(name)} (known: ${Object.keys(CODECS).join(', ')})`);
  }
  return CODECS[name];
}
