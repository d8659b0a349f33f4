// What a member's useless frames cost the receiving page's memory (issue 19, docs/PROTOCOL.md
// "Mesh limits"): 450 GROUP_STATE first chunks (256 KiB frames) whose headers claim 39.8 MB each,
// fed to one link's Reassembler of frames.js: the peak of the live ArrayBuffer bytes (a full GC,
// then process.memoryUsage().arrayBuffers, after each frame: what the reassembler keeps, not
// garbage waiting for a collection), and how many abandoned messages it reported (each
// is a bad frame for the mesh, which cuts the sender off after 200 in 10 s).
//
//   node --expose-gc bench/bench_mesh_limits.mjs                          # this tree's frames.js
//   node --expose-gc bench/bench_mesh_limits.mjs /tmp/before/frontend_js/peer/frames.js   # another's
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const path = process.argv[2] ? resolve(process.argv[2]) : new URL('../frontend_js/mesh/frames.js', import.meta.url).pathname;
const { HEADER_BYTES, MAGIC, MAX_FRAME_BYTES, PROTOCOL_VERSION, Reassembler, TYPES } = await import(pathToFileURL(path).href);

const CLAIMED = 39_838_728, PER = MAX_FRAME_BYTES - HEADER_BYTES, COUNT = 450;

function firstChunk(msgId) {
  const frame = new Uint8Array(HEADER_BYTES + PER);
  const dv = new DataView(frame.buffer);
  dv.setUint32(0, MAGIC, true);
  dv.setUint8(4, PROTOCOL_VERSION); dv.setUint8(5, TYPES.GROUP_STATE); dv.setUint16(6, 0xffff, true);
  dv.setUint32(16, msgId, true); dv.setUint16(22, Math.ceil(CLAIMED / PER), true); dv.setUint32(24, CLAIMED, true);
  return frame;
}

let abandoned = 0;
const re = new Reassembler({ limitFor: () => CLAIMED, onAbandon: () => { abandoned++; } });
if (!globalThis.gc) throw new Error('run with node --expose-gc');
globalThis.gc();
const base = process.memoryUsage().arrayBuffers;
let peak = 0;
for (let i = 0; i < COUNT; i++) {
  await re.accept(firstChunk(0x62000000 + i));
  globalThis.gc();
  peak = Math.max(peak, process.memoryUsage().arrayBuffers - base);
}
console.log(`${path}\n${COUNT} first chunks claiming ${CLAIMED} bytes: peak live ArrayBuffer bytes ${(peak / 2 ** 20).toFixed(1)} MiB; `
  + `abandoned messages reported: ${abandoned}`);
