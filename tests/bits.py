"""Exact comparison of arrays: bit patterns, not values (so -0.0 != +0.0 and NaN == NaN of the
same payload), with the first mismatch named on failure."""
import numpy as np


def first_bit_mismatch(got, want):
    """None if got and want have the same shape, dtype and bytes; else a message naming the
    first mismatching index with both values (and float64 bits as hex)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype differ: got {got.shape} {got.dtype}, want {want.shape} {want.dtype}"
    g = np.ascontiguousarray(got).view(np.uint8).reshape(got.size, -1) if got.size else got
    w = np.ascontiguousarray(want).view(np.uint8).reshape(want.size, -1) if want.size else want
    bad = np.nonzero((g != w).any(axis=-1))[0] if got.size else []
    if len(bad) == 0:
        return None
    i = int(bad[0])
    idx = np.unravel_index(i, got.shape)
    gv, wv = got.reshape(-1)[i], want.reshape(-1)[i]
    msg = f"first mismatch at {tuple(int(x) for x in idx)} (flat {i}, {len(bad)} in all): got {gv!r}, want {wv!r}"
    if got.dtype == np.float64:
        msg += f" (bits {int(got.reshape(-1).view(np.uint64)[i]):016x} vs {int(want.reshape(-1).view(np.uint64)[i]):016x})"
    return msg


def assert_same_bits(got, want, what=""):
    msg = first_bit_mismatch(got, want)
    assert msg is None, f"{what}: {msg}" if what else msg
