"""The trainer's collective seam: how one peer's (loss, gradients) become the group's.

A step is
    local step:  loss_i, g_i = loss_and_grads(weights, batch(seed, step, slot i))
    exchange:    loss, G = collective.exchange(step, roster, slot, loss_i, g_i).result()
    update:      adam_step(weights, G, ...); hash(weights)
Every implementation of `exchange` returns the bits of daisy.reduce (reduce_gradients,
reduce_losses) over slots 0..P-1, whatever order the peers' contributions arrive in.
frontend_js/collective.js is the JS twin (exchange returns a Promise of {loss, grads}).

SimulatedCollective: P replicas in one process (python -m daisy.train, the tests). Each slot
posts its contribution and gets a handle; `.result()` gives (loss, G) once every slot of the
roster has posted (the Group posts all P slots, then reads the results).

Topologies of a real group (the mesh, frontend_js/mesh/mesh.js):
    all-gather (P <= 3): every peer sends its whole gradient to every other peer and reduces
        all P itself: (P-1)|g| bytes sent per peer per step.
    reduce-scatter + all-gather (P >= 4): the sharded reduce below; slot k owns shard k,
        receives every peer's slice of it, reduces it and sends the reduced shard to every
        other peer: 2(P-1)/P |g| bytes sent per peer per step.

The sharded reduce (docs/VERIFICATION.md §8):
    flat   = flatten_grads(g, shapes): every tensor in the canonical order
             (daisy.model.param_shapes), row-major, float64, concatenated -> (N,)
    bounds = shard_bounds(N, P): b_k = floor(k*N / P), k = 0..P; shard k = flat[b_k : b_{k+1}]
             (integer floor division, so every implementation cuts at the same indices; shards
             of P > N peers may be empty)
    owner of shard k (slot k): reduce_shard({s: flat_s[b_k : b_{k+1}] for s in 0..P-1})
             = daisy.reduce.reduce_gradients elementwise: acc = g_0; acc = acc + g_s for
             s = 1..P-1 (ascending); acc / P.  P = 1: g_0 / 1 = g_0, the same bits.
The reduce is elementwise, so concatenating the reduced shards gives reduce_gradients of the
whole gradients bit for bit, for any P and N (tested: tests/test_collective.py).

The exchange codec (the run setting `exchange`, daisy/exchange_codec.py) says how a slot's
contribution and a reduced shard travel. Whatever the topology, G is computed as
    for each shard [lo, hi) of codec.shard_bounds(N, P) (all-gather: the one shard [0, N)):
        d_s  = codec.decode(codec.encode(flat_s[lo:hi], seed, step, slot s, offset lo))
        G[lo:hi] = codec.reduce([d_0, ..., d_{P-1}], seed, step, offset lo)
f64 decodes to the values sent, so G is reduce_gradients' bits as above; int8 quantizes in
blocks at fixed positions of the flat gradient, keyed by the index, so both topologies give the
same G (the int8 shard bounds fall on block boundaries). P = 1 goes through the codec too: a
run's math does not depend on how many peers it has. frontend_js/collective.js's
SimulatedCollective and mesh/mesh_collective.js follow the same rule.
"""
from collections import OrderedDict

import numpy as np

from .exchange_codec import codec_for, even_bounds, slot_mean
from .reduce import reduce_losses

ALL_GATHER, REDUCE_SCATTER = "allgather", "rsag"


def topology_for(P: int) -> str:
    """The exchange topology of a P-peer group: all-gather up to 3 peers, else reduce-scatter
    + all-gather (the same bits either way; fewer bytes for 4+ peers)."""
    return ALL_GATHER if P <= 3 else REDUCE_SCATTER


# -- the flat gradient and its shards ---------------------------------------------------------
def flatten_grads(grads: dict, shapes: dict) -> np.ndarray:
    """{name: array} -> (N,) float64: every tensor of `shapes` (daisy.model.param_shapes, the
    canonical order) row-major, concatenated."""
    return np.concatenate([np.ascontiguousarray(grads[name], dtype=np.float64).reshape(-1)
                           for name in shapes])


def unflatten(flat: np.ndarray, shapes: dict) -> "OrderedDict[str, np.ndarray]":
    """(N,) -> {name: view of flat with its shape}, in the order of `shapes`."""
    sizes = [int(np.prod(shape)) for shape in shapes.values()]
    if sum(sizes) != len(flat):
        raise ValueError(f"the flat gradient has {len(flat)} values, the shapes need {sum(sizes)}")
    out, at = OrderedDict(), 0
    for (name, shape), n in zip(shapes.items(), sizes):
        out[name] = flat[at:at + n].reshape(shape)
        at += n
    return out


