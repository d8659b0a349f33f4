"""The GPT-style decoder, forward and backward by hand, in data-flow order.

    tokens (B, T) -> wte + wpe -> L x [x += attn(norm1(x)); x += mlp(norm2(x))] -> norm_f -> head
    -> cross-entropy

Every matmul goes through the INT8 units (daisy.units.qmatmul, straight-through in backward).
Every other float operation is an IEEE-754 basic operation in float64, in the order written
here; reductions use detmath.tree_sum. frontend_js/model.js mirrors this file function by
function. Linear weights use PyTorch's nn.Linear layout (out_features, in_features): y = x W^T.
"""
from collections import OrderedDict

import numpy as np

from . import prng
from .config import Config
from .detmath import exp, log, tree_sum
from .tokenizer import VOCAB_SIZE
from .units import qmatmul

NORM_EPS = 1e-5
EMBED_BOUND = 0.1


def param_shapes(cfg: Config) -> "OrderedDict[str, tuple]":
    """Every parameter's name and shape, in the canonical order (hash, init, checkpoint, wire).
    An OrderedDict because Python's callers (checkpoint, state codec) look shapes up by name; the JS
    twin (frontend_js/model.js) returns the same pairs as [[name, shape]]: its callers only iterate."""
    C, T, V = cfg.width, cfg.seq_len, VOCAB_SIZE
    shapes = OrderedDict()
    shapes["wte.weight"] = (V, C)
    shapes["wpe.weight"] = (T, C)
    for l in range(cfg.layers):
        p = f"blocks.{l}."
        shapes[p + "norm1.weight"] = (C,)
        shapes[p + "attn.qkv.weight"] = (3 * C, C)
        shapes[p + "attn.proj.weight"] = (C, C)
        shapes[p + "norm2.weight"] = (C,)
        shapes[p + "mlp.fc.weight"] = (4 * C, C)
        shapes[p + "mlp.proj.weight"] = (C, 4 * C)
    shapes["norm_f.weight"] = (C,)
    shapes["head.weight"] = (V, C)
    return shapes


def param_count(cfg: Config) -> int:
    """How many parameters the model of cfg has (every tensor of param_shapes): the one count."""
    return sum(int(np.prod(shape)) for shape in param_shapes(cfg).values())


def init_bound(name: str, shape: tuple, cfg: Config) -> float:
    """Half-width of the uniform init. 0 means the constant 1.0 (norm gains)."""
    if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm_f.weight":
        return 0.0
    if name in ("wte.weight", "wpe.weight"):
        return EMBED_BOUND
    bound = 1.0 / np.sqrt(float(shape[1]))                     # 1/sqrt(fan_in)
    if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
        bound = bound / np.sqrt(float(2 * cfg.layers))         # residual branches, as GPT-2
    return float(bound)


def init_params(cfg: Config) -> "OrderedDict[str, np.ndarray]":
    """Seeded init: parameter p, element i (row-major) = (2 u - 1) * bound,
    u = prng.uniform(prng.key(PURPOSE_INIT, seed, p), i)."""
    params = OrderedDict()
    for p, (name, shape) in enumerate(param_shapes(cfg).items()):
        bound = init_bound(name, shape, cfg)
        n = int(np.prod(shape))
        if bound == 0.0:
            params[name] = np.ones(shape)
            continue
        u = prng.uniform(prng.key(prng.PURPOSE_INIT, cfg.seed, p), np.arange(n, dtype=np.uint32))
        params[name] = ((u * 2.0 - 1.0) * bound).reshape(shape)
    return params


# --- the pieces, each with its backward ---------------------------------------------------

def rmsnorm(x, g):
    """x (N, C), g (C,) -> y (N, C). r = 1 / sqrt(tree_sum(x*x)/C + eps); y = (x * r) * g."""
    C = x.shape[-1]
    ms = tree_sum(x * x, axis=-1) / float(C)                  # (N,)
    r = 1.0 / np.sqrt(ms + NORM_EPS)                          # (N,)
    xhat = x * r[:, None]                                     # (N, C)
    return xhat * g[None, :], (xhat, r)


