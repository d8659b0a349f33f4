// The trainer's collective seam, mirroring daisy/collective.py. A step is
//   local step (loss, grads on this peer's batch)
//   -> collective.exchange(step, roster, slot, loss, grads) -> {loss, grads: G}   (the reduce)
//   -> Adam -> hash
// SimulatedCollective: P replicas in one process (the CLI, tests). MeshCollective
// (peer/mesh_collective.js): one replica per page, gradients over the mesh, in either topology:
//   all-gather (P <= 3): every peer sends its whole gradient to every other peer and reduces all
//     P in slot order itself: (P-1)|g| bytes sent per peer per step.
//   reduce-scatter + all-gather (P >= 4): the flat gradient is cut into P shards; slot k owns
//     shard k, receives every peer's slice of it, reduces it in slot order and sends the reduced
//     shard to every other peer: 2(P-1)/P |g| bytes sent per peer per step.
// The reduce is elementwise (reduce.js), so both give the bits of reduceGradients on the whole
// gradient, whatever the order in which frames arrive.
import { reduceLosses } from './reduce.js';

// ---- the flat gradient and its shards (docs/VERIFICATION.md "Sharded reduce") ---------------

// {name: Float64Array} in canonical order (names) -> one Float64Array, row-major per tensor
export function flattenGrads(grads, names, out = null) {
  const N = names.reduce((n, k) => n + grads[k].length, 0);
  const flat = out || new Float64Array(N);
  let at = 0;
  for (const k of names) { flat.set(grads[k], at); at += grads[k].length; }
  return flat;
}

// flat -> {name: Float64Array view} for shapes [[name, shape]]
export function unflatten(flat, shapes) {
  const out = {};
  let at = 0;
  for (const [name, shape] of shapes) {
    const n = shape.reduce((x, y) => x * y, 1);
    out[name] = flat.subarray(at, at + n);
    at += n;
  }
  if (at !== flat.length) throw new RangeError(`the flat gradient has ${flat.length} values, the shapes need ${at}`);
  return out;
}

// shard k of P over N values: [floor(k*N/P), floor((k+1)*N/P))
export function shardBounds(N, P) {
  const b = [];
  for (let k = 0; k <= P; k++) b.push(Math.floor((k * N) / P));
  return b;
}

// slices[s] (Float64Array, one per slot 0..P-1, equal lengths) -> the reduce of reduce.js:
//   acc = g_0; acc = acc + g_s for s = 1..P-1; acc / P   (P = 1: g_0 unchanged)
export function reduceShard(slices, out = null) {
  const P = slices.length;
  if (P === 1) return slices[0];
  const acc = out || new Float64Array(slices[0].length);
  acc.set(slices[0]);
  for (let s = 1; s < P; s++) {
    const g = slices[s];
    for (let i = 0; i < acc.length; i++) acc[i] = acc[i] + g[i];
  }
  for (let i = 0; i < acc.length; i++) acc[i] = acc[i] / P;
  return acc;
}

export const topologyFor = (P) => (P <= 3 ? 'allgather' : 'rsag');

// ---- SimulatedCollective --------------------------------------------------------------------

// P replicas in one process: exchange() resolves once every slot of the step has posted.
export class SimulatedCollective {
  constructor(shapes) {
    this.shapes = shapes;
    this.names = shapes.map(([n]) => n);
    this.pending = null;      // {step, P, losses[], flats[], waiters[]}
  }

  exchange(step, roster, slot, loss, grads) {
    const P = roster.length;
    if (!this.pending || this.pending.step !== step) {
      this.pending = { step, P, losses: new Array(P), flats: new Array(P), got: 0, waiters: [] };
    }
    const p = this.pending;
    if (p.flats[slot]) throw new Error(`slot ${slot} posted twice at step ${step}`);
    p.losses[slot] = loss;
    p.flats[slot] = flattenGrads(grads, this.names);
    p.got++;
    const done = new Promise((resolve) => p.waiters.push(resolve));
    if (p.got === P) {
      const flat = reduceShard(p.flats);
      const out = { loss: reduceLosses(p.losses), grads: unflatten(flat, this.shapes) };
      this.pending = null;
      for (const w of p.waiters) w(out);
    }
    return done;
  }
}
