// The state body: one replica (config, step, weights, Adam state) as compact bytes, mirroring
// daisy/files/state_codec.py, which documents the format. The page POSTs it to the model routes
// (checkpoint, kit) and gets it back from /api/load; the mesh sends it to peers (STATE).
//   encodeState(shapes, replica fields) -> ArrayBuffer
//   decodeState(buf) -> loadState's form
// decodeState reads untrusted bytes: it checks every length against the config before it
// builds a view, and reads the JSON header under a size bound.
// Not under a files/ folder like its twin: daisy/files/ holds Python's file formats (checkpoint,
// safetensors, kit); the page reads no files, so its one format sits beside the mirror it serves.
import { LITTLE_ENDIAN } from './host.js';
import { makeConfig, RANGES } from './config.js';
import { paramShapes, paramCount } from './model.js';

export const STATE_FORMAT = 'daisychain-state';
export const STATE_VERSION = 1;
export const MAX_STATE_HEADER_BYTES = 64 * 1024;
const PARTS_FULL = ['model', 'optim.m', 'optim.v'];
// float64 values per part (= model.paramCount of the shapes' config), counted over the shapes
// themselves: encodeState writes the tensors of the shapes it is handed.
const valuesPerPart = (shapes) => shapes.reduce((n, [, shape]) => n + shape.reduce((x, y) => x * y, 1), 0);

// The most a state body of settings cfg may weigh: the u64 length prefix, the header bound, weights
// and both moments; a bound checked before a peer's body is allocated.
export const stateLimit = (cfg) => 8 + MAX_STATE_HEADER_BYTES + 8 * PARTS_FULL.length * paramCount(cfg);

// stateLimit for the largest allowed settings (twin of daisy/files/state_codec.py MAX_STATE_BYTES,
// the same number): the bound while the run's settings are not known yet.
export const MAX_STATE_BYTES = stateLimit(makeConfig(Object.fromEntries(['width', 'seq_len', 'layers', 'heads'].map((k) => [k, RANGES[k][1]]))));

// shapes [[name, shape]] (model.paramShapes) and a replica -> ArrayBuffer. m and v null: weights only.
export function encodeState(shapes, { config, step, adamT, params, m = null, v = null, weightHash = null, extra = null }) {
  if (!LITTLE_ENDIAN) throw new Error('the state body is little-endian; this host is not');
  const groups = m ? [params, m, v] : [params];
  const header = { format: STATE_FORMAT, version: STATE_VERSION, config, step, adam_t: adamT,
                   parts: m ? PARTS_FULL : ['model'] };
  if (weightHash) header.weight_hash = weightHash;
  if (extra) header.extra = extra;
  const json = new TextEncoder().encode(JSON.stringify(header));
  const H = json.length + ((8 - (json.length % 8)) % 8);            // data starts 8-byte aligned
  const perPart = valuesPerPart(shapes);
  const buf = new ArrayBuffer(8 + H + 8 * perPart * groups.length);
  new DataView(buf).setUint32(0, H, true);                          // u64 LE; the high word stays 0
  const bytes = new Uint8Array(buf);
  bytes.set(json, 8);
  bytes.fill(0x20, 8 + json.length, 8 + H);                         // JSON padded with spaces
  const values = new Float64Array(buf, 8 + H);
  let at = 0;
  for (const g of groups) for (const [name] of shapes) { values.set(g[name], at); at += g[name].length; }
  if (at !== values.length) throw new Error(`the replica holds ${at} values, its config needs ${values.length}`);
  return buf;
}

// ArrayBuffer -> {config, step, adamT, params, m, v, weightHash, extra} (loadState's form)
export function decodeState(buf) {
  if (!LITTLE_ENDIAN) throw new Error('the state body is little-endian; this host is not');
  const view = new DataView(buf);
  if (buf.byteLength < 8) throw new Error(`the state body is ${buf.byteLength} bytes, too short`);
  const H = view.getUint32(0, true);
  if (view.getUint32(4, true) !== 0 || H % 8 || 8 + H > buf.byteLength) throw new Error('the state body has a bad header length');
  if (H > MAX_STATE_HEADER_BYTES) throw new Error(`the state header is ${H} bytes, over the limit of ${MAX_STATE_HEADER_BYTES}`);
  let header;
  try { header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, H))); } catch (e) {
    throw new Error(`the state header is not JSON (${e.message})`);
  }
  if (!header || header.format !== STATE_FORMAT || header.version !== STATE_VERSION) {
    throw new Error(`not a ${STATE_FORMAT} v${STATE_VERSION} body`);
  }
  if (!header.config || typeof header.config !== 'object' || Array.isArray(header.config)) throw new Error('the state header has no config object');
  const cfg = makeConfig(header.config);
  const shapes = paramShapes(cfg);
  const parts = header.parts;
  const partsOk = Array.isArray(parts) && (parts.length === 1 || parts.length === 3) && parts.every((x, i) => x === PARTS_FULL[i]);
  if (!partsOk) throw new Error(`the state header's parts must be ["model"] or ${JSON.stringify(PARTS_FULL)}`);
  const perPart = valuesPerPart(shapes);
  if (buf.byteLength - 8 - H !== 8 * perPart * parts.length) {
    throw new Error(`the state body holds ${buf.byteLength - 8 - H} bytes of tensors; its config needs ${8 * perPart * parts.length}`);
  }
  let at = 8 + H;
  const groups = parts.map(() => {
    const g = {};
    for (const [name, shape] of shapes) {
      const n = shape.reduce((x, y) => x * y, 1);
      g[name] = new Float64Array(buf, at, n);
      at += 8 * n;
    }
    return g;
  });
  return { config: header.config, step: header.step, adamT: header.adam_t, params: groups[0],
           m: groups[1] || null, v: groups[2] || null, weightHash: header.weight_hash || null,
           extra: header.extra || null };
}
