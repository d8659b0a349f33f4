"""The Python/JS twins: each numeric module of daisy/ has a JS twin in frontend_js/ with the same
names (camelCase in JS; UPPER_CASE constants and classes spelled alike) and operation order.

Checked here, by reading the files (no import, no node): both files of every pair exist; each
names its twin's path in its header comment (Python: the module docstring; JS: the leading `//`
lines); every JS module whose header says it mirrors or twins a daisy/ file is in TWINS; and a
few names the docs give as shared (docs/ARCHITECTURE.md, the module headers) exist in both — at
the top level of the Python module, exported by the JS one. That the twins compute the same bits
is for tests/test_js_mirror.py.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Python file, JS file, names in Python spelling that both define (JS: camel_case -> camelCase)
TWINS = [
    ("daisy/units.py", "frontend_js/units.js", ["qmatmul", "quantize_rows", "quantize_cols", "epilogue", "QMAX"]),
    ("daisy/model.py", "frontend_js/model.js", ["forward", "backward", "loss_and_grads", "param_shapes",
                                                 "init_params", "rmsnorm", "causal_softmax", "cross_entropy"]),
    ("daisy/optim.py", "frontend_js/optim.js", ["adam_init", "adam_step", "pow_int"]),
    ("daisy/prng.py", "frontend_js/prng.js", ["mix32", "key", "draw", "uniform", "PURPOSE_DATA"]),
    ("daisy/detmath.py", "frontend_js/detmath.js", ["exp", "log", "rint", "tree_sum"]),
    ("daisy/tokenizer.py", "frontend_js/tokenizer.js", ["encode", "decode", "encode_documents", "EOT",
                                                         "VOCAB_SIZE", "TOKENIZER_ID"]),
    ("daisy/hashing.py", "frontend_js/hashing.js", ["weight_hash"]),
    ("daisy/collective.py", "frontend_js/collective.js", ["SimulatedCollective", "topology_for", "shard_bounds",
                                                           "codec_reduce"]),
    ("daisy/reduce.py", "frontend_js/reduce.js", ["reduce_gradients", "reduce_losses"]),
    ("daisy/exchange_codec.py", "frontend_js/exchange_codec.js", ["codec_for", "CodecError", "CODECS"]),
    ("daisy/audit.py", "frontend_js/audit.js", ["slot_messages", "slot_digest", "audit_pairs", "beacon",
                                                 "cheap_check", "judge", "round_digest", "adam_state_hash",
                                                 "check_start_state", "round_end"]),
    ("daisy/attack_rounds.py", "frontend_js/attack_rounds.js", ["RoundAuditedRun"]),
    ("daisy/attack.py", "frontend_js/attack.js", ["parse_attack", "run_audited", "forge"]),
    ("daisy/config.py", "frontend_js/config.js", ["RANGES", "EXCHANGES", "ConfigError", "validate"]),
    ("daisy/data.py", "frontend_js/data.js", ["batch_starts", "get_batch", "DataError"]),
    ("daisy/fixtures.py", "frontend_js/fixtures.js", ["read_fixture"]),
    ("daisy/generate.py", "frontend_js/generate.js", ["generate", "next_token"]),
    ("daisy/batch_source.py", "frontend_js/batch_source.js", ["StreamBatches", "HttpBatches", "BatchError"]),
    ("daisy/train.py", "frontend_js/train.js", ["Trainer", "Group", "Replica", "check_loss",
                                                 "parse_roster", "check_roster", "peers_at", "left_at", "local_joiner"]),
    ("daisy/cli.py", "frontend_js/cli.mjs", ["parse_args", "main"]),
    ("daisy/files/state_codec.py", "frontend_js/state_codec.js", ["encode_state", "decode_state", "MAX_STATE_BYTES",
                                                                   "STATE_FORMAT", "STATE_VERSION"]),
]


def js_name(py_name: str) -> str:
    """snake_case -> camelCase; UPPER_CASE and CamelCase stay as they are."""
    if py_name.isupper() or "_" not in py_name:
        return py_name
    head, *rest = py_name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def py_header(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""


def js_header(path: Path) -> str:
    lines = path.read_text().split("\n")
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    header = []
    for line in lines:
        if not line.startswith("//"):
            break
        header.append(line)
    return "\n".join(header)


def py_top_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def js_exports(path: Path) -> set[str]:
    text = path.read_text()
    names = set(re.findall(r"^export\s+(?:async\s+)?(?:function\*?|class|const|let|var)\s+([A-Za-z_$][\w$]*)",
                           text, re.M))
    for group in re.findall(r"^export\s*\{([^}]*)\}", text, re.M):
        names.update(item.split(" as ")[-1].strip() for item in group.split(",") if item.strip())
    return names


def test_both_twins_exist_and_name_each_other():
    problems = []
    for py, js, _ in TWINS:
        py_path, js_path = ROOT / py, ROOT / js
        if not py_path.is_file() or not js_path.is_file():
            problems.append(f"{py} <-> {js}: missing {[p for p in (py, js) if not (ROOT / p).is_file()]}")
            continue
        if js not in py_header(py_path):
            problems.append(f"{py}: its module docstring does not name its twin {js}")
        if py not in js_header(js_path):
            problems.append(f"{js}: its header comment does not name its twin {py}")
    assert not problems, f"{len(problems)} twin problem(s), first: {problems[0]}\n" + "\n".join(problems)


def test_every_js_module_that_mirrors_daisy_is_listed():
    """A JS module whose header says it mirrors (or is the twin of) a daisy/ file is in TWINS with
    that file, so a new twin is not left out of this list."""
    listed = {(py, js) for py, js, _ in TWINS}
    claims = []
    for path in sorted(p for p in (ROOT / "frontend_js").rglob("*") if p.suffix in (".js", ".mjs")):
        js = path.relative_to(ROOT).as_posix()
        for py in re.findall(r"(?:mirroring|mirrors|twin of)\s+(daisy/[\w/]+\.py)", js_header(path)):
            claims.append((py, js))
    assert claims, "no JS header claims a daisy/ twin: the pattern no longer matches the headers"
    missing = [c for c in claims if c not in listed]
    assert not missing, f"JS headers name a daisy/ twin not in TWINS, first: {missing[0]}\n{missing}"


def test_shared_names_exist_in_both():
    problems = []
    for py, js, names in TWINS:
        have_py, have_js = py_top_names(ROOT / py), js_exports(ROOT / js)
        for name in names:
            if name not in have_py:
                problems.append(f"{py}: no top-level {name}")
            if js_name(name) not in have_js:
                problems.append(f"{js}: no export {js_name(name)} (the twin of {py} {name})")
    assert not problems, f"{len(problems)} missing shared name(s), first: {problems[0]}\n" + "\n".join(problems)


def test_js_name_rule():
    assert [js_name(n) for n in ("loss_and_grads", "forward", "QMAX", "PURPOSE_DATA", "HttpBatches", "mix32")] == \
        ["lossAndGrads", "forward", "QMAX", "PURPOSE_DATA", "HttpBatches", "mix32"]


def daisy_imports(path: Path) -> set[str]:
    """The daisy/ modules (as paths under ROOT) that a daisy/ module imports anywhere in it, a
    function's body included, its `if __name__ == "__main__":` block aside."""
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))]
    package = path.parent.relative_to(ROOT).as_posix().split("/")
    found = set()
    for node in (n for top in body for n in ast.walk(top)):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = package[:len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            names = [base + [a.name] for a in node.names] if node.module is None else [base]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "daisy":
            names = [node.module.split(".")]
        else:
            continue
        for parts in names:
            for candidate in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
                if (ROOT / candidate).is_file():
                    found.add(candidate)
    return found


def test_no_import_cycle_in_daisy():
    """The Python side has no import loop (a lazy import inside a function counts): train.py is the
    library, cli.py the command line that imports it and attack.py (the JS side's rule is
    tests/js/imports.test.mjs)."""
    graph = {p.relative_to(ROOT).as_posix(): daisy_imports(p) for p in sorted((ROOT / "daisy").rglob("*.py"))}
    assert "daisy/train.py" in graph["daisy/cli.py"] and "daisy/attack.py" in graph["daisy/cli.py"], graph["daisy/cli.py"]
    state, path = {}, []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(dep):] + [dep]))
            if dep not in state:
                visit(dep)
        path.pop()
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module)
