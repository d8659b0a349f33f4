"""The reference run's hashes, for tests that compare pages or other runs against it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SETTING_FLAGS = {"width": "--width", "seq_len": "--seq-len", "batch": "--batch", "steps": "--steps",
                 "lr_x1000": "--lr", "layers": "--layers", "heads": "--heads", "seed": "--seed"}


def reference_hashes(settings: dict, steps: int, *, roster: str | None = None, peers: int = 2,
                     resume: str | None = None) -> list[str]:
    """`python -m daisy.train ... --json --stop-after steps`: the weight hash after each step.

    settings: Config keys (width, seq_len, ..., lr_x1000); with `resume` they come from the
    checkpoint, so give none. roster: a --roster schedule (docs/VERIFICATION.md, "Roster
    schedule"), used instead of `peers`. Every line's P hashes must agree."""
    args = [sys.executable, "-m", "daisy.train", "--json", "--stop-after", str(steps)]
    args += ["--roster", roster] if roster is not None else ["--peers", str(peers)]
    if resume is not None:
        assert not settings, f"--resume takes the checkpoint's settings; drop {sorted(settings)}"
        args += ["--resume", str(resume)]
    for k, v in settings.items():
        args += [SETTING_FLAGS[k], str(v)]
    out = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{' '.join(args[1:])} failed:\n{out.stderr}"
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == steps, f"the reference printed {len(lines)} lines, {steps} wanted"
    for line in lines:
        assert len(set(line["hashes"])) == 1, f"the reference's replicas disagree: {line}"
    return [line["hashes"][0] for line in lines]
