// The canonical weight hash, mirroring daisy/hashing.py: SHA-256 over every parameter in
// paramShapes order, as the little-endian bytes of its float64 values, row-major; hex digest.
// Plain synchronous JS (crypto.subtle is async and missing on file:// pages).

const K256 = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

// One SHA-256 block: state h (Int32Array 8) updated from the 16 big-endian words at dv[off..off+64).
function compressBlock(h, w, dv, off) {
  for (let i = 0; i < 16; i++) w[i] = dv.getInt32(off + 4 * i);
  for (let i = 16; i < 64; i++) {
    const x = w[i - 15], y = w[i - 2];
    const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
    const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
    w[i] = (((w[i - 16] + s0) | 0) + ((w[i - 7] + s1) | 0)) | 0;
  }
  let a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (let i = 0; i < 64; i++) {
    const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
    const ch = (e & f) ^ (~e & g);
    const t1 = (((hh + S1) | 0) + ((ch + K256[i]) | 0) + w[i]) | 0;
    const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
    const maj = (a & b) ^ (a & c) ^ (b & c);
    const t2 = (S0 + maj) | 0;
    hh = g; g = f; f = e; e = (d + t1) | 0;
    d = c; c = b; b = a; a = (t1 + t2) | 0;
  }
  h[0] = (h[0] + a) | 0; h[1] = (h[1] + b) | 0; h[2] = (h[2] + c) | 0; h[3] = (h[3] + d) | 0;
  h[4] = (h[4] + e) | 0; h[5] = (h[5] + f) | 0; h[6] = (h[6] + g) | 0; h[7] = (h[7] + hh) | 0;
}

// Incremental SHA-256 (FIPS 180-4): update(Uint8Array) any number of times, then hexdigest().
export class Sha256 {
  constructor() {
    this.h = new Int32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
    this.buf = new Uint8Array(64);
    this.bufView = new DataView(this.buf.buffer);
    this.bufLen = 0;
    this.total = 0;                 // bytes hashed so far (exact below 2^53)
    this.w = new Int32Array(64);
  }

  // the 64-byte blocks of dv from byte off to off + 64*blocks; words read big-endian by DataView
  // (no per-byte work). One block per call keeps the hot function small and its feedback complete.
  compress(dv, off, blocks = 1) {
    for (let blk = 0; blk < blocks; blk++) compressBlock(this.h, this.w, dv, off + 64 * blk);
  }

  update(bytes) {
    let i = 0;
    const n = bytes.length;
    this.total += n;
    if (this.bufLen) {
      while (i < n && this.bufLen < 64) this.buf[this.bufLen++] = bytes[i++];
      if (this.bufLen < 64) return this;
      this.compress(this.bufView, 0);
      this.bufLen = 0;
    }
    const blocks = Math.floor((n - i) / 64);
    if (blocks) {
      this.compress(new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength), i, blocks);
      i += 64 * blocks;
    }
    while (i < n) this.buf[this.bufLen++] = bytes[i++];
    return this;
  }

  digest() {
    const bits = this.total * 8;
    const pad = new Uint8Array(((this.bufLen < 56 ? 56 : 120) - this.bufLen) + 8);
    pad[0] = 0x80;
    const hi = Math.floor(bits / 2 ** 32), lo = bits >>> 0;
    const L = pad.length;
    pad[L - 8] = hi >>> 24; pad[L - 7] = hi >>> 16; pad[L - 6] = hi >>> 8; pad[L - 5] = hi;
    pad[L - 4] = lo >>> 24; pad[L - 3] = lo >>> 16; pad[L - 2] = lo >>> 8; pad[L - 1] = lo;
    this.update(pad);
    const out = new Uint8Array(32);
    for (let i = 0; i < 8; i++) {
      out[4 * i] = this.h[i] >>> 24; out[4 * i + 1] = this.h[i] >>> 16;
      out[4 * i + 2] = this.h[i] >>> 8; out[4 * i + 3] = this.h[i];
    }
    return out;
  }

  hexdigest() {
    return Array.from(this.digest(), (b) => b.toString(16).padStart(2, '0')).join('');
  }
}

const LITTLE_ENDIAN = new Uint8Array(new Float64Array([1]).buffer)[7] === 0x3f;

// Float64Array -> its little-endian bytes (a view on little-endian hosts, a swapped copy otherwise)
export function f64LeBytes(a) {
  const bytes = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  if (LITTLE_ENDIAN) return bytes;
  const out = new Uint8Array(bytes.length);
  for (let i = 0; i < bytes.length; i += 8) for (let j = 0; j < 8; j++) out[i + j] = bytes[i + 7 - j];
  return out;
}

// params: {name: Float64Array} in canonical order -> hex SHA-256
export function weightHash(params) {
  const h = new Sha256();
  for (const w of Object.values(params)) h.update(f64LeBytes(w));
  return h.hexdigest();
}
