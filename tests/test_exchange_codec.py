"""The exchange codec (daisy/exchange_codec.py, docs/VERIFICATION.md §12): int8's rule (scales,
codes, unbiased keyed rounding), messages as pure functions of their inputs, block-aligned shards
(a shard's message is a byte slice of the whole's), G identical in both topologies, the decoder's
refusals, and the setting (config, CLI, checkpoints). The JS twin is checked against the
fixtures (tests/js/exchange_codec.test.mjs) and the CLIs (tests/test_js_mirror.py)."""
import subprocess
import sys

import numpy as np
import pytest

from daisy import data
from daisy.collective import ALL_GATHER, REDUCE_SCATTER, SimulatedCollective, codec_reduce
from daisy.config import Config, ConfigError
from daisy.exchange_codec import BLOCK, CodecError, codec_for
from daisy.model import init_params, loss_and_grads, param_shapes
from daisy.train import Group
from tests.bits import assert_same_bits

INT8, F64 = codec_for("int8"), codec_for("f64")
SMALL = Config(width=16, heads=2, seq_len=16, batch=2, layers=1, seed=77, exchange="int8")
SEED = 20261204


def values(n, seed=SEED):
    print(f"values seed {seed}")
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * np.exp2(rng.integers(-30, 5, n).astype(np.float64))


def split(message, n):
    """int8 message -> (scales float64 (nb,), codes int8 (n,))."""
    raw = np.frombuffer(message, dtype=np.uint8)
    scales, codes, at = [], [], 0
    for j in range(-(-n // BLOCK)):
        k = min(BLOCK, n - j * BLOCK)
        scales.append(float(raw[at:at + 4].view("<f4")[0]))
        codes.append(raw[at + 4:at + 4 + k].view(np.int8))
        at += 4 + k
    return np.array(scales), np.concatenate(codes)


def test_int8_rule_scales_codes_and_decode():
    x = values(3 * BLOCK + 17)
    msg = INT8.encode(x, seed=1, step=2, slot=3, offset=0)
    assert len(msg) == 4 * 4 + len(x) == INT8.message_bytes(len(x))
    scales, codes = split(msg, len(x))
    for j, s in enumerate(scales):
        block = x[j * BLOCK:(j + 1) * BLOCK]
        m = np.abs(block).max()
        assert np.float32(s) == s and s >= m, (j, s, m)                 # a float32, rounded up
        assert np.nextafter(np.float32(s), np.float32(0)) < m          # the smallest such
        y = (block * 127.0) / s
        q = codes[j * BLOCK:(j + 1) * BLOCK].astype(np.float64)
        assert np.all((q == np.floor(y)) | (q == np.floor(y) + 1)), j  # floor or one up
    assert codes.min() >= -127 and codes.max() <= 127
    s_el = np.repeat(scales, BLOCK)[:len(x)]
    assert_same_bits(INT8.decode(msg, len(x)), (codes.astype(np.float64) * s_el) / 127.0)


def test_int8_rounding_is_unbiased_and_keyed():
    """Over 4,000 steps (each its own keyed stream) the mean decoded value of each element is
    within 4 standard errors of the value; the rounding of one step does not depend on another."""
    x = values(BLOCK, seed=SEED + 1)
    x[0] = np.abs(x).max() * 1.5                                      # the block's max
    steps = 4000
    acc = np.zeros(len(x))
    for step in range(steps):
        acc += INT8.decode(INT8.encode(x, seed=5, step=step, slot=1, offset=0), len(x))
    d = (np.float64(np.float32(np.abs(x).max())) / 127.0)             # one code step (about)
    err = np.abs(acc / steps - x)
    bound = 4 * 0.5 * d / np.sqrt(steps) + 1e-12
    assert np.all(err <= bound), (float(err.max()), bound)


def test_a_message_is_a_pure_function_of_its_inputs():
    x = values(1000)
    a = INT8.encode(x, seed=1, step=7, slot=2, offset=256)
    assert a == INT8.encode(x.copy(), seed=1, step=7, slot=2, offset=256)
    for other in [dict(seed=2, step=7, slot=2), dict(seed=1, step=8, slot=2), dict(seed=1, step=7, slot=3)]:
        assert INT8.encode(x, offset=256, **other) != a, other


def test_shard_messages_are_slices_of_the_whole_and_bounds_fall_on_blocks():
    N = 10 * BLOCK + 77
    x = values(N)
    whole = INT8.encode(x, seed=3, step=4, slot=1, offset=0)
    for P in range(1, 15):
        b = INT8.shard_bounds(N, P)
        assert b[0] == 0 and b[-1] == N and all(u <= v for u, v in zip(b, b[1:]))
        assert all(v % BLOCK == 0 for v in b[:-1]), b
        for lo, hi in zip(b, b[1:]):
            part = INT8.encode(x[lo:hi], seed=3, step=4, slot=1, offset=lo)
            at = lo // BLOCK * (BLOCK + 4)
            assert part == whole[at:at + len(part)], (P, lo, hi)
    assert F64.shard_bounds(10, 3) == [0, 3, 6, 10]                   # f64 keeps today's cut


@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 6])
def test_int8_G_is_the_same_in_both_topologies(P):
    params = init_params(SMALL)
    stream = data.builtin_stream()
    shapes = param_shapes(SMALL)
    contrib = {}
    for slot in range(P):
        x, y = data.get_batch(stream, SMALL.seed, 0, slot, SMALL.batch, SMALL.seq_len)
        contrib[slot] = loss_and_grads(params, SMALL, x, y)
    outs = {}
    for topology in (ALL_GATHER, REDUCE_SCATTER):
        c = SimulatedCollective(shapes, seed=SMALL.seed, exchange="int8", topology=topology)
        handles = [c.exchange(0, list(range(P)), s, *contrib[s]) for s in range(P)]
        outs[topology] = handles[0].result()[1]
    for name in shapes:
        assert_same_bits(outs[REDUCE_SCATTER][name], outs[ALL_GATHER][name], f"P={P} {name}")
    # the data has teeth: int8's G is not f64's
    fc = SimulatedCollective(shapes, seed=SMALL.seed)
    hs = [fc.exchange(0, list(range(P)), s, *contrib[s]) for s in range(P)]
    assert any(not np.array_equal(hs[0].result()[1][n], outs[ALL_GATHER][n]) for n in shapes)


