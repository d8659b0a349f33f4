"""Metamorphic properties: transformations of the input whose effect on the output is known
exactly."""
from collections import OrderedDict

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from daisy.detmath import tree_sum
from daisy.reduce import reduce_gradients, reduce_losses
from daisy.units import qmatmul, quantize_rows
from bits import assert_same_bits

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_subnormal=False)
shape = st.tuples(st.integers(1, 9), st.integers(1, 17), st.integers(1, 7))


def mats(m, k, n):
    return st.tuples(arrays(np.float64, (m, k), elements=finite), arrays(np.float64, (k, n), elements=finite))


@settings(max_examples=60, deadline=None)
@given(shape.flatmap(lambda s: mats(*s)), st.integers(-20, 20), st.integers(-20, 20))
def test_power_of_two_scaling_is_exact(ab, i, j):
    a, b = ab
    # away from the scale floor, scaling an operand by 2^i scales the output by 2^i exactly
    a = a + np.where(a >= 0, 1.0, -1.0)                  # no all-zero rows (they hit the floor)
    b = b + np.where(b >= 0, 1.0, -1.0)
    out = qmatmul(a, b)
    scaled = qmatmul(a * 2.0 ** i, b * 2.0 ** j)
    assert_same_bits(scaled, out * 2.0 ** (i + j), "scaled output")
    qa, sa = quantize_rows(a)
    qs, ss = quantize_rows(a * 2.0 ** i)
    assert_same_bits(qs, qa, "codes")
    assert_same_bits(ss, sa * 2.0 ** i, "scales")


@settings(max_examples=40, deadline=None)
@given(shape.flatmap(lambda s: mats(*s)), st.randoms(use_true_random=False))
def test_row_and_column_permutations_commute_with_qmatmul(ab, rnd):
    a, b = ab
    rows = list(range(a.shape[0]))
    cols = list(range(b.shape[1]))
    rnd.shuffle(rows)
    rnd.shuffle(cols)
    out = qmatmul(a, b)
    assert_same_bits(qmatmul(a[rows], b[:, cols]), out[rows][:, cols], "permuted")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.randoms(use_true_random=False))
def test_reduce_rule_ignores_arrival_order(P, n, rnd):
    rng = np.random.default_rng(P * 100 + n)
    grads = {s: OrderedDict(w=rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8), b=rng.standard_normal((2, n)))
             for s in range(P)}
    losses = {s: float(rng.random() * 5) for s in range(P)}
    want = reduce_gradients(grads)
    order = list(range(P))
    for _ in range(3):
        rnd.shuffle(order)
        arrived = {s: grads[s] for s in order}             # dict in arrival order
        got = reduce_gradients(arrived)
        for k in want:
            assert_same_bits(got[k], want[k], f"{k} in arrival order {order}")
        assert reduce_losses({s: losses[s] for s in order}) == reduce_losses(losses)


def test_reduce_of_identical_gradients_is_that_gradient():
    # (g + g) / 2 and g / 1 are exact; for P >= 3 the running sum rounds, so no such law
    g = OrderedDict(w=np.array([0.1, -3.7, 1e-9]))
    for P in (1, 2):
        assert_same_bits(reduce_gradients({s: g for s in range(P)})["w"], g["w"], f"P={P}")


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(1, 40), elements=finite))
def test_tree_sum_zero_padding_invariance(a):
    n = len(a)
    p = 1 << (n - 1).bit_length()
    padded = np.concatenate([a, np.zeros(p - n)])
    assert tree_sum(a) == tree_sum(padded) or (tree_sum(a) == 0 and tree_sum(padded) == 0)


def test_tree_sum_of_permuted_halves():
    # swapping the two halves of a power-of-two array cannot change the result: a+b == b+a
    rng = np.random.default_rng(5)
    for n in (2, 4, 8, 64):
        a = rng.standard_normal(n) * 1e8
        swapped = np.concatenate([a[n // 2:], a[: n // 2]])
        assert tree_sum(a) == tree_sum(swapped)
