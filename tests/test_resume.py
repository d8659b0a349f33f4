"""--save / --resume: a run of N+M steps equals N steps saved and resumed for M, bit for bit;
the saved .pt opens with torch.load(weights_only=True); generation from it is reproducible."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from daisy.files.checkpoint import load_checkpoint
from bits import assert_same_bits

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--width", "16", "--heads", "2", "--seq-len", "16", "--batch", "2", "--layers", "1"]


def run(module, *args):
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def steps(out):
    return [json.loads(l) for l in out.stdout.splitlines()]


def test_resume_is_bit_exact(tmp_path):
    ck = tmp_path / "run.pt"
    whole = steps(run("daisy.train", "--peers", "2", *SMALL, "--stop-after", "7", "--json"))
    first = steps(run("daisy.train", "--peers", "2", *SMALL, "--stop-after", "4", "--json", "--save", str(ck)))
    rest = steps(run("daisy.train", "--peers", "2", "--resume", str(ck), "--stop-after", "3", "--json"))
    assert [l["step"] for l in first + rest] == list(range(1, 8))
    assert len(whole) == 7, f"the continuous run printed {len(whole)} lines, 7 wanted"
    for a, b in zip(whole, first + rest):
        assert a == b, f"step {a['step']}: continuous {a} != resumed {b}"
    loaded = load_checkpoint(ck)
    assert loaded.step == 4 and loaded.weight_hash == first[-1]["hashes"][0]
    sd = torch.load(ck, weights_only=True)
    assert sd["step"] == 4 and sd["config"]["width"] == 16
    for name, arr in loaded.params.items():
        assert_same_bits(sd["model"][name].numpy(), arr, name)


def test_resume_refuses_conflicting_settings(tmp_path):
    ck = tmp_path / "run.pt"
    run("daisy.train", "--peers", "1", *SMALL, "--stop-after", "1", "--save", str(ck))
    r = subprocess.run([sys.executable, "-m", "daisy.train", "--resume", str(ck), "--width", "32"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "drop width" in r.stderr
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a zip")
    r = subprocess.run([sys.executable, "-m", "daisy.train", "--resume", str(bad)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr


def test_generate_cli_is_reproducible(tmp_path):
    ck = tmp_path / "run.pt"
    run("daisy.train", "--peers", "1", *SMALL, "--stop-after", "3", "--save", str(ck))
    args = ("daisy.generate", str(ck), "--prompt", "The ", "--tokens", "40", "--seed", "7")
    a, b = run(*args).stdout, run(*args).stdout
    assert a == b and a.startswith("The ")
    c = run("daisy.generate", str(ck), "--prompt", "The ", "--tokens", "40", "--seed", "8").stdout
    assert c != a                                   # the seed matters
    greedy = run("daisy.generate", str(ck), "--prompt", "The ", "--tokens", "10", "--temperature", "0").stdout
    assert greedy == run("daisy.generate", str(ck), "--prompt", "The ", "--tokens", "10", "--temperature", "0", "--seed", "9").stdout
