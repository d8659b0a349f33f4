"""The model in the page, end to end: `python app.py` (real uvicorn on 127.0.0.1, HF_HUB_OFFLINE=1,
so the data route serves the built-in corpus) and headless Chromium.

One page trains a tiny run; its Generate widget gives the Python reference's text for the same
weights; its download buttons give a .pt that torch opens (same weight hash as the page), a
model.safetensors and an inference kit. Another page (a fresh browser context) loads the .pt,
shows the file's hash and step, and resumes: its next steps' hashes equal
`python -m daisy.train --resume FILE --peers 1`. Bad files are refused with the server's
message, the peer unchanged. The model routes are also checked over plain HTTP.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import secrets
import struct
import subprocess
import sys
import tempfile
import zipfile

import httpx
import numpy as np
import pytest
import safetensors.numpy
import torch

from daisy.files.checkpoint import load_checkpoint, param_shapes
from daisy.config import Config
from daisy.generate import generate
from daisy.hashing import weight_hash
from daisy.space.model_routes import MAX_CHECKPOINT_BYTES, MAX_STATE_BYTES, decode_state, encode_state
from daisy.space.page import NO_MODEL
from daisy.tokenizer import TOKENIZER_ID
from tests.app_server import REPO_ROOT, WAIT_MS, open_peer, running_app, state, wait_state

pytestmark = pytest.mark.slow

# steps 10000: a resumed run is still going when the test acts on it (a tiny step is ~1 ms)
TINY = {"width": 16, "seq_len": 16, "batch": 2, "steps": 10000, "layers": 1, "heads": 4, "seed": 7}
RESUME_STEPS = 3
# what Chromium logs for every 4xx fetch: expected where a test provokes refusals
REFUSED_FETCH = "Failed to load resource: the server responded with a status of 4"
EXPECTED_CONSOLE = (REFUSED_FETCH,)      # the refused uploads of these tests (conftest.py)


@pytest.fixture(scope="module")
def app_url():
    with tempfile.TemporaryDirectory(prefix="daisy-model-") as tmp:
        with running_app(tmp, "model", {"HF_HUB_OFFLINE": "1"}) as base:
            yield base


def first_mismatch(got: str, want: str) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"first mismatch at char {i}: page {got[i:i + 20]!r}, python {want[i:i + 20]!r} (lengths {len(got)}, {len(want)})"


def download(page, button: str, path) -> str:
    """Click a download button; save the file to path -> the status line's message."""
    with page.expect_download(timeout=WAIT_MS) as info:
        page.get_by_role("button", name=button, exact=True).click()
    info.value.save_as(path)
    page.wait_for_function("document.querySelector('#model-status').innerText.includes('Saved')", timeout=WAIT_MS)
    return page.inner_text("#model-status")


def pick_checkpoint(page, path) -> str:
    """Load a file through the page's Load checkpoint button -> the loader's message once settled."""
    with page.expect_file_chooser(timeout=WAIT_MS) as chooser:
        page.get_by_role("button", name="Load checkpoint (.pt)", exact=True).click()
    chooser.value.set_files(str(path))
    page.wait_for_function("""(() => { const s = document.querySelector('#daisy-loader [data-role="load-status"]');
        return s && (s.dataset.state === 'ok' || s.dataset.state === 'error'); })()""", timeout=WAIT_MS)
    return page.inner_text('#daisy-loader [data-role="load-status"]')


def train_and_stop(page, cfg: dict, at_least: int) -> dict:
    page.evaluate("(cfg) => window.daisy.start(cfg)", cfg)
    wait_state(page, f"s.step >= {at_least}", f"{at_least} steps")
    page.evaluate("window.daisy.stop()")
    wait_state(page, "!s.running", "run stopped")
    return state(page)


def cli_resume_hashes(path, k: int) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "daisy.train", "--resume", str(path), "--peers", "1",
                          "--stop-after", str(k), "--json"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr, f"the page's checkpoint names other data: {out.stderr}"
    return [json.loads(line)["hashes"][0] for line in out.stdout.splitlines()]