def test_codec_reduce_f64_is_the_slot_ordered_mean():
    flats = [values(999, seed=SEED + s) for s in range(4)]
    want = ((flats[0] + flats[1]) + flats[2]) + flats[3]
    for topology in (ALL_GATHER, REDUCE_SCATTER):
        assert_same_bits(codec_reduce(F64, flats, seed=1, step=0, topology=topology), want / 4.0, topology)


GOOD = INT8.encode(values(300), seed=1, step=1, slot=0, offset=0)


def edited(at, new):
    b = bytearray(GOOD)
    b[at:at + len(new)] = new
    return bytes(b)


@pytest.mark.parametrize("message,n,why", [
    (GOOD[:-1], 300, "int8 message of 307 bytes, expected 308 for 300 values in 2 blocks of 256"),
    (GOOD, 257, "int8 message of 308 bytes, expected 265 for 257 values in 2 blocks of 256"),
    (edited(0, np.array([-1.0], "<f4").tobytes()), 300, "block 0: scale (float32 bits 0xbf800000) is out of range"),
    (edited(260, np.array([np.nan], "<f4").tobytes()), 300, "block 1: scale (float32 bits 0x7fc00000) is out of range"),
    (edited(0, np.array([2.0 ** 64], "<f4").tobytes()), 300, "block 0: scale (float32 bits 0x5f800000) is out of range"),
    (edited(4 + 9, b"\x80"), 300, "block 0: code -128 at index 9"),
    (edited(0, bytes(4)), 300, "block 0: scale 0 with a non-zero code at index"),
    (bytes(23), 3, "f64 message of 23 bytes, expected 24 for 3 values"),
])
def test_the_decoder_refuses_a_malformed_message_with_a_reason(message, n, why):
    codec = F64 if why.startswith("f64") else INT8
    with pytest.raises(CodecError) as e:
        codec.decode(message, n)
    assert str(e.value).startswith(why), str(e.value)


def test_a_non_finite_or_huge_gradient_is_refused_before_encoding():
    for v, why in [(np.nan, "gradient value nan at index 3 is not finite"),
                   (np.inf, "gradient value inf at index 3 is not finite"),
                   (2.0 ** 64, "gradient block 0 is out of the int8 exchange's range")]:
        x = np.zeros(10)
        x[3] = v
        with pytest.raises(CodecError, match=why.replace("(", r"\(")):
            INT8.encode(x, seed=1, step=0, slot=0, offset=0)
    with pytest.raises(ValueError, match="offset 100 is not a multiple of the block size 256"):
        INT8.encode(np.zeros(4), seed=1, step=0, slot=0, offset=100)


def test_the_setting_is_checked_and_carried():
    with pytest.raises(ConfigError, match=r"gradient exchange \(exchange\) must be one of f64, int8, got 'int4'"):
        Config(exchange="int4")
    assert Config.from_dict(Config(exchange="int8").to_dict()).exchange == "int8"
    r = subprocess.run([sys.executable, "-m", "daisy.train", "--exchange", "int4"], capture_output=True, text=True)
    assert r.returncode == 2 and "gradient exchange (exchange) must be one of f64, int8" in r.stderr


def test_checkpoints_carry_the_setting_and_old_ones_read_as_f64(tmp_path):
    from daisy.files.checkpoint import load_checkpoint, save_checkpoint
    from daisy.optim import adam_init
    cfg = Config(width=16, heads=2, seq_len=16, batch=2, layers=1, exchange="int8")
    g = Group(cfg, 2, data.builtin_stream())
    g.step()
    r = g.replicas[0]
    save_checkpoint(tmp_path / "a.pt", config=cfg, params=r.params, step=r.step, adam_m=r.adam["m"],
                    adam_v=r.adam["v"], adam_t=r.adam["t"])
    assert load_checkpoint(tmp_path / "a.pt").config["exchange"] == "int8"
    old = {k: v for k, v in cfg.to_dict().items() if k != "exchange"}
    p = init_params(cfg)
    a = adam_init(p)
    save_checkpoint(tmp_path / "old.pt", config=old, params=p, step=0, adam_m=a["m"], adam_v=a["v"], adam_t=0)
    assert load_checkpoint(tmp_path / "old.pt").config["exchange"] == "f64"
