"""The offline inference kit: one self-contained HTML file that generates text from a checkpoint's
weights with no network, opened from file://.

    python -m daisy.files.kit CHECKPOINT.pt -o kit.html

How it is built (from the same files the page serves, read at build time, so the kit cannot drift
from the page's code):
  - the template frontend_js/kit/kit.html;
  - the ES module frontend_js/kit/kit.js and every module it imports, found by following its
    relative `import ... from './x.js'` statements. Each module's relative specifiers are rewritten
    to bare ones ("daisy/units.js"), and an inline <script type="importmap"> maps each bare name
    to a data: URL of the module's source (base64). Relative imports cannot resolve from a data:
    URL, bare names through the import map can, and data: modules load from file:// pages;
  - the weights: every parameter's float64 little-endian bytes, row-major, in the canonical
    (hash) order, base64 in <script id="daisy-kit-weights">; beside them in
    <script id="daisy-kit-meta"> the JSON {format, version, config, tokenizer, step, weight_hash}.
On open the kit recomputes the weight hash and refuses weights that do not match (shown in red).
"""
from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from pathlib import Path

import numpy as np

from daisy.files.checkpoint import Checkpoint, CheckpointError, load_checkpoint, param_shapes
from daisy.hashing import weight_hash
from daisy.tokenizer import TOKENIZER_ID

FRONTEND = Path(__file__).resolve().parents[2] / "frontend_js"
TEMPLATE = FRONTEND / "kit" / "kit.html"
ENTRY = "kit/kit.js"                      # relative to FRONTEND
BARE_PREFIX = "daisy/"
KIT_FORMAT = "daisychain-kit"             # = frontend_js/kit/kit.js KIT_FORMAT, KIT_VERSION
KIT_VERSION = 1

# `import x from './a.js'`, `export { y } from '../b.js'`, `import './c.js'`: the specifier
_IMPORT = re.compile(r"""(\b(?:from|import)\s*)(['"])([^'"\n]+)\2""")
_FORBIDDEN = re.compile(r"\bimport\s*\(|\bimport\.meta\b")   # cannot work inside a data: module


class KitError(ValueError):
    """The kit cannot be built; the message names the problem."""


def _module_sources(entry: str = ENTRY, root: Path = FRONTEND) -> dict:
    """-> {bare name: source with relative imports rewritten}, the entry's whole import graph."""
    out, todo = {}, [entry]
    while todo:
        rel = todo.pop()
        if BARE_PREFIX + rel in out:
            continue
        path = root / rel
        try:
            src = path.read_text(encoding="utf-8")
        except OSError as e:
            raise KitError(f"cannot read the kit module {path}: {e.strerror or e}") from None
        if _FORBIDDEN.search(src):
            raise KitError(f"{path} uses import() or import.meta, which a data: module in the kit cannot")
        base = Path(rel).parent

        def rewrite(m):
            line_start = src.rfind("\n", 0, m.start()) + 1
            before = src[line_start:m.start()]
            if "//" in before or "/*" in before or before.lstrip().startswith("*"):
                return m.group(0)                          # words in a comment, not an import
            spec = m.group(3)
            if not spec.startswith(("./", "../")):
                raise KitError(f"{path} imports {spec!r}: the kit inlines only relative imports of frontend_js/")
            target = (base / spec).as_posix()
            parts = []
            for part in target.split("/"):                 # normalise a/./b and a/../b
                if part == "..":
                    if not parts:
                        raise KitError(f"{path} imports {spec!r}, outside frontend_js/")
                    parts.pop()
                elif part not in ("", "."):
                    parts.append(part)
            target = "/".join(parts)
            todo.append(target)
            return f"{m.group(1)}{m.group(2)}{BARE_PREFIX}{target}{m.group(2)}"

        out[BARE_PREFIX + rel] = _IMPORT.sub(rewrite, src)
    return out


def _script_json(obj) -> str:
    """JSON safe inside a <script> element (no '</' can close it)."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).replace("</", "<\\/")


def render_kit(config: dict, params: dict, step: int) -> str:
    """config (plain dict), params {name: float64 array} in canonical order, step -> the kit HTML."""
    shapes = param_shapes(config)
    if list(params) != list(shapes):
        raise KitError(f"parameters {list(params)[:3]}... are not the config's {list(shapes)[:3]}... in order")
    blobs = []
    for name, shape in shapes.items():
        w = np.asarray(params[name])
        if w.shape != tuple(shape):
            raise KitError(f"{name} has shape {w.shape}, the config needs {tuple(shape)}")
        blobs.append(np.ascontiguousarray(w, dtype="<f8").tobytes())
    meta = {"format": KIT_FORMAT, "version": KIT_VERSION, "config": dict(config), "tokenizer": TOKENIZER_ID,
            "step": int(step), "weight_hash": weight_hash(params)}
    modules = _module_sources()
    importmap = {"imports": {name: "data:text/javascript;base64," + base64.b64encode(src.encode()).decode("ascii")
                             for name, src in sorted(modules.items())}}
    html = TEMPLATE.read_text(encoding="utf-8")
    for slot, value in (("{{META}}", _script_json(meta)),
                        ("{{WEIGHTS}}", base64.b64encode(b"".join(blobs)).decode("ascii")),
                        ("{{IMPORTMAP}}", _script_json(importmap)),
                        ("{{ENTRY}}", BARE_PREFIX + ENTRY)):
        if html.count(slot) != 1:
            raise KitError(f"the template {TEMPLATE} must hold {slot} exactly once")
        html = html.replace(slot, value)
    return html


def build_kit(checkpoint_or_path) -> str:
    """A Checkpoint (daisy.files.checkpoint), a .pt path or its bytes -> the kit HTML.
    A bad file raises daisy.files.checkpoint.CheckpointError naming the problem."""
    ck = checkpoint_or_path if isinstance(checkpoint_or_path, Checkpoint) else load_checkpoint(checkpoint_or_path)
    return render_kit(ck.config, ck.params, ck.step)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m daisy.files.kit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a .pt checkpoint written by DaisyChain-Web")
    ap.add_argument("-o", "--output", required=True, help="the kit file to write (e.g. kit.html)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        ck = load_checkpoint(args.checkpoint)
        html = build_kit(ck)
    except (CheckpointError, KitError) as e:
        print(f"error: {args.checkpoint}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {args.checkpoint}: {e.strerror or e}", file=sys.stderr)
        return 2
    data = html.encode("utf-8")
    try:
        Path(args.output).write_bytes(data)
    except OSError as e:
        print(f"error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} ({len(data)} bytes; step {ck.step}, weights {ck.weight_hash[:16]})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
