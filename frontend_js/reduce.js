// The group's gradient reduce rule, mirroring daisy/reduce.py, independent of arrival order:
//   G = (((g_0 + g_1) + g_2) + ... + g_{P-1}) / P      per element, float64, slots ascending
// bySlot: an array indexed by slot, or a Map/object {slot: grads}; slots must be exactly 0..P-1.
import { freshF64 } from './arena.js';

function slotsOf(bySlot) {
  const entries = bySlot instanceof Map ? [...bySlot.entries()] : Object.entries(bySlot);
  const slots = entries.map(([s]) => Number(s)).sort((a, b) => a - b);
  if (!slots.length || slots.some((s, i) => s !== i)) throw new RangeError(`slots must be 0..P-1, got [${slots.join(', ')}]`);
  const get = (s) => (bySlot instanceof Map ? bySlot.get(s) : bySlot[s]);
  return { slots, get };
}

// mem (arena.js): where the sums come from
export function reduceGradients(bySlot, mem = freshF64) {
  const { slots, get } = slotsOf(bySlot);
  const P = slots.length;
  const first = get(0);
  if (P === 1) return first;             // g / 1 is g exactly (IEEE division by one is exact)
  const out = {};
  for (const name of Object.keys(first)) {
    const acc = mem.take(first[name].length);
    acc.set(first[name]);
    for (let s = 1; s < P; s++) {
      const g = get(s)[name];
      for (let i = 0; i < acc.length; i++) acc[i] = acc[i] + g[i];
    }
    for (let i = 0; i < acc.length; i++) acc[i] = acc[i] / P;
    out[name] = acc;
  }
  return out;
}

export function reduceLosses(bySlot) {
  const { slots, get } = slotsOf(bySlot);
  let acc = get(0);
  for (let s = 1; s < slots.length; s++) acc = acc + get(s);
  return acc / slots.length;
}