shard_bounds = even_bounds       # the f64 cut: [floor(k*N/P) for k = 0..P] (exchange_codec.py)


def reduce_shard(slices_by_slot: dict) -> np.ndarray:
    """{slot: (n,) float64 slice of that slot's flat gradient} -> the reduced slice, by the
    rule of daisy.reduce (slots exactly 0..P-1, summed ascending, then / P)."""
    slots = sorted(slices_by_slot)
    if slots != list(range(len(slots))) or not slots:
        raise ValueError(f"slots must be 0..P-1, got {slots}")
    return slot_mean([slices_by_slot[s] for s in slots])


def sharded_reduce(flats_by_slot: dict) -> np.ndarray:
    """{slot: (N,) flat gradient} -> (N,) reduced, shard by shard as the P owners compute it
    (the reduce-scatter), then concatenated (the all-gather)."""
    P = len(flats_by_slot)
    N = len(flats_by_slot[0])
    b = shard_bounds(N, P)
    return np.concatenate([reduce_shard({s: f[b[k]:b[k + 1]] for s, f in flats_by_slot.items()})
                           for k in range(P)])


def codec_reduce(codec, flats: list, *, seed: int, step: int, topology: str) -> np.ndarray:
    """flats: each slot's (N,) flat gradient in slot order -> G by the codec, shard by shard as
    the mesh computes it (all-gather: one shard of N)."""
    N, P = len(flats[0]), len(flats)
    bounds = [0, N] if topology == ALL_GATHER else codec.shard_bounds(N, P)
    G = np.empty(N)
    for lo, hi in zip(bounds, bounds[1:]):
        decoded = [codec.decode(codec.encode(f[lo:hi], seed=seed, step=step, slot=s, offset=lo), hi - lo)
                   for s, f in enumerate(flats)]
        G[lo:hi] = codec.reduce(decoded, seed=seed, step=step, offset=lo)
    return G


# -- SimulatedCollective ----------------------------------------------------------------------
class ExchangeHandle:
    """One slot's pending exchange of one step; .result() -> (loss, G) once all slots posted."""

    def __init__(self, pending: "_Step"):
        self._pending = pending

    def done(self) -> bool:
        return self._pending.out is not None

    def result(self):
        p = self._pending
        if p.out is None:
            missing = [s for s in range(p.P) if s not in p.grads]
            raise RuntimeError(f"step {p.step}: slots {missing} of {p.P} have not posted yet")
        return p.out


class _Step:
    def __init__(self, step: int, P: int):
        self.step, self.P = step, P
        self.losses, self.grads = {}, {}
        self.out = None           # (loss, G) once every slot posted


class SimulatedCollective:
    """P replicas in one process. topology None = topology_for(P): the CLI reduces 4+ peers
    shard by shard, as the mesh does, and fewer peers whole; both give the same bits.
    exchange: the run's codec name (Config.exchange); seed: the run seed (keys int8's rounding)."""

    def __init__(self, shapes: dict, *, seed: int = 0, exchange: str = "f64", topology: str | None = None):
        self.shapes = shapes
        self.seed = seed
        self.codec = codec_for(exchange)
        self.topology = topology
        self.pending: _Step | None = None

    def exchange(self, step: int, roster, slot: int, loss: float, grads: dict) -> ExchangeHandle:
        """Post slot's (loss, grads) of `step`; roster lists the step's peers in slot order."""
        P = len(roster)
        if not 0 <= slot < P:
            raise ValueError(f"slot {slot} is outside the roster of {P} peers")
        p = self.pending
        if p is None or p.step != step or p.out is not None:
            if p is not None and p.out is None:
                raise RuntimeError(f"step {step} posted while step {p.step} still waits for slots")
            p = self.pending = _Step(step, P)
        if p.P != P:
            raise ValueError(f"step {step}: roster of {P} peers, but the step began with {p.P}")
        if slot in p.grads:
            raise ValueError(f"step {step}: slot {slot} posted twice")
        p.losses[slot], p.grads[slot] = loss, grads
        if len(p.grads) == P:
            p.out = (reduce_losses(p.losses), self._reduce(step, p.grads))
        return ExchangeHandle(p)

    def _reduce(self, step: int, grads_by_slot: dict):
        P = len(grads_by_slot)
        flats = [flatten_grads(grads_by_slot[s], self.shapes) for s in range(P)]
        G = codec_reduce(self.codec, flats, seed=self.seed, step=step,
                         topology=self.topology or topology_for(P))
        return unflatten(G, self.shapes)
