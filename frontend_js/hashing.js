// The canonical weight hash, mirroring daisy/hashing.py: SHA-256 over every parameter in
// paramShapes order, as the little-endian bytes of its float64 values, row-major; hex digest.
// weightHash is the reference, in plain JS (no state, works everywhere, a file:// page too).
// The faster SHA-256s a backend may use (engines.js gates each against the JS one first): the
// compress function in WebAssembly (createWasmSha) and WebCrypto's native digest (createSubtleSha,
// asynchronous, only in secure contexts). A sha is {name, hexOf(parts)}: parts, Uint8Arrays of
// one message, -> the hex digest (or a Promise of it).
import { LITTLE_ENDIAN } from './host.js';
import { Module, local, block, loop, br, br_if, i32 } from './wasm_asm.js';

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
// bytes <-> lowercase hex, the one rule for every hash the pages show, send and compare
export const toHex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
export const fromHex = (hex) => Uint8Array.from({ length: hex.length / 2 }, (_, i) => parseInt(hex.slice(2 * i, 2 * i + 2), 16));
// A hash as people read it: 16 hex digits, the one length for the page's hash line, the peer table,
// messages and Python's logs (the full hash goes in a title or the state itself).
export const short = (h) => (h ? String(h).slice(0, 16) : '(none)');

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
    return toHex(this.digest());
  }
}

// Float64Array -> its little-endian bytes (a view on little-endian hosts, a swapped copy otherwise)
export function f64LeBytes(a) {
  const bytes = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  if (LITTLE_ENDIAN) return bytes;
  const out = new Uint8Array(bytes.length);
  for (let i = 0; i < bytes.length; i += 8) for (let j = 0; j < 8; j++) out[i + j] = bytes[i + 7 - j];
  return out;
}

// --- SHA-256 compress in WebAssembly: sha(statePtr, dataPtr, nBlocks), 64 rounds unrolled, the
// message schedule in 64 locals, words loaded little-endian and byte-swapped -------------------
const W = Array.from({ length: 64 }, (_, i) => `w${i}`);
const shaModule = new Module();
shaModule.func('sha', {
  params: 'statePtr dataPtr nBlocks',
  locals: `blk a b c d e f g h t1 t2 ${W.join(' ')}`,
}, (L) => {
  const v = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'].map((n) => L[n]), w = W.map((n) => L[n]);
  const rotr = (l, n) => [local.get(l), i32.const(n), i32.rotr];
  const sigma = (l, r1, r2, r3) => [rotr(l, r1), rotr(l, r2), i32.xor, rotr(l, r3), i32.xor];
  const sigmaSmall = (l, r1, r2, sh) => [rotr(l, r1), rotr(l, r2), i32.xor, local.get(l), i32.const(sh), i32.shr_u, i32.xor];
  const perBlock = [];
  for (let i = 0; i < 16; i++) {                      // big-endian word = byte swap of the LE load
    perBlock.push(local.get(L.dataPtr), i32.load(4 * i), local.set(w[i]),
      local.get(w[i]), i32.const(0x00ff00ff), i32.and, i32.const(8), i32.rotr,
      local.get(w[i]), i32.const(8), i32.rotl, i32.const(0x00ff00ff), i32.and, i32.or, local.set(w[i]));
  }
  for (let i = 16; i < 64; i++) {
    perBlock.push(local.get(w[i - 16]), sigmaSmall(w[i - 15], 7, 18, 3), i32.add, local.get(w[i - 7]), i32.add,
      sigmaSmall(w[i - 2], 17, 19, 10), i32.add, local.set(w[i]));
  }
  let r = [...v];                                     // roles a..h -> locals, renamed each round
  for (let i = 0; i < 64; i++) {
    const [a, b, c, d, e, f, g, h] = r;
    perBlock.push(local.get(h), sigma(e, 6, 11, 25), i32.add,
      local.get(g), local.get(e), local.get(f), local.get(g), i32.xor, i32.and, i32.xor, i32.add,   // ch = g ^ (e & (f ^ g))
      i32.const(K256[i]), i32.add, local.get(w[i]), i32.add, local.set(L.t1),
      sigma(a, 2, 13, 22), local.get(a), local.get(b), i32.and, local.get(c), local.get(a), local.get(b), i32.or, i32.and, i32.or, i32.add,   // maj
      local.set(L.t2),
      local.get(d), local.get(L.t1), i32.add, local.set(d), local.get(L.t1), local.get(L.t2), i32.add, local.set(h));
    r = [h, a, b, c, d, e, f, g];
  }
  for (let i = 0; i < 8; i++) {
    perBlock.push(local.get(v[i]), local.get(L.statePtr), i32.load(4 * i), i32.add, local.set(v[i]),
      local.get(L.statePtr), local.get(v[i]), i32.store(4 * i));
  }
  perBlock.push(local.get(L.dataPtr), i32.const(64), i32.add, local.set(L.dataPtr), local.get(L.blk), i32.const(1), i32.add, local.set(L.blk));
  return [
    v.map((l, i) => [local.get(L.statePtr), i32.load(4 * i), local.set(l)]),
    block(loop(local.get(L.blk), local.get(L.nBlocks), i32.ge_u, br_if(1), perBlock, br(0))),
  ];
});
export const shaWasmBytes = () => shaModule.bytes();
const IV = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

