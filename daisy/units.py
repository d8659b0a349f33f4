"""The INT8 units: every matmul of the forward and backward pass goes through `qmatmul`.

    qmatmul(A, B) = epilogue(gemm_i8(quantize_rows(A), quantize_cols(B)))

1. Block-scaled quantization, per row of the left operand and per column of the right:
       s = max(max|x|, SCALE_FLOOR) / 127          (float64, one division)
       q = clamp(rint(x / s), -127, 127)            (rint: round half to even; the only rule)
2. int8 x int8 products accumulated exactly in int32. The sum is computed here through float64
   BLAS, which is exact because every partial sum is an integer of magnitude <= K*127^2 < 2^53,
   and it fits int32 because K <= MAX_K (docs/VERIFICATION.md has the bound for the settings).
3. The pinned float epilogue:  out[i, j] = (float64(acc[i, j]) * s_row[i]) * s_col[j].
The backward pass uses the same units with the straight-through estimator: the quantizer's
gradient is taken as the identity, so dX = qmatmul(dY, W^T-side) and dW = qmatmul(X^T, dY).
JS twin: frontend_js/units.js.
"""
import numpy as np

QMAX = 127
SCALE_FLOOR = 2.0 ** -60        # rows with max|x| below this quantize against the floor
MAX_K = (2**31 - 1) // (QMAX * QMAX)     # 133,144: largest K with no int32 overflow


def quantize_rows(x):
    """(..., M, K) float64 -> q (..., M, K) int8, s (..., M) float64: one scale per row."""
    x = np.asarray(x, dtype=np.float64)
    amax = np.max(np.abs(x), axis=-1)                         # (..., M) exact, order-free
    s = np.maximum(amax, SCALE_FLOOR) / QMAX                  # (..., M)
    q = np.clip(np.rint(x / s[..., None]), -QMAX, QMAX)       # (..., M, K)
    return q.astype(np.int8), s


def quantize_cols(x):
    """(..., K, N) float64 -> q (..., K, N) int8, s (..., N): one scale per column."""
    q, s = quantize_rows(np.swapaxes(x, -1, -2))
    return np.swapaxes(q, -1, -2), s


def gemm_i8(qa, qb):
    """int8 (..., M, K) @ int8 (..., K, N) -> int32 (..., M, N), exact."""
    K = qa.shape[-1]
    assert qb.shape[-2] == K, (qa.shape, qb.shape)
    assert K <= MAX_K, f"K={K} could overflow int32"
    acc = np.matmul(qa.astype(np.float64), qb.astype(np.float64))   # exact: |partial| < 2^53
    return acc.astype(np.int32)


def epilogue(acc, s_row, s_col):
    """int32 (..., M, N), (..., M), (..., N) -> float64 (..., M, N): (acc * s_row) * s_col."""
    return (acc.astype(np.float64) * s_row[..., :, None]) * s_col[..., None, :]


def qmatmul(a, b):
    """float64 (..., M, K) @ (..., K, N) through the INT8 unit -> float64 (..., M, N)."""
    qa, sa = quantize_rows(a)
    qb, sb = quantize_cols(b)
    return epilogue(gemm_i8(qa, qb), sa, sb)
