// Helpers the Node tests share (one copy each): the mesh's drop log silenced, a seeded word
// stream, one peer's step through a MeshCollective, the Python reference's fixtures and the
// bit-exact comparison against them.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { draw, key } from '../../frontend_js/prng.js';
import { readFixture, f64Bits, firstMismatch } from '../../frontend_js/fixtures.js';

// the mesh logs every drop with console.info; the tests read mesh.drops instead
export function quietMeshLogs() {
  const consoleInfo = console.info;
  console.info = (...args) => { if (!(typeof args[0] === 'string' && args[0].startsWith('daisy mesh: '))) consoleInfo(...args); };
}

// a seeded uint32 stream
export function stream32(...words) {
  const k = key(...words);
  let i = 0;
  return () => draw(k, i++);
}

// peer id's step s after its local step: the collective's exchange (every peer sent the same
// previous hash: the sync guard), then the reduced gradient applied -> {step, loss, hash}
export async function exchangeAndApply(c, trainer, { id, s, roster, slot, local, hash }) {
  const out = await c.exchange(s, roster, slot, local.loss, local.grads, hash, local.encoded ?? null);
  assert.deepEqual(out.hashes, roster.map(() => hash), `${id} step ${s}: the peers' previous hashes (sync guard)`);
  const applied = await trainer.apply(out.grads);
  return { step: applied.step, loss: out.loss, hash: applied.hash };
}

// the fixtures `python -m daisy.fixtures DIR` wrote, DIR from DAISY_FIXTURES
export const REGEN = 'regenerate with `python -m daisy.fixtures DIR` if the reference changed on purpose';
export function loadFixture(name) {
  const dir = process.env.DAISY_FIXTURES;
  assert.ok(dir, 'set DAISY_FIXTURES to a directory written by `python -m daisy.fixtures DIR`');
  const buf = readFileSync(join(dir, name));
  return readFixture(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength), name);
}

// got equals the reference bit for bit, else the first mismatch (with its float64 bits)
export function assertSame(what, got, want) {
  assert.equal(got.length, want.length, `${what}: length ${got.length}, reference ${want.length}`);
  const i = firstMismatch(got, want);
  if (i >= 0) {
    const bits = got instanceof Float64Array ? ` (bits ${f64Bits(got[i])} vs ${f64Bits(want[i])})` : '';
    assert.fail(`${what}: first mismatch at index ${i}: JS ${got[i]}, reference ${want[i]}${bits}; ${REGEN}`);
  }
}
