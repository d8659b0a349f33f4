"""The INT8 units in forward AND backward equal an exact integer oracle (pure Python ints for
the GEMM, Fractions for the epilogue), and the model's dX / dW really go through them."""
from fractions import Fraction

import numpy as np

from daisy.config import Config
from daisy.model import backward, forward, init_params, rmsnorm_backward
from daisy.units import MAX_K, QMAX, epilogue, gemm_i8, quantize_cols, quantize_rows, qmatmul
from bits import assert_same_bits


def int_oracle(qa, qb):
    """Exact integer matmul with Python ints."""
    M, K = qa.shape
    N = qb.shape[1]
    A, B = qa.astype(int).tolist(), qb.astype(int).tolist()
    return [[sum(A[i][k] * B[k][j] for k in range(K)) for j in range(N)] for i in range(M)]


def assert_int_equal(got, want, what):
    got = np.asarray(got).tolist()
    for i, (gr, wr) in enumerate(zip(got, want)):
        for j, (g, w) in enumerate(zip(gr, wr)):
            assert g == w, f"{what}: first mismatch at [{i},{j}]: got {g}, oracle {w}"


def oracle_qmatmul(a, b):
    qa, sa = quantize_rows(a)
    qb, sb = quantize_cols(b)
    acc = int_oracle(qa, qb)
    return np.array([[float(Fraction(float(Fraction(acc[i][j]) * Fraction(sa[i]))) * Fraction(sb[j]))
                      for j in range(len(acc[0]))] for i in range(len(acc))])


def test_gemm_equals_integer_oracle_on_extremes():
    rng = np.random.default_rng(3)
    for M, K, N in [(1, 1, 1), (7, 13, 5), (4, 4096, 3)]:
        qa = rng.integers(-QMAX, QMAX + 1, size=(M, K)).astype(np.int8)
        qb = rng.integers(-QMAX, QMAX + 1, size=(K, N)).astype(np.int8)
        if K == 4096:                                     # the largest K of the settings: B*T
            qa[:] = QMAX
            qb[:] = -QMAX
        assert_int_equal(gemm_i8(qa, qb), int_oracle(qa, qb), f"gemm {M}x{K}x{N}")
    # the bound: the largest K the model uses (batch 32 * seq 128 in dW) stays far below MAX_K
    assert 32 * 128 * QMAX * QMAX < 2**31 - 1 and 32 * 128 <= MAX_K


def test_model_dx_and_dw_go_through_the_units():
    cfg = Config(width=16, heads=2, seq_len=16, batch=2, layers=1)
    params = init_params(cfg)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 257, size=(2, 16))
    y = rng.integers(0, 257, size=(2, 16))
    loss, cache = forward(params, cfg, x, y)
    g = backward(params, cfg, cache)
    _, _, xf, _, dlogits, _, _ = cache
    # head: dW = dlogits^T @ xf and dX = dlogits @ W, both through the INT8 unit
    want_dw = oracle_qmatmul(dlogits.T, xf)
    assert_same_bits(g["head.weight"], want_dw, "head dW vs the integer oracle")
    want_dx = oracle_qmatmul(dlogits, params["head.weight"])
    assert_same_bits(qmatmul(dlogits, params["head.weight"]), want_dx, "head dX")
    # and the last block's MLP weights, from the gradient that reaches them
    _, nf = cache[2], cache[3]
    xn1, n1, q, k, v, pr, yatt, xn2, n2, h, hr = cache[1][0]
    dx, _ = rmsnorm_backward(qmatmul(dlogits, params["head.weight"]), params["norm_f.weight"], nf)
    assert_same_bits(g["blocks.0.mlp.proj.weight"], oracle_qmatmul(dx.T, hr), "mlp.proj dW")
    dh = np.where(h > 0.0, qmatmul(dx, params["blocks.0.mlp.proj.weight"]), 0.0)
    assert_same_bits(g["blocks.0.mlp.fc.weight"], oracle_qmatmul(dh.T, xn2), "mlp.fc dW")


def test_straight_through_estimator_units_on_transposes():
    """dW = qmatmul(dY^T, X): the left operand is quantized per row of dY^T, i.e. per output
    channel over all B*T tokens; checked against the oracle on a ragged shape."""
    rng = np.random.default_rng(11)
    dY = rng.standard_normal((37, 6))
    X = rng.standard_normal((37, 5))
    assert_same_bits(qmatmul(dY.T, X), oracle_qmatmul(dY.T, X), "dW")
    W = rng.standard_normal((6, 5))
    assert_same_bits(qmatmul(dY, W), oracle_qmatmul(dY, W), "dX")