def test_train_generate_download_load_and_resume(app_url, pages, tmp_path):
    a = open_peer(pages, app_url + "/", "trainer")
    trained = train_and_stop(a, TINY, 4)
    assert trained["runState"] == "stopped" and trained["hash"], trained

    # --- the .pt through the button: torch opens it; same hash and step as the page
    pt = tmp_path / "page.pt"
    msg = download(a, "Download checkpoint (.pt)", pt)
    assert f"step {trained['step']}" in msg and trained["hash"][:16] in msg, msg
    top = torch.load(pt, weights_only=True)
    assert top["weight_hash"] == trained["hash"], (top["weight_hash"], trained["hash"])
    assert top["step"] == trained["step"] and top["optim"]["t"] == trained["step"], (top["step"], trained["step"])
    assert top["tokenizer"] == TOKENIZER_ID and top["config"] == Config(**TINY).to_dict(), top["config"]
    assert top["extra"]["data"] == "builtin", top["extra"]
    ck = load_checkpoint(pt)
    assert ck.weight_hash == trained["hash"]
    assert float(np.abs(ck.adam_v["head.weight"]).max()) > 0, "Adam's v did not travel"

    # --- after the run, the model widgets say what the tab holds without a click
    a.wait_for_function("!document.querySelector('#model-status').innerText.includes('Train or load')", timeout=WAIT_MS)
    assert trained["hash"][:16] in a.inner_text("#model-status"), a.inner_text("#model-status")
    assert a.evaluate("document.querySelector('#gen-output textarea').placeholder") != NO_MODEL

    # --- Generate in the page (the widget's defaults) == the Python reference on those weights
    cfg = Config(**TINY)
    want, _ = generate(ck.params, cfg, "The ", 200, temperature=0.8, top_k=40, seed=0)
    a.get_by_role("button", name="Generate", exact=True).click()
    # the box is empty until Generate answers (its placeholder says what to do)
    a.wait_for_function(f"(() => {{ const v = document.querySelector('#gen-output textarea').value; return v !== '' && v !== {json.dumps(NO_MODEL)}; }})()",
                        timeout=WAIT_MS)
    shown = a.evaluate("document.querySelector('#gen-output textarea').value")
    assert shown == "The " + want, first_mismatch(shown, "The " + want)
    # the API with other settings (and tokens) agrees too
    got = a.evaluate("window.daisy.generate('Once upon', {temperature: 1.3, topK: 0, seed: 99, tokens: 37})")
    want2, _ = generate(ck.params, cfg, "Once upon", 37, temperature=1.3, top_k=0, seed=99)
    assert got == want2, first_mismatch(got, want2)

    # --- temperature 0 is greedy on the page as in Python (the slider reaches 0)
    box = a.locator("#gen-temperature input[type=number]")
    box.fill("0")
    box.press("Enter")
    a.get_by_role("button", name="Generate", exact=True).click()
    want0, _ = generate(ck.params, cfg, "The ", 200, temperature=0.0, top_k=40, seed=0)
    a.wait_for_function("(t) => document.querySelector('#gen-output textarea').value === t", arg="The " + want0,
                        timeout=WAIT_MS)

    # --- model.safetensors: opens with the safetensors package, same tensors as the .pt
    st = tmp_path / "model.safetensors"
    download(a, "Download weights (model.safetensors)", st)
    tensors = safetensors.numpy.load_file(str(st))
    assert set(tensors) == set(param_shapes(cfg)), sorted(tensors)
    for name, w in ck.params.items():
        assert tensors[name].dtype == np.float64 and np.array_equal(tensors[name].view(np.uint64), w.view(np.uint64)), name
    with open(st, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))["__metadata__"]
    assert meta["weight_hash"] == trained["hash"] and meta["step"] == str(trained["step"]), meta

    # --- the inference kit: one HTML file carrying the weights' hash
    kit = tmp_path / "kit.html"
    download(a, "Download inference kit", kit)
    html = kit.read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html") and trained["hash"] in html

    # --- another page (fresh browser context) loads the .pt: same hash and step. It opens a room
    # of its own, so its resumed run is a one-peer run like the CLI's (page a would join it)
    b = open_peer(pages, app_url + "/?room=solo-" + secrets.token_hex(6), "loader")
    b.get_by_role("button", name="Generate", exact=True).click()     # before the load: "Train or load…"
    b.wait_for_function(f"document.querySelector('#gen-output textarea').value === {json.dumps(NO_MODEL)}",
                        timeout=WAIT_MS)
    msg = pick_checkpoint(b, pt)
    assert msg.startswith("Loaded page.pt") and trained["hash"][:16] in msg, msg
    loaded = state(b)
    assert (loaded["hash"], loaded["step"]) == (trained["hash"], trained["step"]), loaded
    assert loaded["config"]["width"] == 16 and loaded["runState"] == "loaded", loaded
    assert b.evaluate("window.daisy.hasModel()") is True
    # right under the loader's green line, the widgets no longer say "Train or load a model first."
    b.wait_for_function("!document.querySelector('#model-status').innerText.includes('Train or load')", timeout=WAIT_MS)
    b.wait_for_function("document.querySelector('#gen-output textarea').value === ''", timeout=WAIT_MS)
    assert NO_MODEL not in b.inner_text("#ckpt-load"), b.inner_text("#ckpt-load")
    assert b.get_by_role("button", name="Start a new run", exact=True).count() == 1

    # --- resume with the Continue button (sliders at their defaults: the checkpoint's config wins)
    b.evaluate("""() => { window.stepHashes = {};
                          window.daisy.on('step', (e) => { window.stepHashes[e.step] = e.hash; }); }""")
    s0 = trained["step"]
    b.get_by_role("button", name=f"Continue from step {s0} of {TINY['steps']}", exact=True).click()
    wait_state(b, f"s.step >= {s0 + RESUME_STEPS}", "resumed steps")
    b.evaluate("window.daisy.stop()")
    wait_state(b, "!s.running", "resumed run stopped")
    resumed = state(b)
    assert resumed["config"] == trained["config"], (resumed["config"], trained["config"])
    page_hashes = b.evaluate("window.stepHashes")
    assert min(int(k) for k in page_hashes) == s0 + 1, f"the resumed run did not continue at step {s0 + 1}: {sorted(page_hashes)}"
    want_hashes = cli_resume_hashes(pt, RESUME_STEPS)
    assert len(want_hashes) == RESUME_STEPS, want_hashes
    for i, want_hash in enumerate(want_hashes):
        got_hash = page_hashes[str(s0 + 1 + i)]
        assert got_hash == want_hash, f"step {s0 + 1 + i}: page {got_hash}, python {want_hash}"


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    """A small real checkpoint from the reference trainer (2 steps of the tiny config)."""
    from daisy import cli
    path = tmp_path_factory.mktemp("ck") / "good.pt"
    flags = ["--peers", "1", "--stop-after", "2", "--save", str(path)]
    for k, v in TINY.items():
        flags += [{"lr_x1000": "--lr"}.get(k, "--" + k.replace("_", "-")), str(v)]
    assert cli.main(flags) == 0
    return path


