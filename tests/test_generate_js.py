"""frontend_js/generate.js against daisy.generate, token for token, under node: the weights of a
small checkpoint trained by `python -m daisy.train --save`, several sampling settings (greedy,
temperature 0.8 top-k 40, top-k 0, empty prompt, a prompt longer than seq_len, a UTF-8
multibyte prompt, extreme k and temperature), on the best JS engine and on the scalar one;
the same error messages for bad settings; lastLogits (generate.js's last-row forward) equal
to model.forward's last row."""
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from daisy.files.checkpoint import load_checkpoint
from daisy.config import Config
from daisy.generate import generate

ROOT = Path(__file__).resolve().parents[1]
NODE = shutil.which("node")
TIMEOUT = 120
# two blocks so lastLogits covers a full block and the last-row block; seq_len 16 so prompts wrap
TRAIN = ["--width", "16", "--heads", "2", "--seq-len", "16", "--layers", "2", "--batch", "2",
         "--steps", "100", "--stop-after", "3", "--peers", "1"]

CASES = {
    "greedy": dict(prompt="The cat ", tokens=40, temperature=0.0, topK=40, seed=0),
    "t0.8 k40": dict(prompt="Once upon a time", tokens=40, temperature=0.8, topK=40, seed=7),
    "k0 (all)": dict(prompt="Once upon a time", tokens=40, temperature=1.0, topK=0, seed=3),
    "empty prompt": dict(prompt="", tokens=40, temperature=0.8, topK=40, seed=11),
    "prompt > seq_len": dict(prompt="A prompt that is much longer than the sixteen-token context window.",
                             tokens=30, temperature=0.8, topK=40, seed=5),
    "utf-8 multibyte": dict(prompt="héllo wörld — 日本語 🌼 ", tokens=30, temperature=0.8, topK=40, seed=2),
    "k1": dict(prompt="Once", tokens=20, temperature=0.8, topK=1, seed=9),
    "k257 t5 seed max": dict(prompt="Once", tokens=20, temperature=5.0, topK=257, seed=2**32 - 1),
}
BAD = [dict(prompt="x", tokens=2001, temperature=0.8, topK=40, seed=0),
       dict(prompt="x", tokens=-1, temperature=0.8, topK=40, seed=0),
       dict(prompt="x", tokens=5, temperature=-0.5, topK=40, seed=0),
       dict(prompt="x", tokens=5, temperature=10.5, topK=40, seed=0),
       dict(prompt="x", tokens=5, temperature=0.8, topK=258, seed=0),
       dict(prompt="x", tokens=5, temperature=0.8, topK=-1, seed=0)]


def run(cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Trains the checkpoint, then runs node (best engine, scalar engine) and Python concurrently."""
    assert NODE, "node is required for the JS generation tests (install nodejs)"
    tmp = tmp_path_factory.mktemp("gen")
    ck_path = tmp / "tiny.pt"
    r = run([sys.executable, "-m", "daisy.train", *TRAIN, "--save", str(ck_path)])
    assert r.returncode == 0, r.stderr
    ck = load_checkpoint(ck_path)
    cfg = Config.from_dict(ck.config)
    weights = tmp / "weights.f64"
    weights.write_bytes(b"".join(np.ascontiguousarray(w, "<f8").tobytes() for w in ck.params.values()))
    contexts = [[65], [256, 1, 2, 3], list(range(40, 40 + cfg.seq_len))]
    specs = {}
    for engine in ("best", "cpu"):
        spec = {"config": ck.config, "weights": str(weights), "engine": engine, "cases": list(CASES.values()),
                "bad": BAD if engine == "best" else [], "contexts": contexts}
        specs[engine] = tmp / f"spec_{engine}.json"
        specs[engine].write_text(json.dumps(spec))

    def node(engine):
        r = run([NODE, "tests/js/generate_cases.mjs", str(specs[engine])])
        assert r.returncode == 0, f"node failed:\n{r.stderr[-4000:]}"
        return json.loads(r.stdout)

    def python_refs():
        return {name: generate(ck.params, cfg, c["prompt"], c["tokens"], c["temperature"], c["topK"], c["seed"])
                for name, c in CASES.items()}

    with ThreadPoolExecutor(3) as pool:
        jobs = {e: pool.submit(node, e) for e in specs}
        py = python_refs()
        js = {e: f.result() for e, f in jobs.items()}
    return {"py": py, "js": js, "cfg": cfg, "params": ck.params}


def first_token_mismatch(js_ids, py_ids):
    for i, (a, b) in enumerate(zip(js_ids, py_ids)):
        if a != b:
            return f"token index {i}: JS {a}, Python {b}"
    return None if len(js_ids) == len(py_ids) else f"lengths differ: JS {len(js_ids)}, Python {len(py_ids)}"


@pytest.mark.parametrize("engine", ["best", "cpu"])
def test_same_tokens_as_python(world, engine):
    js = world["js"][engine]
    if engine == "best":
        assert js["engine"] == "wasm-simd", f"node should offer the wasm engine, got {js['engine']}"
    for k, (name, (py_text, py_ids)) in enumerate(world["py"].items()):
        diff = first_token_mismatch(js["ids"][k], py_ids)
        assert diff is None, f"{name} ({js['engine']}): first mismatch at {diff}"
        assert js["texts"][k] == py_text, f"{name}: decoded text differs: JS {js['texts'][k]!r}, Python {py_text!r}"
        assert len(py_ids) == CASES[name]["tokens"]


def test_settings_actually_sample(world):
    """The cases must exercise sampling: sampled runs differ from greedy ones, k=1 equals greedy."""
    py = world["py"]
    assert len(set(py["t0.8 k40"][1])) > 3, "temperature 0.8 should give varied tokens"
    greedy_k1 = generate(world["params"], world["cfg"], "Once", 20, 0.0, 40, 0)[1]
    assert py["k1"][1] == greedy_k1, "top-k 1 must be the argmax"
    assert any(t >= 128 for t in py["k257 t5 seed max"][1]), "temperature 5 over all ids should reach high bytes"


def test_same_errors_as_python(world):
    errors = world["js"]["best"]["errors"]
    assert len(errors) == len(BAD), f"JS answered {len(errors)} of the {len(BAD)} bad requests"
    for c, js_msg in zip(BAD, errors):
        with pytest.raises(ValueError) as e:
            generate(world["params"], world["cfg"], c["prompt"], c["tokens"], c["temperature"], c["topK"], c["seed"])
        assert js_msg == str(e.value), f"{c}: JS says {js_msg!r}, Python says {str(e.value)!r}"


@pytest.mark.parametrize("engine", ["best", "cpu"])
def test_last_row_forward_equals_full_forward(world, engine):
    for k, where in enumerate(world["js"][engine]["lastLogits"]):
        assert where == -1, f"context {k}: lastLogits differs from forward's last row at logit index {where}"