def rmsnorm_backward(dy, g, cache):
    """dy (N, C) -> dx (N, C), dg (C,)."""
    xhat, r = cache
    C = dy.shape[-1]
    dg = tree_sum(dy * xhat, axis=0)                          # (C,) summed over rows n = 0..N-1
    dxhat = dy * g[None, :]                                   # (N, C)
    dot = tree_sum(dxhat * xhat, axis=-1)                     # (N,)
    dx = (dxhat - xhat * (dot / float(C))[:, None]) * r[:, None]
    return dx, dg


def causal_softmax(s):
    """s (..., T, T) -> p: row i over columns j <= i; masked entries are exactly +0."""
    T = s.shape[-1]
    keep = np.tril(np.ones((T, T), dtype=bool))               # (T, T)
    m = np.max(np.where(keep, s, -np.inf), axis=-1)           # (..., T) exact
    e = np.where(keep, exp(s - m[..., None]), 0.0)            # (..., T, T)
    z = tree_sum(e, axis=-1)                                  # (..., T) over all T columns
    return e / z[..., None]


def softmax_backward(dp, p):
    """dp, p (..., T, T) -> ds = p * (dp - tree_sum(dp * p))."""
    t = tree_sum(dp * p, axis=-1)                             # (..., T)
    return p * (dp - t[..., None])


def cross_entropy(logits, targets):
    """logits (N, V), targets (N,) -> mean loss, dlogits (N, V).
    loss_n = (m + log z) - logit[target]; total = tree_sum(loss_n) / N;
    dlogits = (softmax - onehot) / N."""
    N = logits.shape[0]
    m = np.max(logits, axis=-1)                               # (N,)
    e = exp(logits - m[:, None])                              # (N, V)
    z = tree_sum(e, axis=-1)                                  # (N,)
    rows = np.arange(N)
    loss_n = (m + log(z)) - logits[rows, targets]             # (N,)
    loss = float(tree_sum(loss_n) / float(N))
    dlogits = e / z[:, None]                                  # (N, V) softmax
    dlogits[rows, targets] = dlogits[rows, targets] - 1.0
    return loss, dlogits / float(N)


def embedding_backward(dx, idx, V):
    """dx (N, C), idx (N,) -> dwte (V, C): row idx[n] += dx[n], for n ascending.
    Vectorized by occurrence rank: the r-th occurrences of all tokens are added in pass r, so
    each row still accumulates its occurrences in ascending n."""
    N, C = dx.shape
    dwte = np.zeros((V, C))
    order = np.argsort(idx, kind="stable")                    # (N,) grouped by token, n ascending
    sorted_tok = idx[order]
    first = np.searchsorted(sorted_tok, sorted_tok, side="left")
    rank = np.arange(N) - first                               # occurrence number of each n
    for r in range(int(rank.max()) + 1 if N else 0):
        sel = order[rank == r]                                # distinct tokens in this pass
        dwte[idx[sel]] = dwte[idx[sel]] + dx[sel]
    return dwte


# --- the model --------------------------------------------------------------------------------

def float_matmul(a, b):
    """Unquantized float64 matmul: ONLY for the comparison runs of the tests (float BLAS has no
    pinned order, so it never enters a real step)."""
    return np.matmul(a, b)


def forward(params, cfg: Config, idx, targets=None, mm=qmatmul):
    """idx (B, T) int -> logits (B*T, V); with targets (B, T): (loss, cache) for backward.
    mm is the matmul: qmatmul (the INT8 unit, always in training) or float_matmul (tests)."""
    B, T = idx.shape
    C, H, L = cfg.width, cfg.heads, cfg.layers
    D = C // H
    N = B * T
    att_scale = 1.0 / np.sqrt(float(D))
    flat = idx.reshape(N)
    x = params["wte.weight"][flat] + np.tile(params["wpe.weight"][:T], (B, 1))   # (N, C)
    caches = []
    for l in range(L):
        p = f"blocks.{l}."
        xn1, n1 = rmsnorm(x, params[p + "norm1.weight"])                   # (N, C)
        qkv = mm(xn1, params[p + "attn.qkv.weight"].T)                 # (N, 3C)
        qkv = qkv.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)          # (3, B, H, T, D)
        q, k, v = qkv[0], qkv[1], qkv[2]                                   # (B, H, T, D)
        s = mm(q, np.swapaxes(k, -1, -2)) * att_scale                 # (B, H, T, T)
        pr = causal_softmax(s)                                             # (B, H, T, T)
        yh = mm(pr, v)                                                # (B, H, T, D)
        y = yh.transpose(0, 2, 1, 3).reshape(N, C)                          # (N, C)
        x = x + mm(y, params[p + "attn.proj.weight"].T)                # (N, C)
        xn2, n2 = rmsnorm(x, params[p + "norm2.weight"])                   # (N, C)
        h = mm(xn2, params[p + "mlp.fc.weight"].T)                     # (N, 4C)
        hr = np.maximum(h, 0.0)                                            # (N, 4C) ReLU
        x = x + mm(hr, params[p + "mlp.proj.weight"].T)                # (N, C)
        caches.append((xn1, n1, q, k, v, pr, y, xn2, n2, h, hr))
    xf, nf = rmsnorm(x, params["norm_f.weight"])                           # (N, C)
    logits = mm(xf, params["head.weight"].T)                          # (N, V)
    if targets is None:
        return logits
    loss, dlogits = cross_entropy(logits, targets.reshape(N))
    return loss, (idx, caches, xf, nf, dlogits, att_scale, mm)


