"""Deterministic Adam: replicas fed the same reduced gradients stay identical; Adam beats SGD."""
import copy

import numpy as np

from daisy.config import Config
from daisy.hashing import weight_hash
from daisy.model import init_params, loss_and_grads
from daisy.optim import adam_init, adam_step
from bits import assert_same_bits

CFG = Config(width=16, heads=2, seq_len=16, batch=4, layers=1, seed=9)


def fixed_batches(n):
    rng = np.random.default_rng(4)
    text = np.frombuffer(b"the cat sat on the mat and the dog sat on the log. " * 20, dtype=np.uint8)
    out = []
    for _ in range(n):
        s = rng.integers(0, len(text) - 17, size=4)
        w = np.stack([text[i:i + 17] for i in s]).astype(np.int64)
        out.append((w[:, :-1], w[:, 1:]))
    return out


def test_replicas_with_same_gradients_stay_bit_identical():
    base = init_params(CFG)
    replicas = [copy.deepcopy(base) for _ in range(3)]
    states = [adam_init(base) for _ in range(3)]
    for x, y in fixed_batches(8):
        _, g = loss_and_grads(replicas[0], CFG, x, y)
        for p, s in zip(replicas, states):
            adam_step(p, g, s, CFG.lr)
        hashes = [weight_hash(p) for p in replicas]
        assert len(set(hashes)) == 1, hashes
        for name in base:
            for r in replicas[1:]:
                assert_same_bits(r[name], replicas[0][name], name)
    assert states[0]["t"] == 8


def sgd_step(params, grads, lr: float):
    """Plain SGD: the baseline Adam must beat (the trainer itself has only Adam)."""
    for name, w in params.items():
        params[name] = w - lr * grads[name]


def train(step_fn, n=60):
    params = init_params(CFG)
    state = adam_init(params)
    batches = fixed_batches(n)
    for x, y in batches:
        _, g = loss_and_grads(params, CFG, x, y)
        step_fn(params, g, state)
    x, y = batches[-1]
    return loss_and_grads(params, CFG, x, y)[0]


def test_adam_reaches_lower_loss_than_sgd():
    adam = train(lambda p, g, s: adam_step(p, g, s, 0.01))
    sgd_same_lr = train(lambda p, g, s: sgd_step(p, g, 0.01))
    sgd_big_lr = train(lambda p, g, s: sgd_step(p, g, 0.5))
    assert adam < sgd_same_lr and adam < sgd_big_lr, (adam, sgd_same_lr, sgd_big_lr)
    assert adam < 3.0, adam