// bytes (Uint8Array parts, one message) -> hex SHA-256 in wasm; the message is copied into memory
function wasmHashParts(ws, parts) {
  const total = parts.reduce((n, p) => n + p.length, 0);
  const padded = (total + 9 + 63) & ~63, need = 32 + padded;
  if (ws.mem.buffer.byteLength < need) ws.mem.grow(Math.ceil((need - ws.mem.buffer.byteLength) / 65536));
  const u8 = new Uint8Array(ws.mem.buffer);
  let o = 32;
  for (const p of parts) { u8.set(p, o); o += p.length; }
  u8.fill(0, o, 32 + padded);
  u8[o] = 0x80;
  const bits = total * 8, hi = Math.floor(bits / 2 ** 32), lo = bits >>> 0;
  const dv = new DataView(ws.mem.buffer);
  dv.setUint32(32 + padded - 8, hi); dv.setUint32(32 + padded - 4, lo);
  for (let i = 0; i < 8; i++) dv.setUint32(4 * i, IV[i], true);
  ws.sha(0, 32, padded / 64);
  let hex = '';
  for (let i = 0; i < 8; i++) hex += dv.getUint32(4 * i, true).toString(16).padStart(8, '0');
  return hex;
}

// the reference SHA-256 as a sha
export const jsSha = {
  name: 'js',
  hexOf(parts) {
    const h = new Sha256();
    for (const p of parts) h.update(p);
    return h.hexdigest();
  },
};

// params: {name: Float64Array} in canonical order -> the message, as its parts
export const paramBytes = (params) => Object.values(params).map(f64LeBytes);

// params: {name: Float64Array} in canonical order -> hex SHA-256 (the reference)
export function weightHash(params) {
  return jsSha.hexOf(paramBytes(params));
}

// -> the wasm compress as a sha; throws when WebAssembly is missing (engines.js gates it)
export function createWasmSha() {
  if (typeof WebAssembly === 'undefined') throw new Error('WebAssembly is not available');
  if (!LITTLE_ENDIAN) throw new Error('the wasm SHA-256 assumes a little-endian host');
  const inst = new WebAssembly.Instance(new WebAssembly.Module(shaWasmBytes()), {});
  const ws = { mem: inst.exports.mem, sha: inst.exports.sha };
  return { name: 'wasm', hexOf: (parts) => wasmHashParts(ws, parts) };
}

// -> WebCrypto's SHA-256 (native code, ~3x the wasm rate here) as an asynchronous sha; throws
// where crypto.subtle is missing (it exists only in secure contexts: https, localhost, 127.0.0.1)
export function createSubtleSha() {
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) throw new Error('crypto.subtle is missing (not a secure context)');
  let buf = new Uint8Array(0);                 // reused: digest copies its input
  return {
    name: 'webcrypto',
    async hexOf(parts) {
      const total = parts.reduce((n, p) => n + p.length, 0);
      if (buf.length < total) buf = new Uint8Array(total);
      let o = 0;
      for (const p of parts) { buf.set(p, o); o += p.length; }
      return toHex(new Uint8Array(await subtle.digest('SHA-256', buf.subarray(0, total))));
    },
  };
}

// sha -> null, or its first disagreement with the JS SHA-256 in words: every padding case
// (0..130 bytes), across blocks, a message split into two parts
export async function gateSha(sha) {
  const msg = new Uint8Array(1000);
  for (let i = 0; i < msg.length; i++) msg[i] = (i * 131 + 7) & 0xff;
  for (const n of [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 128, 130, 1000]) {
    const part = msg.subarray(0, n);
    const got = await sha.hexOf([part.subarray(0, n >> 1), part.subarray(n >> 1)]), want = jsSha.hexOf([part]);
    if (got !== want) return `${sha.name} SHA-256 of ${n} bytes: ${got} vs JS ${want}`;
  }
  return null;
}
