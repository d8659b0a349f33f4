"""The reference run's hashes, for tests that compare pages or other runs against it, and the
first line where the Node mirror's output differs from Python's."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SETTING_FLAGS = {"width": "--width", "seq_len": "--seq-len", "batch": "--batch", "steps": "--steps",
                 "lr_x1000": "--lr", "layers": "--layers", "heads": "--heads", "seed": "--seed",
                 "exchange": "--exchange", "local_steps": "--local-steps"}


def setting_args(settings: dict) -> list[str]:
    """Config keys -> the trainer's flags: {"width": 16, "seq_len": 16} -> --width 16 --seq-len 16."""
    return [arg for k, v in settings.items() for arg in (SETTING_FLAGS[k], str(v))]


def train_cli(*args, timeout=300) -> subprocess.CompletedProcess:
    """`python -m daisy.train ARGS` in the repository, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "daisy.train", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


def assert_refused(r, needle: str) -> None:
    """A train_cli result: exit 2 before any step, with the message and no stack trace."""
    assert r.returncode == 2, (r.returncode, r.stdout[:300])
    assert f"error: {needle}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def train_json(*args) -> list[dict]:
    """`python -m daisy.train ARGS --json`, which must succeed -> one dict per step."""
    out = train_cli(*args, "--json")
    assert out.returncode == 0, f"daisy.train {' '.join(args)} failed:\n{out.stderr}"
    return [json.loads(line) for line in out.stdout.splitlines()]


def train_hashes(*args) -> list[str]:
    """train_json(ARGS) -> the weight hash after each step; every line's P hashes must agree."""
    lines = train_json(*args)
    for line in lines:
        assert len(set(line["hashes"])) == 1, f"the reference's replicas disagree: {line}"
    return [line["hashes"][0] for line in lines]


def reference_hashes(settings: dict, steps: int, *, roster: str | None = None, peers: int = 2,
                     resume: str | None = None) -> list[str]:
    """`python -m daisy.train ... --json --stop-after steps`: the weight hash after each step.

    settings: Config keys (width, seq_len, ..., lr_x1000); with `resume` they come from the
    checkpoint, so give none. roster: a --roster schedule (docs/VERIFICATION.md, "Roster
    schedule"), used instead of `peers`. Every line's P hashes must agree."""
    args = ["--stop-after", str(steps)]
    args += ["--roster", roster] if roster is not None else ["--peers", str(peers)]
    if resume is not None:
        assert not settings, f"--resume takes the checkpoint's settings; drop {sorted(settings)}"
        args += ["--resume", str(resume)]
    hashes = train_hashes(*args, *setting_args(settings))
    assert len(hashes) == steps, f"the reference printed {len(hashes)} lines, {steps} wanted"
    return hashes


def first_diff(a: str, b: str):
    """None if Python's output a and Node's b are the same lines, else the first line that differs."""
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return f"line {i + 1}:\n  python: {x}\n  node:   {y}"
    return f"line counts differ: python {len(la)}, node {len(lb)}" if len(la) != len(lb) else None
