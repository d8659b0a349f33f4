// Reader of the golden fixtures written by `python -m daisy.fixtures OUT_DIR` (format version 1,
// defined in daisy/fixtures.py), from an ArrayBuffer: works in node and in browsers.
//   bytes 0..3 magic "DSYF", 4..7 u32 version, 8..11 u32 header length H, then H bytes of JSON,
//   zero padding to a multiple of 8, then the tensors (each at its offset from the data start).
import { LITTLE_ENDIAN } from './host.js';

export const FIXTURE_VERSION = 1;
const MAGIC = 'DSYF';
const ARRAYS = { f64: Float64Array, i32: Int32Array, i8: Int8Array, u16: Uint16Array };

// -> {header, tensors: {name: {dtype, shape, data: TypedArray}}}
export function readFixture(buffer, name = 'fixture') {
  const bytes = new Uint8Array(buffer);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const magic = String.fromCharCode(...bytes.subarray(0, 4));
  if (bytes.length < 12 || magic !== MAGIC) throw new Error(`${name}: not a DaisyChain fixture (magic ${JSON.stringify(magic)})`);
  const version = dv.getUint32(4, true), hlen = dv.getUint32(8, true);
  if (version !== FIXTURE_VERSION) {
    throw new Error(`${name}: fixture version ${version}, this code reads ${FIXTURE_VERSION}; regenerate`);
  }
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(12, 12 + hlen)));
  const start = 12 + hlen + ((8 - ((12 + hlen) % 8)) % 8);
  const tensors = {};
  for (const t of header.tensors) {
    const Arr = ARRAYS[t.dtype];
    if (!Arr) throw new Error(`${name}: tensor ${t.name} has unknown dtype ${t.dtype}`);
    const raw = bytes.slice(start + t.offset, start + t.offset + t.nbytes);   // aligned copy
    let data = new Arr(raw.buffer, 0, t.nbytes / Arr.BYTES_PER_ELEMENT);
    if (!LITTLE_ENDIAN && Arr.BYTES_PER_ELEMENT > 1) data = swapped(raw, Arr);
    tensors[t.name] = { dtype: t.dtype, shape: t.shape, data };
  }
  return { header, tensors };
}

function swapped(raw, Arr) {
  const w = Arr.BYTES_PER_ELEMENT, out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += w) for (let j = 0; j < w; j++) out[i + j] = raw[i + w - 1 - j];
  return new Arr(out.buffer);
}

// float64 -> the hex of its IEEE bits, big-endian digit order (as daisy.fixtures.f64_bits)
export function f64Bits(x) {
  const dv = new DataView(new ArrayBuffer(8));
  dv.setFloat64(0, x);
  return dv.getBigUint64(0).toString(16).padStart(16, '0');
}

// First index where two arrays differ in value bits (NaN == NaN of the same bits, -0 != +0),
// or -1 when identical (length mismatch counts at the shorter length).
export function firstMismatch(a, b) {
  const n = Math.min(a.length, b.length);
  const floats = a instanceof Float64Array || b instanceof Float64Array;
  for (let i = 0; i < n; i++) {
    if (floats ? f64Bits(a[i]) !== f64Bits(b[i]) : a[i] !== b[i]) return i;
  }
  return a.length === b.length ? -1 : n;
}
