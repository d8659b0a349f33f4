"""The reference trainer's command line: output format, bad settings, bad --data files."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.reference import assert_refused, train_cli


@pytest.mark.parametrize("args,needle", [
    (["--width", "8"], "model width (width) must be in 16..128, got 8"),
    (["--width", "200"], "model width (width) must be in 16..128, got 200"),
    (["--seq-len", "300"], "sequence length (seq_len) must be in 16..128, got 300"),
    (["--batch", "1"], "batch per device (batch) must be in 2..32, got 1"),
    (["--steps", "50"], "steps (steps) must be in 100..10000, got 50"),
    (["--lr", "60"], "learning rate x1000 (lr_x1000) must be in 5..50, got 60"),
    (["--peers", "0"], "peers (--peers) must be in 1..64, got 0"),
    (["--width", "48", "--heads", "5"], "model width (48) must be a multiple of heads (5)"),
    (["--stop-after", "0"], "--stop-after must be in 1..300"),
])
def test_out_of_range_settings_are_refused_by_name(args, needle):
    assert_refused(train_cli(*args), needle)


def test_json_lines(tmp_path):
    r = train_cli("--peers", "3", "--stop-after", "2", "--width", "16", "--heads", "2", "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert [l["step"] for l in lines] == [1, 2]
    assert all(set(l) == {"step", "loss", "hashes"} and len(l["hashes"]) == 3 for l in lines)


def test_human_output():
    r = train_cli("--peers", "2", "--stop-after", "1", "--width", "16", "--heads", "2")
    assert r.returncode == 0 and "2 peers agree" in r.stdout and "loss" in r.stdout


def test_parquet_data(tmp_path):
    p = tmp_path / "shard.parquet"
    docs = [f"Document number {i} talks about rivers, hills and the weather of the valley." * 3 for i in range(40)]
    pq.write_table(pa.table({"text": docs, "id": [str(i) for i in range(40)]}), p, row_group_size=10)
    r = train_cli("--data", str(p), "--stop-after", "2", "--width", "16", "--heads", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2


@pytest.mark.parametrize("kind,needle", [
    ("missing", "no such file"),
    ("garbage", "is not a readable parquet file"),
    ("schema", "has no 'text' column"),
    ("type", "column 'text'"),
    ("empty", "no non-empty 'text' rows"),
])
def test_bad_data_files_get_clear_errors(tmp_path, kind, needle):
    p = tmp_path / "bad.parquet"
    if kind == "garbage":
        p.write_bytes(b"this is not parquet at all" * 10)
    elif kind == "schema":
        pq.write_table(pa.table({"content": ["hello"]}), p)
    elif kind == "type":
        pq.write_table(pa.table({"text": [1, 2, 3]}), p)
    elif kind == "empty":
        pq.write_table(pa.table({"text": ["", ""]}), p)
    r = train_cli("--data", str(p), "--stop-after", "1")
    assert r.returncode == 2, r.stdout
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr
