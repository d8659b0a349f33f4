"""IEEE-754 oracle: every float helper of the step against an exact oracle (Decimal / Fraction)
on edge cases, with the error bounds documented in docs/VERIFICATION.md."""
import math
import struct
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest

from daisy import detmath
from daisy.optim import pow_int
from daisy.units import QMAX, SCALE_FLOOR, epilogue, quantize_rows

getcontext().prec = 60


def ulp(x: float) -> float:
    return math.ulp(x)


def ulps_off(got: float, exact: Decimal) -> float:
    """|got - exact| in units of ulp(correctly rounded exact)."""
    ref = float(exact)
    return float(abs(Decimal(got) - exact) / Decimal(ulp(ref))) if ref != 0 else abs(got) / 5e-324


def correctly_rounded(fr: Fraction) -> float:
    """The float64 nearest to a Fraction (ties to even): Fraction -> float is exactly that."""
    return float(fr)


EXP_POINTS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-300, -1e-300, 5e-324, 1e-10, 0.34657359027997264,
              -0.34657359027997264, math.log(2), 2.0, 10.0, -10.0, 100.0, -100.0, 700.0, 709.0,
              -700.0, -707.9, -708.0, 1 / 3, -2.5, 37.5, -37.5]


@pytest.mark.parametrize("x", EXP_POINTS)
def test_exp_within_bound(x):
    got = float(detmath.exp(np.array([x]))[0])
    exact = Decimal(x).exp()
    assert ulps_off(got, exact) <= 1.5, f"exp({x!r}) = {got!r}, exact {exact}"


def test_exp_sweep_and_edges():
    xs = np.linspace(-708.0, 709.0, 4001)
    got = detmath.exp(xs)
    worst = max(ulps_off(float(g), Decimal(float(x)).exp()) for g, x in zip(got, xs))
    assert worst <= 1.5, f"worst exp error {worst} ulp"   # documented bound: < 1.5 ulp
    assert detmath.exp(np.array([-708.0001]))[0] == 0.0       # documented cut-off: +0
    assert detmath.exp(np.array([-np.inf]))[0] == 0.0
    assert detmath.exp(np.array([709.0001]))[0] == np.inf
    assert np.isnan(detmath.exp(np.array([np.nan]))[0])
    assert detmath.exp(np.array([0.0]))[0] == 1.0             # exact where the oracle is exact


LOG_POINTS = [1.0, 2.0, 0.5, 3.0, 10.0, 257.0, 1.0000000000000002, 0.9999999999999999,
              math.sqrt(2), 1 / math.sqrt(2), 1e-300, 1e300, 2.2250738585072014e-308, 1.7e308,
              7.5, 123456.789]


@pytest.mark.parametrize("x", LOG_POINTS)
def test_log_within_bound(x):
    got = float(detmath.log(np.array([x]))[0])
    exact = Decimal(x).ln()
    # near 1 the result is tiny: bound the absolute error by 1 ulp of the input-scale instead
    if exact == 0:
        assert got == 0.0
    else:
        assert ulps_off(got, exact) <= 2.0, f"log({x!r}) = {got!r}, exact {exact}"


def test_log_sweep_and_subnormal():
    xs = np.exp(np.linspace(-700, 700, 2001))
    got = detmath.log(xs)
    worst = max(ulps_off(float(g), Decimal(float(x)).ln()) for g, x in zip(got, xs) if float(x) != 1.0)
    assert worst <= 2.0, f"worst log error {worst} ulp"
    # subnormal input: frexp normalizes it, the result is still within bound
    sub = 1e-310
    assert ulps_off(float(detmath.log(np.array([sub]))[0]), Decimal(sub).ln()) <= 2.0
    assert detmath.log(np.array([1.0]))[0] == 0.0


