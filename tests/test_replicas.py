"""Bit-identical replicas: every simulated peer's hash equal at every step, for P = 1..4; two
separate processes print the same sequence; a short run equals the committed golden sequence."""
import json
from pathlib import Path

import pytest

from daisy import data
from daisy.config import Config
from daisy.train import Group
from tests.reference import train_cli, train_json

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "train_p2_default_10.json"
SMALL = Config(width=16, heads=2, seq_len=16, batch=2, layers=1, seed=77)


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_all_peers_equal_every_step(P):
    # every replica is compared with replica 0 of a second, independently built group: with
    # P = 1 a comparison within one group would only compare a hash with itself
    group, twin = Group(SMALL, P, data.builtin_stream()), Group(SMALL, P, data.builtin_stream())
    seen = []
    for _ in range(6):
        step, loss, hashes = group.step()
        _, _, twin_hashes = twin.step()
        assert len(hashes) == P
        for i, h in enumerate(hashes):
            assert h == twin_hashes[0], f"step {step}: peer {i} hash {h} != the twin group's {twin_hashes[0]}"
        seen.append(hashes[0])
    assert len(set(seen)) == 6, "weights did not change between steps"


def test_two_processes_same_sequence():
    args = ("--peers", "2", "--stop-after", "5", "--width", "16", "--heads", "2", "--seq-len", "16",
            "--batch", "2", "--layers", "1")
    a, b = train_json(*args), train_json(*args)
    assert len(a) == 5 and len(b) == 5, (len(a), len(b))
    for x, y in zip(a, b):
        assert x == y, f"step {x['step']}: {x} != {y}"


def test_golden_hash_sequence():
    """Regenerate (after an intended change to the math) with:
    python -m daisy.train --peers 2 --stop-after 10 --exchange f64 --json > tests/golden/train_p2_default_10.jsonl
    then convert; the JS mirror must agree before a new golden is committed (docs/VERIFICATION.md).
    The golden holds the exact exchange (f64), the bits from before the int8 codec became the
    default; int8 runs are compared with the JS mirror in tests/test_js_mirror.py."""
    golden = json.loads(GOLDEN.read_text())
    lines = train_json("--peers", "2", "--exchange", "f64", "--stop-after", str(len(golden["steps"])))
    assert len(lines) == len(golden["steps"]), f"the CLI printed {len(lines)} lines, the golden has {len(golden['steps'])}"
    for want, got in zip(golden["steps"], lines):
        assert got["hashes"] == [want["hash"]] * 2, f"step {want['step']}: got {got['hashes']}, golden {want['hash']}"
        assert got["loss"] == want["loss"], f"step {want['step']}: loss {got['loss']!r} != golden {want['loss']!r}"


def test_human_output_of_a_sharded_group_is_unchanged():
    """P = 4 runs the sharded reduce (reduce-scatter + all-gather, daisy.collective). Its output
    must be the bytes the trainer printed before the collective seam existed: the golden file
    was written by the pre-seam trainer (commit fbfb110) with the same command."""
    want = (ROOT / "tests" / "golden" / "train_p4_small_5.txt").read_text()
    out = train_cli("--peers", "4", "--exchange", "f64", "--stop-after", "5", "--width", "16", "--heads", "2",
                    "--seq-len", "16", "--batch", "2", "--layers", "1")
    assert out.returncode == 0, out.stderr
    got_lines, want_lines = out.stdout.splitlines(), want.splitlines()
    for i, (got, exp) in enumerate(zip(got_lines, want_lines)):
        assert got == exp, f"line {i + 1}: got {got!r}, want {exp!r}"
    # zip stops at the shorter list: a cut-short output must fail too
    assert len(got_lines) == len(want_lines), f"{len(got_lines)} lines printed, the golden has {len(want_lines)}"
    assert out.stdout == want
