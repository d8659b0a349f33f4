"""Deterministic float helpers built from IEEE-754 basic operations only (+ - * / sqrt).

Everything here is float64, elementwise on numpy arrays (numpy's elementwise + - * / sqrt are
correctly rounded), and mirrored operation for operation in frontend_js/detmath.js.
Never use np.exp / np.log / np.sum / np.mean on floats in the step: their results or their
reduction order are implementation details. Error bounds are in docs/VERIFICATION.md and
checked against exact oracles in tests/test_ieee_oracle.py.
"""
import numpy as np

LN2_HI = 0.6931471803691238        # fdlibm ln2_hi 0x3fe62e42fee00000: low 21 bits zero, k*LN2_HI exact for |k| < 2^21
LN2_LO = 1.9082149292705877e-10    # fdlibm ln2_lo 0x3dea39ef35793c76: ln 2 - LN2_HI to double precision
INV_LN2 = 1.4426950408889634       # 1 / ln 2, rounded
EXP_MIN = -708.0                   # below this exp() returns +0 (keeps results normal)
EXP_MAX = 709.0                    # above this exp() returns +inf

# Polynomial coefficients, computed (not typed): n! and 2n+1 are exact in float64 for these n,
# so each coefficient is one correctly rounded division in every implementation.
EXP_COEFFS = tuple(1.0 / float(_f) for _f in (1, 1, 2, 6, 24, 120, 720, 5040, 40320, 362880,
                                              3628800, 39916800, 479001600, 6227020800))  # 1/n!, n=0..13
LOG_COEFFS = tuple(1.0 / (2 * n + 1) for n in range(12))                                 # 1/(2n+1), n=0..11
SQRT_HALF = 0.7071067811865476


def rint(x):
    """Round to nearest, ties to even (the one rounding rule of the int8 quantizer)."""
    return np.rint(x)


def exp(x):
    """e^x for float64 x. Range reduction x = k ln2 + r (|r| <= ln2/2, Cody-Waite two-part ln2),
    Taylor polynomial of degree 13 in Horner form, then an exact scaling by 2^k."""
    x = np.asarray(x, dtype=np.float64)
    xc = np.minimum(np.maximum(x, EXP_MIN), EXP_MAX)          # NaN stays NaN
    k = np.rint(xc * INV_LN2)                                 # integer-valued float, |k| <= 1023
    r = (xc - k * LN2_HI) - k * LN2_LO
    p = np.full_like(r, EXP_COEFFS[13])
    for c in EXP_COEFFS[12::-1]:                              # p = p * r + c, in place
        np.multiply(p, r, out=p)
        np.add(p, c, out=p)
    out = np.ldexp(p, np.nan_to_num(k).astype(np.int64))      # exact: result stays normal
    out = np.where(x < EXP_MIN, 0.0, out)
    out = np.where(x > EXP_MAX, np.inf, out)
    return out


def log(x):
    """ln x for positive normal float64 x. x = m 2^e with m in [sqrt(1/2), sqrt(2));
    ln m = 2 atanh(f), f = (m-1)/(m+1), series to f^23; ln x = e LN2_HI + (e LN2_LO + ln m)."""
    x = np.asarray(x, dtype=np.float64)
    m, e = np.frexp(x)                                        # x = m 2^e, m in [0.5, 1)
    small = m < SQRT_HALF
    m = np.where(small, m * 2.0, m)                           # exact
    e = np.where(small, e - 1, e).astype(np.float64)
    f = (m - 1.0) / (m + 1.0)
    f2 = f * f
    s = np.full_like(f, LOG_COEFFS[11])
    for c in LOG_COEFFS[10::-1]:
        s = s * f2 + c
    lnm = (f * 2.0) * s
    return e * LN2_HI + (e * LN2_LO + lnm)


def tree_sum(a, axis=-1):
    """The one float reduction: pad the axis with +0.0 to a power of two, then repeatedly add
    the upper half onto the lower half (a[i] + a[i + n/2]) until one element is left."""
    a = np.moveaxis(np.asarray(a, dtype=np.float64), axis, -1)
    n = a.shape[-1]
    p = 1
    while p < n:
        p *= 2
    if p != n:
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (p - n,))], axis=-1)
    while p > 1:
        p //= 2
        a = a[..., :p] + a[..., p:]
    return a[..., 0]
