"""The offline inference kit (daisy/files/kit.py): built from a checkpoint trained by
`python -m daisy.train --save`, opened in headless Chromium from file:// with every request
that is not the file itself aborted, driven through its UI; its text must equal
daisy.generate's. Also: a tampered kit refuses its weights, the default-config kit is under
1 MB, the inlined modules are the repo's files, and the CLI names bad checkpoints."""
import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from daisy.files.checkpoint import load_checkpoint
from daisy.config import Config
from daisy.generate import generate
from daisy.files.kit import BARE_PREFIX, FRONTEND, build_kit, render_kit
from daisy.model import init_params
from tests.page_browser import chromium_pages

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["--width", "16", "--heads", "2", "--seq-len", "16", "--layers", "2", "--batch", "2",
         "--steps", "100", "--stop-after", "3", "--peers", "1"]
WEIGHTS_RE = re.compile(r'(<script type="application/octet-stream" id="daisy-kit-weights">)([^<]*)(</script>)')
IMPORTMAP_RE = re.compile(r'<script type="importmap">(.*?)</script>', re.S)
WAIT_MS = 20_000


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kit")
    ck_path = tmp / "tiny.pt"
    r = subprocess.run([sys.executable, "-m", "daisy.train", *TRAIN, "--save", str(ck_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = tmp / "kit.html"
    r = subprocess.run([sys.executable, "-m", "daisy.files.kit", str(ck_path), "-o", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ck = load_checkpoint(ck_path)
    return {"dir": tmp, "ck": ck, "ck_path": ck_path, "html_path": out, "html": out.read_text(encoding="utf-8")}


@pytest.fixture(scope="module")
def browser():
    with chromium_pages() as pages:
        yield pages


def open_offline(pages, path: Path):
    """A fresh context whose every non-file: request is aborted -> (page, requested urls, problems)."""
    context = pages.browser.new_context()
    pages.contexts.append(context)                  # closed with the others by close_pages()
    requested, problems = [], []
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                  else route.abort())
    page = context.new_page()
    page.on("request", lambda req: requested.append(req.url))
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    page.goto(path.as_uri(), wait_until="load", timeout=WAIT_MS)
    page.wait_for_function("document.body.dataset.state !== 'loading' || !document.getElementById('error').hidden",
                           timeout=WAIT_MS)
    return page, requested, problems


def generate_in_kit(page, prompt, temperature, top_k, seed, tokens, run_number):
    page.fill("#prompt", prompt)
    page.fill("#temperature", str(temperature))
    page.fill("#top-k", str(top_k))
    page.fill("#seed", str(seed))
    page.fill("#tokens", str(tokens))
    page.click("#generate")
    page.wait_for_function(f"document.body.dataset.runs === '{run_number}'", timeout=WAIT_MS)
    return page.text_content("#continuation")


def first_char_mismatch(a: str, b: str):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"char {i}: kit {x!r}, Python {y!r}"
    return None if len(a) == len(b) else f"lengths differ: kit {len(a)}, Python {len(b)}"


def test_kit_generates_python_text_offline(kit, browser):
    ck = kit["ck"]
    cfg = Config.from_dict(ck.config)
    page, requested, problems = open_offline(browser, kit["html_path"])
    assert page.evaluate("document.body.dataset.state") == "ready", page.text_content("#error")
    assert page.text_content("#hash") == ck.weight_hash[:16]
    runs = [("Once upon a time", 0.8, 40, 1234, 60), ("héllo — 日本 ", 0.0, 40, 0, 30)]
    for n, (prompt, temperature, top_k, seed, tokens) in enumerate(runs, start=1):
        text = generate_in_kit(page, prompt, temperature, top_k, seed, tokens, n)
        want, _ = generate(ck.params, cfg, prompt, tokens, temperature, top_k, seed)
        diff = first_char_mismatch(text, want)
        assert diff is None, f"prompt {prompt!r} seed {seed}: first mismatch at {diff}"
        assert page.text_content("#prompt-echo") == prompt
    assert page.is_hidden("#error")
    assert problems == []
    assert requested == [kit["html_path"].as_uri()], f"the kit made requests besides itself: {requested}"


def test_kit_bad_setting_shows_error(kit, browser):
    page, _, _ = open_offline(browser, kit["html_path"])
    generate_in_kit(page, "x", 0.8, 40, 0, 5000, 1)
    assert page.text_content("#error") == "tokens must be in 0..2000, got 5000"
    assert page.is_enabled("#generate")


def tamper(html: str) -> str:
    """One weight byte changed (the middle one, plus one mod 256), base64 re-encoded."""
    m = WEIGHTS_RE.search(html)
    raw = bytearray(base64.b64decode(m.group(2)))
    raw[len(raw) // 2] = (raw[len(raw) // 2] + 1) % 256
    return html[:m.start(2)] + base64.b64encode(bytes(raw)).decode("ascii") + html[m.end(2):]


def test_tampered_kit_refuses_weights(kit, browser):
    bad = kit["dir"] / "tampered.html"
    bad.write_text(tamper(kit["html"]), encoding="utf-8")
    page, _, problems = open_offline(browser, bad)
    error = page.text_content("#error")
    assert page.is_visible("#error")
    assert "weight hash mismatch" in error and kit["ck"].weight_hash in error, error
    assert page.is_disabled("#generate")
    assert page.evaluate("document.body.dataset.state") == "error"
    assert page.evaluate("typeof window.daisyKit") == "undefined"
    assert page.text_content("#hash") == "check failed", "the hash label still says it is checking"
    assert problems == []


def test_default_config_kit_under_1_mb():
    cfg = Config()
    html = render_kit(cfg.to_dict(), init_params(cfg), 0)
    size = len(html.encode("utf-8"))
    n_values = sum(w.size for w in init_params(cfg).values())
    assert size < 1_000_000, f"default-config kit is {size} bytes"
    assert size > n_values * 8 * 4 // 3, "the kit must carry every float64 weight"


def test_kit_modules_are_the_repo_files(kit):
    """Built from the page's own files: each inlined module is the repo file with only its
    relative import specifiers rewritten to bare names."""
    imports = json.loads(IMPORTMAP_RE.search(kit["html"]).group(1))["imports"]
    assert {"daisy/kit/kit.js", "daisy/generate.js", "daisy/model.js", "daisy/units.js"} <= set(imports)
    for name, url in imports.items():
        src = base64.b64decode(url.split(",", 1)[1]).decode("utf-8")
        rel = name[len(BARE_PREFIX):]
        repo = (FRONTEND / rel).read_text(encoding="utf-8")
        assert "'./" not in src and "'../" not in src, f"{name} keeps a relative import"

        def relative(m):                  # 'daisy/units.js' seen from rel's folder -> './units.js'
            spec = os.path.relpath(m.group(1), os.path.dirname(rel) or ".")
            return "'" + (spec if spec.startswith("..") else "./" + spec) + "'"
        assert re.sub(r"'daisy/([^']+)'", relative, src) == repo, \
            f"{name} differs from frontend_js/{rel} beyond its import specifiers"


def test_build_kit_accepts_checkpoint_path_and_bytes(kit):
    from_ck = build_kit(kit["ck"])
    assert from_ck == kit["html"]
    assert build_kit(kit["ck_path"]) == from_ck
    assert build_kit(kit["ck_path"].read_bytes()) == from_ck


@pytest.mark.parametrize("content, message", [
    (None, "No such file or directory"),
    (b"PK\x03\x04 truncated", "not a PyTorch zip checkpoint"),
    (b"just some text\n", "not a PyTorch zip checkpoint"),
])
def test_cli_names_bad_checkpoints(tmp_path, content, message):
    path = tmp_path / "bad.pt"
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "kit.html"
    r = subprocess.run([sys.executable, "-m", "daisy.files.kit", str(path), "-o", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and message in r.stderr and str(path) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


OPEN_KIT_CASES = """
import { readFileSync } from 'node:fs';
import { openKit } from './frontend_js/kit/kit.js';
const [meta, weights] = JSON.parse(readFileSync(0, 'utf8'));      // from stdin
const variants = {
  'not a kit': [{ ...meta, format: 'something-else' }, weights],
  'version': [{ ...meta, version: 99 }, weights],
  'tokenizer': [{ ...meta, tokenizer: 'gpt2' }, weights],
  'config': [{ ...meta, config: { ...meta.config, width: 5 } }, weights],
  'dimensions': [{ ...meta, config: { ...meta.config, layers: 1 } }, weights],
  'base64': [meta, weights.slice(0, 10) + '!!' + weights.slice(12)],
  'good': [meta, weights],
};
const out = {};
for (const [name, [m, w]] of Object.entries(variants)) {
  try { out[name] = 'ok ' + openKit(m, w).hash; } catch (e) { out[name] = `${e.name}: ${e.message}`; }
}
console.log(JSON.stringify(out));
"""


def test_open_kit_names_each_problem(kit):
    """The kit's loader (frontend_js/kit/kit.js openKit) under node, on the kit's own data."""
    meta = json.loads(re.search(r'id="daisy-kit-meta">(.*?)</script>', kit["html"]).group(1))
    weights = WEIGHTS_RE.search(kit["html"]).group(2)
    r = subprocess.run(["node", "--input-type=module", "-e", OPEN_KIT_CASES], input=json.dumps([meta, weights]),
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    n_values = sum(w.size for w in kit["ck"].params.values())
    assert out["good"] == "ok " + kit["ck"].weight_hash
    assert out["not a kit"] == "KitError: this is not a DaisyChain inference kit"
    assert out["version"] == "KitError: kit format version 99; this kit code reads version 1"
    assert out["tokenizer"] == 'KitError: tokenizer "gpt2"; this code has daisy-bytes-v1'
    assert out["config"] == "KitError: bad config in the kit: model width (width) must be in 16..128, got 5"
    assert out["dimensions"].startswith(f"KitError: the embedded weights have {n_values * 8} bytes; this config needs ")
    assert out["base64"] == "KitError: the embedded weights are not valid base64 (the kit file is damaged)"


def test_the_module_scan_reads_imports_not_comments(tmp_path):
    # a comment that mentions an import (wasm_asm.js: `import "env" "mem"`) is not one; a real
    # bare import is still refused by name
    from daisy.files.kit import KitError, _module_sources
    (tmp_path / "kit").mkdir()
    (tmp_path / "kit" / "kit.js").write_text("// the module's import \"env\" \"mem\" (a wasm import)\n"
                                             "import { a } from '../a.js';\n")
    (tmp_path / "a.js").write_text("/* from 'nowhere' in a block comment\n * import 'env' here too */\nexport const a = 1;\n")
    sources = _module_sources("kit/kit.js", tmp_path)
    assert sorted(sources) == ["daisy/a.js", "daisy/kit/kit.js"], sorted(sources)
    assert "from 'daisy/a.js'" in sources["daisy/kit/kit.js"]
    (tmp_path / "a.js").write_text("import fs from 'node:fs';\nexport const a = 1;\n")
    with pytest.raises(KitError, match="imports 'node:fs'"):
        _module_sources("kit/kit.js", tmp_path)