def backward(params, cfg: Config, cache):
    """The gradient of the mean loss w.r.t. every parameter, in canonical order."""
    idx, caches, xf, nf, dlogits, att_scale, mm = cache
    B, T = idx.shape
    C, H, L = cfg.width, cfg.heads, cfg.layers
    D = C // H
    N = B * T
    g = {}
    g["head.weight"] = mm(dlogits.T, xf)                              # (V, C)
    dxf = mm(dlogits, params["head.weight"])                          # (N, C)
    dx, g["norm_f.weight"] = rmsnorm_backward(dxf, params["norm_f.weight"], nf)
    for l in reversed(range(L)):
        p = f"blocks.{l}."
        xn1, n1, q, k, v, pr, y, xn2, n2, h, hr = caches[l]
        # MLP branch: x += proj(relu(fc(norm2(x))))
        g[p + "mlp.proj.weight"] = mm(dx.T, hr)                       # (C, 4C)
        dhr = mm(dx, params[p + "mlp.proj.weight"])                   # (N, 4C)
        dh = np.where(h > 0.0, dhr, 0.0)                                   # (N, 4C)
        g[p + "mlp.fc.weight"] = mm(dh.T, xn2)                        # (4C, C)
        dxn2 = mm(dh, params[p + "mlp.fc.weight"])                    # (N, C)
        dxb, g[p + "norm2.weight"] = rmsnorm_backward(dxn2, params[p + "norm2.weight"], n2)
        dx = dx + dxb
        # attention branch: x += proj(attn(qkv(norm1(x))))
        g[p + "attn.proj.weight"] = mm(dx.T, y)                       # (C, C)
        dy = mm(dx, params[p + "attn.proj.weight"])                   # (N, C)
        dyh = dy.reshape(B, T, H, D).transpose(0, 2, 1, 3)                 # (B, H, T, D)
        dpr = mm(dyh, np.swapaxes(v, -1, -2))                         # (B, H, T, T)
        dv = mm(np.swapaxes(pr, -1, -2), dyh)                         # (B, H, T, D)
        ds = softmax_backward(dpr, pr) * att_scale                         # (B, H, T, T)
        dq = mm(ds, k)                                                # (B, H, T, D)
        dk = mm(np.swapaxes(ds, -1, -2), q)                           # (B, H, T, D)
        dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(N, 3 * C)  # (N, 3C)
        g[p + "attn.qkv.weight"] = mm(dqkv.T, xn1)                    # (3C, C)
        dxn1 = mm(dqkv, params[p + "attn.qkv.weight"])                # (N, C)
        dxb, g[p + "norm1.weight"] = rmsnorm_backward(dxn1, params[p + "norm1.weight"], n1)
        dx = dx + dxb
    g["wpe.weight"] = tree_sum(dx.reshape(B, T, C), axis=0)                # (T, C) over b
    g["wte.weight"] = embedding_backward(dx, idx.reshape(N), VOCAB_SIZE)   # (V, C)
    return OrderedDict((name, g[name]) for name in params)


def loss_and_grads(params, cfg: Config, idx, targets, mm=qmatmul):
    """One peer's contribution to a step: (mean loss over its B*T tokens, gradients)."""
    loss, cache = forward(params, cfg, idx, targets, mm)
    return loss, backward(params, cfg, cache)
