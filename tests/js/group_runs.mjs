// Shared by the backend tests (threads.test.mjs, unit_workers.test.mjs): one peer's Group run on a
// backend, hashes per step, and the first step at which two runs differ, named with both hashes
// and the first differing weight after the last step.
import { after } from 'node:test';

import { makeConfig } from '../../frontend_js/config.js';
import { Group } from '../../frontend_js/train.js';
import { textStream } from '../../frontend_js/data.js';
import { firstDiff } from '../../frontend_js/bits.js';

export const stream = textStream(Array.from({ length: 40 }, (_, i) => `document ${i}: the quick brown fox jumps over the lazy dog. `.repeat(6)).join('\n\n\n'));

// make(threads, opts) -> Promise of a backend => the same, each backend made closed after the
// file's tests (their workers would keep node alive)
export function closedAfter(make) {
  const made = [];
  after(() => { for (const b of made) b.close(); });
  return async (...args) => { const b = await make(...args); made.push(b); return b; };
}

// -> {hashes: [per step], group}
export async function run(settings, backend, steps) {
  const g = new Group(makeConfig(settings), 1, stream, backend);
  const hashes = [];
  for (let s = 0; s < steps; s++) hashes.push((await g.step()).hashes[0]);
  return { hashes, group: g };
}

// -> null, or the first step whose hashes differ, with both hashes and the first differing weight
export function firstMismatch(got, want, what) {
  const s = got.hashes.findIndex((h, i) => h !== want.hashes[i]);
  if (s < 0) return null;
  const pg = got.group.replicas[0].params, pw = want.group.replicas[0].params;
  for (const name of Object.keys(pw)) {
    const i = firstDiff(pg[name], pw[name]);
    if (i >= 0) return `${what}: step ${s + 1} hash ${got.hashes[s]} vs ${want.hashes[s]}; after the last step ${name}[${i}] = ${pg[name][i]} vs ${pw[name][i]}`;
  }
  return `${what}: step ${s + 1} hash ${got.hashes[s]} vs ${want.hashes[s]} (weights equal after the last step)`;
}

export const TINY = { width: 16, seq_len: 16, batch: 2, layers: 1, heads: 4 };
export const ODD = { width: 17, seq_len: 18, batch: 3, layers: 1, heads: 1 };     // odd C, T % 4 != 0
