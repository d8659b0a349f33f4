"""The collective seam (daisy/collective.py): the sharded reduce of reduce-scatter + all-gather
gives reduce_gradients' bits for every P and N, and SimulatedCollective gives the same (loss, G)
whatever the topology and the order in which slots post."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from daisy import data
from daisy.collective import (ALL_GATHER, REDUCE_SCATTER, SimulatedCollective, flatten_grads,
                              reduce_shard, shard_bounds, sharded_reduce, unflatten)
from daisy.config import Config
from daisy.model import init_params, loss_and_grads, param_shapes
from daisy.reduce import reduce_gradients, reduce_losses
from tests.bits import assert_same_bits

# +-1e308 in the specials overflow to +-inf in some sums: that is part of what must match
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

SMALL = Config(width=16, heads=2, seq_len=16, batch=2, layers=1, seed=77)
SPECIALS = np.array([0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1e308, -1e308,
                     1.0, 1.0 + 2**-52, 3.0, 1e-300])


def grads_of(rng, N, P):
    """P flat gradients of N float64 values: wide exponents, signed zeros, subnormals."""
    out = {}
    for s in range(P):
        g = rng.standard_normal(N) * np.exp2(rng.integers(-60, 60, N).astype(np.float64))
        pick = rng.random(N) < 0.1
        g[pick] = rng.choice(SPECIALS, int(pick.sum()))
        out[s] = g
    return out


def test_shard_bounds_cover_everything_in_order():
    assert shard_bounds(10, 3) == [0, 3, 6, 10]
    assert shard_bounds(7, 1) == [0, 7]
    assert shard_bounds(3, 5) == [0, 0, 1, 1, 2, 3]          # more peers than values: empty shards
    for N in range(0, 40):
        for P in range(1, 9):
            b = shard_bounds(N, P)
            assert b[0] == 0 and b[-1] == N and all(x <= y for x, y in zip(b, b[1:]))
            assert b == [k * N // P for k in range(P + 1)]


@pytest.mark.parametrize("P", range(1, 9))
@pytest.mark.parametrize("N", [1, 3, 7, 101, 1001, 4099])
def test_sharded_equals_full_reduce(P, N):
    rng = np.random.default_rng(1000 * P + N)
    flats = grads_of(rng, N, P)
    want = reduce_gradients({s: {"g": f} for s, f in flats.items()})["g"]
    assert_same_bits(sharded_reduce(flats), want, f"P={P} N={N}")
    # each owner's shard on its own, as the mesh computes it
    b = shard_bounds(N, P)
    for k in range(P):
        got = reduce_shard({s: f[b[k]:b[k + 1]] for s, f in flats.items()})
        assert_same_bits(got, want[b[k]:b[k + 1]], f"P={P} N={N} shard {k}")


@settings(max_examples=60, deadline=None)
@given(P=st.integers(1, 8), half=st.integers(0, 600), seed=st.integers(0, 2**32 - 1))
def test_sharded_equals_full_reduce_any_odd_n(P, half, seed):
    N = 2 * half + 1
    flats = grads_of(np.random.default_rng(seed), N, P)
    want = reduce_gradients({s: {"g": f} for s, f in flats.items()})["g"]
    assert_same_bits(sharded_reduce(flats), want, f"P={P} N={N}")


def test_p1_returns_the_gradient_unchanged():
    g = grads_of(np.random.default_rng(5), 33, 1)[0]
    assert_same_bits(reduce_shard({0: g}), g)


def test_flatten_is_canonical_order_row_major():
    shapes = param_shapes(SMALL)
    params = init_params(SMALL)
    flat = flatten_grads(params, shapes)
    assert flat.dtype == np.float64 and len(flat) == sum(int(np.prod(s)) for s in shapes.values())
    want = np.concatenate([params[n].reshape(-1) for n in shapes])
    assert_same_bits(flat, want)
    back = unflatten(flat, shapes)
    assert list(back) == list(shapes)
    for name in shapes:
        assert_same_bits(back[name], params[name], name)
    with pytest.raises(ValueError, match="the shapes need"):
        unflatten(flat[:-1], shapes)


def real_grads(P):
    """(loss, grads) of P slots of step 0 of a small run (the model's real gradients)."""
    params = init_params(SMALL)
    stream = data.builtin_stream()
    out = {}
    for slot in range(P):
        x, y = data.get_batch(stream, SMALL.seed, 0, slot, SMALL.batch, SMALL.seq_len)
        out[slot] = loss_and_grads(params, SMALL, x, y)
    return out


@pytest.mark.parametrize("P", [1, 2, 4, 5])
def test_simulated_collective_same_bits_any_topology_any_order(P):
    contrib = real_grads(P)
    want_G = reduce_gradients({s: g for s, (_, g) in contrib.items()})
    want_loss = reduce_losses({s: l for s, (l, _) in contrib.items()})
    shapes = param_shapes(SMALL)
    rng = np.random.default_rng(P)
    for topology in (ALL_GATHER, REDUCE_SCATTER):
        c = SimulatedCollective(shapes, topology=topology)
        order = rng.permutation(P)
        handles = {}
        for i, slot in enumerate(order):
            handles[slot] = c.exchange(0, list(range(P)), int(slot), *contrib[int(slot)])
            if i < P - 1:
                assert not handles[slot].done()
                with pytest.raises(RuntimeError, match="have not posted yet"):
                    handles[slot].result()
        for slot, h in handles.items():
            loss, G = h.result()
            assert loss == want_loss
            assert list(G) == list(shapes)
            for name in shapes:
                assert_same_bits(G[name], want_G[name], f"{topology} P={P} slot {slot} {name}")


def test_simulated_collective_refuses_misuse():
    contrib = real_grads(2)
    c = SimulatedCollective(param_shapes(SMALL))
    c.exchange(0, [0, 1], 0, *contrib[0])
    with pytest.raises(ValueError, match="posted twice"):
        c.exchange(0, [0, 1], 0, *contrib[0])
    with pytest.raises(ValueError, match="outside the roster"):
        c.exchange(0, [0, 1], 2, *contrib[0])
    with pytest.raises(RuntimeError, match="still waits"):
        c.exchange(1, [0, 1], 0, *contrib[0])


def test_the_comparison_catches_another_order():
    """The check is not vacuous: summing the slots in descending order differs in some bit, and
    the failure names the first mismatching index with both values."""
    from tests.bits import first_bit_mismatch
    flats = grads_of(np.random.default_rng(9), 1001, 4)
    want = sharded_reduce(flats)
    backwards = reduce_shard({s: flats[3 - s] for s in range(4)})
    msg = first_bit_mismatch(backwards, want)
    assert msg is not None and "first mismatch at" in msg and "bits" in msg, msg
