"""The docs' PyTorch recipe (docs/ARCHITECTURE.md, "Checkpoints"): a .pt from the trainer loads
into daisy.torch_model.DaisyGPT with torch.load(weights_only=True) and gives the reference's
logits within float tolerance."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from daisy.files.checkpoint import load_checkpoint
from daisy.config import Config
from daisy.model import float_matmul, forward
from daisy.torch_model import DaisyGPT

ROOT = Path(__file__).resolve().parents[1]


def test_docs_recipe_gives_the_reference_logits(tmp_path):
    pt = tmp_path / "run.pt"
    r = subprocess.run([sys.executable, "-m", "daisy.train", "--peers", "1", "--stop-after", "5",
                        "--save", str(pt)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ck = torch.load(pt, weights_only=True)
    model = DaisyGPT(**ck["config"], quantized=True).double()
    model.load_state_dict(ck["model"])                       # strict: every name and shape
    tokens = np.frombuffer(b"The river ran past the old mill, and then", dtype=np.uint8)[:32].astype(np.int64)[None, :]
    with torch.no_grad():
        theirs = model(torch.from_numpy(tokens)).numpy()[0]  # (T, V)
    ours_ck = load_checkpoint(pt)
    cfg = Config.from_dict(ours_ck.config)
    ours = forward(ours_ck.params, cfg, tokens)               # (T, V)
    assert np.abs(theirs - ours).max() < 1e-9, np.abs(theirs - ours).max()
    # the plain float module is the unquantized model
    plain = DaisyGPT(**ck["config"]).double()
    plain.load_state_dict(ck["model"])
    with torch.no_grad():
        p = plain(torch.from_numpy(tokens)).numpy()[0]
    assert np.abs(p - forward(ours_ck.params, cfg, tokens, mm=float_matmul)).max() < 1e-9