def test_sqrt_and_rsqrt_are_correctly_rounded():
    """The norm uses 1 / sqrt(v): sqrt is IEEE-exact (correctly rounded), then one division."""
    for v in [1e-5, 2.0, 3.0, 0.1, 1e-300, 5e-324, 1e300, 0.2500000001, 123.456]:
        s = float(np.sqrt(np.float64(v)))
        # oracle: s is correctly rounded iff it brackets the true root within half an ulp
        lo, hi = Fraction(s) - Fraction(ulp(s)) / 2, Fraction(s) + Fraction(ulp(s)) / 2
        assert lo * lo <= Fraction(v) <= hi * hi, f"sqrt({v}) = {s} not correctly rounded"
        r = 1.0 / s
        assert r == correctly_rounded(Fraction(1) / Fraction(s))


@pytest.mark.parametrize("a,b", [(1.0, 3.0), (2.0, 7.0), (1e-300, 1e10), (1e300, 1e-5), (5e-324, 2.0),
                                 (-7.0, 127.0), (0.1, 0.3)])
def test_division_paths_correctly_rounded(a, b):
    """Scale s = amax / 127, q = x / s, p = e / z, lr = x / 1000: each one IEEE division."""
    assert a / b == correctly_rounded(Fraction(a) / Fraction(b))
    assert float(np.float64(a) / np.float64(b)) == correctly_rounded(Fraction(a) / Fraction(b))


def test_epilogue_is_two_roundings_in_pinned_order():
    rng = np.random.default_rng(7)
    acc = rng.integers(-66_064_384, 66_064_384, size=(6, 5)).astype(np.int32)
    sr = rng.random(6) * 1e-3
    sc = rng.random(5) * 1e-2
    got = epilogue(acc, sr, sc)
    for i in range(6):
        for j in range(5):
            step1 = correctly_rounded(Fraction(int(acc[i, j])) * Fraction(sr[i]))
            want = correctly_rounded(Fraction(step1) * Fraction(sc[j]))
            assert got[i, j] == want, f"[{i},{j}]: {got[i, j]!r} != {want!r}"


def test_int8_rounding_rule_ties_to_even_and_clamp():
    # amax 127 -> s = 1 exactly, so x / s = x: the ties below are exact ties.
    x = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.4999999999999996]])
    q, s = quantize_rows(x)
    assert s[0] == 1.0
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, -2, 126, -126, 3]]
    # values whose division rounds just above 127 are clamped, never wrap
    q, _ = quantize_rows(np.array([[1.0, -1.0, 0.99999999999999]]))
    assert q.max() <= QMAX and q.min() >= -QMAX
    # below the floor: quantized against the floor, so 1e-30 -> 0
    q, s = quantize_rows(np.array([[1e-30, -1e-30]]))
    assert s[0] == SCALE_FLOOR / QMAX and q.tolist() == [[0, 0]]


def test_pow_int_matches_exact_square_and_multiply():
    """pow_int rounds after each product; the oracle replays the same products exactly."""
    for b in (0.9, 0.999):
        for t in (0, 1, 2, 3, 10, 300, 1023, 10000):
            r = Fraction(1)
            for bit in bin(t)[2:] if t else "":
                r = Fraction(correctly_rounded(r * r))
                if bit == "1":
                    r = Fraction(correctly_rounded(r * Fraction(b)))
            assert pow_int(b, t) == float(r)
            # and close to the true power: relative error below 2 t 2^-53 (one rounding per product)
            exact = Fraction(b) ** t
            if t and exact > Fraction(1, 2**1000):                 # 0.9^10000 underflows to 0
                assert abs(Fraction(pow_int(b, t)) - exact) <= exact * Fraction(2 * t, 2**53)


def test_tree_sum_order_is_the_documented_one():
    a = np.array([1e16, 1.0, -1e16, 1.0, 3.0])         # order matters for these values
    # pad to 8: [a0..a4, 0, 0, 0] -> halves: (a0+a4, a1+0, a2+0, a3+0) -> (a0+a4+a2, a1+a3) -> sum
    l1 = [a[0] + a[4], a[1] + 0.0, a[2] + 0.0, a[3] + 0.0]
    l2 = [l1[0] + l1[2], l1[1] + l1[3]]
    assert detmath.tree_sum(a) == l2[0] + l2[1]
    bits = lambda v: struct.pack("<d", v)
    assert bits(float(detmath.tree_sum(np.array([-0.0, -0.0])))) == bits(-0.0)