def torch_edited(path, edit) -> bytes:
    d = torch.load(path, weights_only=True)
    edit(d)
    buf = io.BytesIO()
    torch.save(d, buf)
    return buf.getvalue()


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_bad_files_are_refused_and_change_nothing(app_url, pages, good_checkpoint, tmp_path):
    page = open_peer(pages, app_url + "/", "refuser")
    assert pick_checkpoint(page, good_checkpoint).startswith("Loaded good.pt")
    before = state(page)
    good = good_checkpoint.read_bytes()
    marker = tmp_path / "pwned"
    with zipfile.ZipFile(io.BytesIO(good)) as zf:
        entries = {i.filename: zf.read(i) for i in zf.infolist()}
    entries["archive/data.pkl"] = pickle.dumps({"format": "daisychain", "x": RunsCode(marker)}, protocol=2)
    payload = io.BytesIO()
    with zipfile.ZipFile(payload, "w", zipfile.ZIP_STORED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)

    def widen(d):
        d["config"]["width"] = 32

    cases = {
        "truncated.pt": (good[: len(good) // 2], "not a PyTorch zip checkpoint (truncated or corrupt file?)"),
        "notzip.pt": (b"this is not a checkpoint\n" * 10, "not a PyTorch zip checkpoint"),
        "tokenizer.pt": (torch_edited(good_checkpoint, lambda d: d.update(tokenizer="gpt2-bpe")),
                         "tokenizer mismatch: expected 'daisy-bytes-v1', found 'gpt2-bpe'"),
        "dims.pt": (torch_edited(good_checkpoint, widen),
                    "tensor model['wte.weight'] has shape (257, 16), expected (257, 32)"),
        "payload.pt": (payload.getvalue(), "refused"),
        "unrelated.pt": (torch_edited(good_checkpoint, lambda d: [d.clear(), d.update(fc=torch.zeros(3, dtype=torch.float64))]),
                         "not a DaisyChain checkpoint"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        shown = pick_checkpoint(page, path)
        assert shown.startswith(f"Refused {name}:") and message in shown, f"{name}: {shown}"
        try:   # the panel redraws on its own schedule (throttled)
            page.wait_for_function("(m) => document.querySelector('#daisy-peer [data-role=\"error\"]').innerText.includes(m)",
                                   arg=message, timeout=WAIT_MS)
        except Exception:
            raise AssertionError(f"{name}: the panel does not say why: {page.inner_text('#daisy-peer')[:500]}")
        after = state(page)
        assert (after["hash"], after["step"], after["config"]) == (before["hash"], before["step"], before["config"]), name
    assert not marker.exists(), "loading ran code from the file"

    # a load while a run is going is refused before the upload; the run goes on
    page.evaluate("window.daisy.start()")
    wait_state(page, f"s.running && s.step > {before['step']}", "resumed run")
    shown = pick_checkpoint(page, good_checkpoint)
    assert "a run is going: stop it before loading a checkpoint" in shown, shown
    assert state(page)["running"] is True
    page.evaluate("window.daisy.stop()")
    wait_state(page, "!s.running", "stopped")


# --- the model routes over plain HTTP ---------------------------------------------------------

def tiny_state(seed=3):
    cfg = Config(**TINY)
    rng = np.random.default_rng(seed)
    shapes = param_shapes(cfg)
    params, m, v = ({n: rng.standard_normal(s) for n, s in shapes.items()} for _ in range(3))
    return cfg, params, m, {n: np.abs(a) for n, a in v.items()}       # Adam's v is non-negative


def test_model_routes_check_the_state_body(app_url):
    cfg, params, m, v = tiny_state()
    body = encode_state(config=cfg, step=5, params=params, adam_m=m, adam_v=v, weight_hash=weight_hash(params))
    r = httpx.post(app_url + "/api/checkpoint.pt", content=body, timeout=30)
    assert r.status_code == 200, r.text
    ck = load_checkpoint(r.content)
    assert ck.step == 5 and ck.weight_hash == weight_hash(params) == r.headers["x-daisy-weight-hash"]
    assert 'filename="daisychain-step5.pt"' in r.headers["content-disposition"]
    # /api/load gives the same state back, bit for bit
    back = httpx.post(app_url + "/api/load", content=r.content, timeout=30)
    assert back.status_code == 200, back.text
    st = decode_state(back.content, need_optim=True)
    for group, want in (("params", params), ("adam_m", m), ("adam_v", v)):
        for name, w in want.items():
            assert np.array_equal(st[group][name].view(np.uint64), w.view(np.uint64)), f"{group}[{name}]"

    def refused(route, content, status, message):
        r = httpx.post(app_url + route, content=content, timeout=60)
        assert r.status_code == status and message in r.json()["error"], (route, r.status_code, r.text[:300])

    weights_only = encode_state(config=cfg, step=5, params=params)
    refused("/api/checkpoint.pt", weights_only, 400, "a checkpoint needs the optimizer state")
    assert httpx.post(app_url + "/api/kit.html", content=weights_only, timeout=30).status_code == 200
    refused("/api/model.safetensors", body[:-8], 400, "the state body holds")
    refused("/api/model.safetensors", b"\x03\x00", 400, "shorter than its 8-byte header length")
    lying = encode_state(config=cfg, step=5, params=params, weight_hash="0" * 64)
    refused("/api/kit.html", lying, 400, "weight hash mismatch")
    bad_cfg = body.replace(b'"width":16', b'"width":17', 1)
    refused("/api/checkpoint.pt", bad_cfg, 400, "bad config: model width (17) must be a multiple of heads (4)")
    refused("/api/checkpoint.pt", b"\x00" * (MAX_STATE_BYTES + 1), 413, "over the limit")
    refused("/api/load", b"\x00" * (MAX_CHECKPOINT_BYTES + 1), 413, "over the limit")
    refused("/api/load", b"PK\x03\x04 junk", 400, "not a PyTorch zip checkpoint")
    assert httpx.get(app_url + "/data/info", timeout=10).status_code == 200     # still serving


def test_a_finished_checkpoint_offers_only_a_new_run(app_url, pages, tmp_path):
    from daisy import cli
    done = tmp_path / "done.pt"
    flags = ["--peers", "1", "--save", str(done)]
    for k, v in {**TINY, "steps": 100}.items():
        flags += [{"lr_x1000": "--lr"}.get(k, "--" + k.replace("_", "-")), str(v)]
    assert cli.main(flags) == 0
    page = open_peer(pages, app_url + "/?room=done-" + secrets.token_hex(6), "finished")
    assert pick_checkpoint(page, done).startswith("Loaded done.pt")
    s = state(page)
    assert s["step"] == 100 and s["resumable"] is None, s
    assert "Its run is complete: Start a new run" in s["message"], s["message"]
    page.get_by_role("button", name="Start a new run", exact=True).wait_for(timeout=WAIT_MS)
    assert not page.locator("#daisy-continue").is_visible(), "Continue offered for a finished run"
    err = page.evaluate("window.daisy.start({resume: true}).then(() => 'started', (e) => e.message)")
    assert err == "nothing to continue: the model is at the last step of its run (100 of 100); start a new run", err
    assert state(page)["hash"] == s["hash"] and not state(page)["running"]
