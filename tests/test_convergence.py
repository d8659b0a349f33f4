"""Convergence: default config, 2 peers, 300 steps on the built-in corpus. The INT8 run's final
loss is within 5% of a float64 run of the same model (same init, data and Adam, no
quantization) and far below ln(vocab) = ln 257 = 5.55.

"Final loss" = the mean training loss of the last 20 steps (one number per run, less noisy
than a single batch). The two runs are independent: each in its own process, side by side."""
import math
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from daisy import data
from daisy.config import Config
from daisy.model import float_matmul
from daisy.train import Group

pytestmark = pytest.mark.slow

MARGIN = 0.05


def run(unit: str):
    """300 steps with the INT8 unit (unit 'int8') or plain float64 matmuls ('float64')."""
    group = Group(Config(), 2, data.builtin_stream(), mm=float_matmul) if unit == "float64" else Group(Config(), 2, data.builtin_stream())
    losses = []
    for _ in range(300):
        step, loss, hashes = group.step()
        assert hashes[0] == hashes[1], f"step {step}: replicas differ"
        losses.append(loss)
    return losses


def test_int8_run_tracks_float64_run():
    with ProcessPoolExecutor(max_workers=2) as pool:
        q, f = pool.map(run, ["int8", "float64"])
    final_q, final_f = float(np.mean(q[-20:])), float(np.mean(f[-20:]))
    print(f"final loss: int8 {final_q:.4f}, float64 {final_f:.4f}, first {q[0]:.4f}")
    assert abs(final_q - final_f) <= MARGIN * final_f, (final_q, final_f)
    assert final_q < 0.6 * math.log(257), final_q
    assert q[0] > 0.9 * math.log(257) > final_q           # it started near chance and fell
