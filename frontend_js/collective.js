// The trainer's collective seam, mirroring daisy/collective.py. A step is
//   local step (loss, grads on this peer's batch)
//   -> collective.exchange(step, roster, slot, loss, grads, encoded?) -> {loss, grads: G}   (the reduce)
//   -> Adam -> hash
// SimulatedCollective: P replicas in one process (the CLI, tests). MeshCollective
// (mesh/mesh_collective.js): one replica per page, gradients over the mesh, in either topology:
//   all-gather (P <= 3): every peer sends its whole gradient to every other peer and reduces all
//     P in slot order itself: (P-1)|g| bytes sent per peer per step.
//   reduce-scatter + all-gather (P >= 4): the flat gradient is cut into P shards; slot k owns
//     shard k, receives every peer's slice of it, reduces it in slot order and sends the reduced
//     shard to every other peer: 2(P-1)/P |g| bytes sent per peer per step.
// The reduce is elementwise (reduce.js), so both give the bits of reduceGradients on the whole
// gradient, whatever the order in which frames arrive.
// The exchange codec (the run setting `exchange`, exchange_codec.js) says how a slot's
// contribution and a reduced shard travel; G is computed shard by shard as codecReduce says,
// in both topologies and for P = 1 too (daisy/collective.py explains why it is the same G).
import { reduceLosses } from './reduce.js';
import { codecFor, evenBounds, slotMean } from './exchange_codec.js';

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

// the f64 cut: shard k of P over N values is [floor(k*N/P), floor((k+1)*N/P))
export const shardBounds = evenBounds;

// slices[s] (Float64Array, one per slot 0..P-1, equal lengths) -> the reduce of reduce.js:
//   acc = g_0; acc = acc + g_s for s = 1..P-1; acc / P   (P = 1: g_0's bits)
export const reduceShard = slotMean;

// flats: each slot's (N) flat gradient in slot order -> G by the codec, shard by shard as the
// mesh computes it (all-gather: one shard of N). encoded[slot] (optional): that slot's message of
// its whole flat gradient, made where it was computed (the resident step, on the GPU): its shards
// are cut from it instead of encoded here (the same bytes).
export function codecReduce(codec, flats, { seed, step, topology }, encoded = []) {
  const N = flats[0].length, P = flats.length;
  const bounds = topology === 'allgather' ? [0, N] : codec.shardBounds(N, P);
  const G = new Float64Array(N);
  for (let k = 0; k + 1 < bounds.length; k++) {
    const lo = bounds[k], hi = bounds[k + 1];
    const message = (f, slot) => (encoded[slot] ? codec.sliceMessage(encoded[slot], N, lo, hi) : codec.encode(f.subarray(lo, hi), { seed, step, slot, offset: lo }));
    const decoded = flats.map((f, slot) => codec.decode(message(f, slot), hi - lo));
    G.set(codec.reduce(decoded, { seed, step, offset: lo }), lo);
  }
  return G;
}

export const topologyFor = (P) => (P <= 3 ? 'allgather' : 'rsag');

// ---- SimulatedCollective --------------------------------------------------------------------

// P replicas in one process: exchange() resolves once every slot of the step has posted.
// topology null = topologyFor(P): 4+ peers are reduced shard by shard, as the mesh does; exchange:
// the run's codec name (cfg.exchange); seed: the run seed (keys int8's rounding).
export class SimulatedCollective {
  constructor(shapes, { seed = 0, exchange = 'f64', topology = null } = {}) {
    this.shapes = shapes;
    this.names = shapes.map(([n]) => n);
    this.seed = seed;
    this.codec = codecFor(exchange);
    this.topology = topology;
    this.pending = null;      // {step, P, losses[], flats[], encoded[], got, waiters[], out}
  }

  // post slot's (loss, grads) of `step`; roster lists the step's peers in slot order; encoded: the
  // codec's message of the slot's whole flat gradient when its trainer made it (else null)
  exchange(step, roster, slot, loss, grads, encoded = null) {
    const P = roster.length;
    if (!(slot >= 0 && slot < P)) throw new RangeError(`slot ${slot} is outside the roster of ${P} peers`);
    let p = this.pending;
    if (!p || p.step !== step || p.out) {
      if (p && !p.out) throw new Error(`step ${step} posted while step ${p.step} still waits for slots`);
      p = this.pending = { step, P, losses: new Array(P), flats: new Array(P), encoded: new Array(P).fill(null), got: 0, waiters: [], out: null };
    }
    if (p.P !== P) throw new RangeError(`step ${step}: roster of ${P} peers, but the step began with ${p.P}`);
    if (p.flats[slot]) throw new RangeError(`step ${step}: slot ${slot} posted twice`);
    p.losses[slot] = loss;
    p.flats[slot] = flattenGrads(grads, this.names);
    p.encoded[slot] = encoded;
    p.got++;
    const done = new Promise((resolve) => p.waiters.push(resolve));
    if (p.got === P) {
      const G = codecReduce(this.codec, p.flats, { seed: this.seed, step, topology: this.topology || topologyFor(P) }, p.encoded);
      p.out = { loss: reduceLosses(p.losses), grads: unflatten(G, this.shapes) };
      for (const w of p.waiters) w(p.out);
    }
    return done;
  }
}
