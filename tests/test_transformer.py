"""The transformer's hand-written backward: float64 path against central finite differences;
the INT8 path close to the float path."""
import numpy as np

from daisy.config import Config
from daisy.model import float_matmul, forward, init_params, loss_and_grads

CFG = Config(width=16, heads=2, seq_len=16, batch=2, layers=2, seed=5)


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 257, size=(2, 16)), rng.integers(0, 257, size=(2, 16))


def test_float64_gradients_match_finite_differences():
    params = init_params(CFG)
    x, y = batch()
    _, grads = loss_and_grads(params, CFG, x, y, mm=float_matmul)
    rng = np.random.default_rng(1)
    h = 1e-6
    for name, w in params.items():
        flat = w.reshape(-1)
        picks = rng.choice(flat.size, size=min(6, flat.size), replace=False)
        for i in picks:
            old = flat[i]
            flat[i] = old + h
            lp, _ = forward(params, CFG, x, y, mm=float_matmul)
            flat[i] = old - h
            lm, _ = forward(params, CFG, x, y, mm=float_matmul)
            flat[i] = old
            fd = (lp - lm) / (2 * h)
            an = grads[name].reshape(-1)[i]
            assert abs(fd - an) <= 1e-6 + 1e-4 * abs(fd), f"{name}[{i}]: analytic {an!r}, finite diff {fd!r}"


def test_int8_path_close_to_float_path():
    params = init_params(CFG)
    x, y = batch(2)
    lq, gq = loss_and_grads(params, CFG, x, y)
    lf, gf = loss_and_grads(params, CFG, x, y, mm=float_matmul)
    assert abs(lq - lf) <= 0.01 * lf, f"int8 loss {lq} vs float {lf}"
    for name in params:
        a, b = gq[name].reshape(-1), gf[name].reshape(-1)
        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))
        assert cos > 0.95, f"{name}: int8 vs float gradient cosine {cos:.4f}"


def test_logits_shape_and_causality_of_the_float_path():
    params = init_params(CFG)
    x, _ = batch(3)
    logits = forward(params, CFG, x, mm=float_matmul).reshape(2, 16, -1)
    assert logits.shape == (2, 16, 257)
    x2 = x.copy()
    x2[:, 10:] = (x2[:, 10:] + 1) % 257                       # change only the future
    logits2 = forward(params, CFG, x2, mm=float_matmul).reshape(2, 16, -1)
    assert np.allclose(logits[:, :10], logits2[:, :10], rtol=0, atol=1e-12)
    assert not np.allclose(logits[:, 10:], logits2[:, 10:])
