"""The golden-fixture writer: versioned format, deterministic bytes, readable back."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from daisy.fixtures import MAGIC, VERSION, read_fixture, write_fixture
from bits import assert_same_bits

ROOT = Path(__file__).resolve().parents[1]


def test_fixtures_are_deterministic_and_complete(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        r = subprocess.run([sys.executable, "-m", "daisy.fixtures", str(d)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    for name in ("units.dsyf", "forward.dsyf", "backward.dsyf", "train20.dsyf", "exchange.dsyf"):
        x, y = (a / name).read_bytes(), (b / name).read_bytes()
        assert x[:4] == MAGIC
        if x != y:
            i = next(i for i in range(min(len(x), len(y))) if x[i] != y[i])
            pytest.fail(f"{name}: first differing byte {i}: {x[i]} vs {y[i]}")
    header, t = read_fixture(a / "train20.dsyf")
    assert header["meta"]["steps"] == 20 and len(header["meta"]["hashes"]) == 20
    assert all(len(set(h)) == 1 for h in header["meta"]["hashes"])
    header, t = read_fixture(a / "backward.dsyf")
    assert any(k.startswith("grad.") for k in t) and t["x"].dtype == np.int32


def test_round_trip_and_version_check(tmp_path):
    p = tmp_path / "t.dsyf"
    arrs = [("f", np.array([1.5, -0.0, 5e-324])), ("i", np.array([[1, -2]], dtype=np.int32)),
            ("q", np.array([-127, 127, 0], dtype=np.int8)), ("u", np.array([256, 0], dtype=np.uint16))]
    write_fixture(p, "test", arrs, meta={"a": 1})
    header, t = read_fixture(p)
    for name, arr in arrs:
        assert_same_bits(t[name], arr, name)
    raw = bytearray(p.read_bytes())
    raw[4] = VERSION + 1
    p.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="regenerate"):
        read_fixture(p)


def test_bit_comparison_helper_catches_what_value_equality_misses():
    from bits import first_bit_mismatch
    assert first_bit_mismatch(np.array([0.0, 1.0]), np.array([-0.0, 1.0])).startswith("first mismatch at (0,)")
    msg = first_bit_mismatch(np.array([[1.0, 2.0]]), np.array([[1.0, np.nextafter(2.0, 3.0)]]))
    assert "(0, 1)" in msg and "4000000000000000 vs 4000000000000001" in msg
    assert first_bit_mismatch(np.array([np.nan]), np.array([np.nan])) is None
