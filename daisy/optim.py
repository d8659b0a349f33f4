"""Deterministic Adam (and plain SGD, the tests' baseline). Elementwise float64, pinned order:

    m = B1*m + OMB1*g
    v = B2*v + OMB2*(g*g)
    w = w - lr * ((m / (1 - B1^t)) / (sqrt(v / (1 - B2^t)) + EPS))

with B^t by pow_int (square-and-multiply from the top bit), t = 1 at the first step.
JS twin: frontend_js/optim.js.
"""
from collections import OrderedDict

import numpy as np

B1, OMB1 = 0.9, 0.1          # OMB = "one minus beta", written as literals, not computed
B2, OMB2 = 0.999, 0.001
EPS = 1e-8


def pow_int(b: float, t: int) -> float:
    """b^t for integer t >= 0: r = 1; for each bit of t from the top: r = r*r, then r = r*b if set."""
    r = 1.0
    for bit in bin(t)[2:] if t > 0 else "":
        r = r * r
        if bit == "1":
            r = r * b
    return r


def adam_init(params):
    zeros = lambda: OrderedDict((k, np.zeros_like(v)) for k, v in params.items())
    return {"t": 0, "m": zeros(), "v": zeros()}


def adam_step(params, grads, state, lr: float):
    """Update params and state in place (t becomes t + 1)."""
    t = state["t"] + 1
    bc1 = 1.0 - pow_int(B1, t)
    bc2 = 1.0 - pow_int(B2, t)
    for name, w in params.items():
        g = grads[name]
        m = B1 * state["m"][name] + OMB1 * g
        v = B2 * state["v"][name] + OMB2 * (g * g)
        state["m"][name], state["v"][name] = m, v
        params[name] = w - lr * ((m / bc1) / (np.sqrt(v / bc2) + EPS))
    state["t"] = t
