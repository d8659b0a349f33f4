"""The state body codec (daisy/files/state_codec.py) on its own: a replica goes through encode/decode
bit for bit, and bad bodies are refused with a message naming the problem."""
import numpy as np
import pytest

from daisy.config import Config
from daisy.hashing import weight_hash
from daisy.model import param_shapes
from daisy.files.state_codec import StateError, decode_state, encode_state
from tests.bits import assert_same_bits

TINY = Config(width=16, heads=2, seq_len=16, batch=2, layers=1, seed=5)


def tiny_state(seed=3):
    rng = np.random.default_rng(seed)
    shapes = param_shapes(TINY)
    params, m, v = ({n: rng.standard_normal(s) for n, s in shapes.items()} for _ in range(3))
    return params, m, {n: np.abs(a) for n, a in v.items()}


def test_round_trip_is_bit_exact():
    params, m, v = tiny_state()
    body = encode_state(config=TINY, step=7, params=params, adam_m=m, adam_v=v, adam_t=7,
                        weight_hash=weight_hash(params), extra={"data": "builtin"})
    hlen = int.from_bytes(body[:8], "little")
    assert hlen % 8 == 0 and (len(body) - 8 - hlen) == 3 * 8 * sum(a.size for a in params.values())
    st = decode_state(body, need_optim=True)
    assert st["step"] == 7 and st["adam_t"] == 7 and st["config"] == TINY.to_dict()
    assert st["extra"] == {"data": "builtin"} and st["weight_hash"] == weight_hash(params)
    for group, want in (("params", params), ("adam_m", m), ("adam_v", v)):
        for name, w in want.items():
            assert_same_bits(st[group][name], w, f"{group}[{name}]")


@pytest.mark.parametrize("mutate, need_optim, message", [
    (lambda b: b[:-8], False, "the state body holds"),
    (lambda b: b[:3], False, "shorter than its 8-byte header length"),
    (lambda b: b.replace(b'"width":16', b'"width":17', 1), False, "bad config"),
    (lambda b: b.replace(b'"version":1', b'"version":9', 1), False, "unsupported state version"),
    (lambda b: b.replace(b"daisychain-state", b"daisychain-other", 1), False, "not a DaisyChain state body"),
])
def test_bad_bodies_are_refused_by_name(mutate, need_optim, message):
    params, m, v = tiny_state()
    body = encode_state(config=TINY, step=5, params=params, adam_m=m, adam_v=v)
    with pytest.raises(StateError, match=message):
        decode_state(mutate(body), need_optim=need_optim)


def test_weights_only_and_lying_hash():
    params, _, _ = tiny_state()
    weights_only = encode_state(config=TINY, step=5, params=params)
    assert decode_state(weights_only, need_optim=False)["adam_m"] is None
    with pytest.raises(StateError, match="needs the optimizer state"):
        decode_state(weights_only, need_optim=True)
    with pytest.raises(StateError, match="weight hash mismatch"):
        decode_state(encode_state(config=TINY, step=5, params=params, weight_hash="0" * 64), need_optim=False)
    with pytest.raises(StateError, match="carries no weight_hash"):      # the stored run's uploads
        decode_state(weights_only, need_optim=False, need_hash=True)


def test_a_deeply_nested_header_is_refused_not_a_crash():
    """Issue 13: a state header nested ~10^4 levels deep made json.loads raise RecursionError
    (a 500 from the model routes); it is a StateError (400) like any other bad header."""
    nested = b'{"format":"daisychain-state","extra":' + b"[" * 20000 + b"]" * 20000 + b"}"
    nested += b" " * (-len(nested) % 8)
    with pytest.raises(StateError, match="nests too deeply"):
        decode_state(len(nested).to_bytes(8, "little") + nested, need_optim=False)
