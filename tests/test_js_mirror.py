"""The JS CPU mirror (frontend_js/) against the Python reference, bit for bit, under node:

1. `python -m daisy.fixtures DIR`, then `node --test tests/js/` with DAISY_FIXTURES=DIR: units,
   one forward, one backward, 20 training steps' hashes; the wasm engine's gates (tests/js/).
2. `python -m daisy.train ... --json` and `node frontend_js/cli.mjs ... --json` for 20 steps print
   identical lines (P=1, P=3, one non-default config, a --roster schedule, node on 2 threads, the
   int8 exchange at the defaults and through a --roster schedule; the text lines of a --roster run
   too); bad settings and bad schedules give the same error message.
The Python and node processes run concurrently to keep the suite inside its time budget.
"""
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.reference import first_diff

ROOT = Path(__file__).resolve().parents[1]
NODE = shutil.which("node")
TIMEOUT = 480   # a bound, not a timing: the node suite took 227 s once on a box at load 10 (~70 s quiet)

CLI_CASES = {
    "P1": ["--peers", "1", "--steps", "100", "--stop-after", "20"],
    "P3": ["--peers", "3", "--steps", "100", "--stop-after", "20", "--batch", "2", "--seq-len", "16"],
    "w48h3t24l1": ["--peers", "2", "--steps", "100", "--stop-after", "20", "--width", "48", "--heads", "3",
                   "--seq-len", "24", "--layers", "1", "--batch", "3", "--lr", "20", "--seed", "7"],
    # churn: grows to 4 peers (the sharded reduce), shrinks to 1, grows again
    "roster": ["--roster", "0:2,5:4,12:1,15:3", "--steps", "100", "--stop-after", "20", "--batch", "2",
               "--seq-len", "16"],
    # node on 2 threads (frontend_js/cpu/threads.js; --threads is node's only) at a size whose largest
    # units and row pieces are split between the threads
    "threads2": ["--peers", "2", "--steps", "100", "--stop-after", "20", "--width", "64", "--seq-len", "64",
                 "--batch", "4", "--layers", "1"],
    # the int8 exchange (daisy/exchange_codec.py): the default settings, and churn through both
    # topologies (2 -> 5 peers: rsag; 5 -> 3: all-gather; 3 -> 4: rsag)
    "int8": ["--exchange", "int8", "--peers", "2", "--steps", "100", "--stop-after", "20"],
    "int8_roster": ["--exchange", "int8", "--roster", "0:2,4:5,9:3,13:4", "--steps", "100", "--stop-after", "20",
                    "--batch", "2", "--seq-len", "16"],
}
JS_ONLY_ARGS = {"threads2": ["--threads", "2"]}
# the text lines too (they say the peer count of each step)
TEXT_CASE = ["--roster", "0:1,3:3,6:2", "--steps", "100", "--stop-after", "8", "--width", "16", "--heads", "4",
             "--layers", "1", "--batch", "2", "--seq-len", "16"]
BAD_ARGS = [
    ["--width", "5"], ["--heads", "8", "--width", "36"], ["--peers", "0"], ["--width", "abc"],
    ["--stop-after", "0"], ["--steps", "99"], ["--bogus"], ["--s", "3"], ["--seed", "-1"], ["--lr", "51"],
    # bad roster schedules (tests/test_roster.py has one test per message)
    ["--roster", ""], ["--roster", "0:2,x:3"], ["--roster", "0:1234567890"], ["--roster", "0:65"],
    ["--roster", "0:2,5:3,5:2"], ["--roster", "1:2"], ["--roster", "0:2,100:3", "--steps", "100"],
    ["--roster", "0:2", "--peers", "2"], ["--r", "0:2"], ["--roster", "-1:2"],
    ["--exchange", "int4"], ["--exchange", "F64"],
    ["--local-steps", "0"], ["--local-steps", "65"],
]
# node's own flag: bad values exit 2 with a message naming it
BAD_JS_ONLY = {("--threads", "0"): "threads (--threads) must be in 1..16, got 0",
               ("--threads", "17"): "threads (--threads) must be in 1..16, got 17"}


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, **kw)


def descendants(pid):
    """Every process below pid (from /proc: a process's parent is the 4th field of its stat)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def run_node_suite(cmd, env):
    """`node --test` within TIMEOUT. At the bound it is stopped, and what it was doing is told: the
    test files still running and each one's JavaScript stack (tests/js/stacks.mjs: a file spinning
    in a loop or in microtasks never reaches its own test timeouts). Only the suite's test fails."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        files = {}
        for pid in descendants(proc.pid):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            named = [a.decode() for a in args if a.endswith(b".test.mjs")]
            if named:
                files[pid] = named[0]
        stacks = subprocess.run([NODE, "tests/js/stacks.mjs", *map(str, files)], cwd=ROOT, capture_output=True,
                                text=True, timeout=60).stdout if files else ""
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        running = ", ".join(f"{f} (pid {pid})" for pid, f in files.items()) or "none"
        return subprocess.CompletedProcess(cmd, None, out, f"{err[-3000:]}\nthe suite ran into its {TIMEOUT} s bound;"
                                           f" test files still running: {running}\n{stacks}")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Everything runs once, concurrently: fixtures then node --test; each CLI pair."""
    assert NODE, "node is required for the JS mirror tests (install nodejs)"
    fixtures = tmp_path_factory.mktemp("fixtures")

    def fixture_suite():
        gen = run([sys.executable, "-m", "daisy.fixtures", str(fixtures)])
        assert gen.returncode == 0, gen.stderr
        # the run fuzz's schedules fixed in CI (a base seed that passed here again and again; its
        # past failures run every time too): each random seed can meet a new rare race on a loaded
        # 2-core machine, found and fixed in a developer's run (node --test draws a new seed), not
        # by a CI run that then lands nothing
        # (100 of its schedules here, 200 in a developer's `node --test`: the fuzz is the suite's
        # longest test, ~55 s of one worker for 200, and the fixed seed's schedules repeat each run)
        env = {"DAISY_FIXTURES": str(fixtures), "PATH": "/usr/bin:/bin", "DAISY_FUZZ_SEED": "509416", "FUZZ_SCHEDULES": "100"}
        env = {**os.environ, **env}
        # two test files at a time (node's default on 2 cores is one): most of the suite waits on
        # timers and the in-memory transport, so this halves its time (~180 s -> ~95 s here)
        return run_node_suite([NODE, "--test", "--test-concurrency=2", "tests/js/"], env)

    jobs = {"node-test": fixture_suite}
    for name, args in CLI_CASES.items():
        jobs[f"py-{name}"] = lambda a=args: run([sys.executable, "-m", "daisy.train", *a, "--json"])
        jobs[f"js-{name}"] = lambda a=args + JS_ONLY_ARGS.get(name, []): run([NODE, "frontend_js/cli.mjs", *a, "--json"])
    jobs["py-text"] = lambda: run([sys.executable, "-m", "daisy.train", *TEXT_CASE])
    jobs["js-text"] = lambda: run([NODE, "frontend_js/cli.mjs", *TEXT_CASE])
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {k: pool.submit(f) for k, f in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


def failed_blocks(tap, limit=12000):
    """The TAP blocks of failed tests (a 160-test log's tail shows only passes)."""
    lines, out, keep = tap.splitlines(), [], False
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith("not ok "):
            keep = True
        elif stripped.startswith("ok ") or stripped.startswith("# Subtest:"):
            keep = False
        if keep:
            out.append(line)
    text = "\n".join(out) or tap[-6000:]
    return text[:limit]


def test_node_suite_against_fixtures(results):
    r = results["node-test"]
    assert r.returncode == 0, f"node --test tests/js/ failed:\n{failed_blocks(r.stdout)}\n{r.stderr[-6000:]}"
    assert "# fail 0" in r.stdout and "# pass " in r.stdout, r.stdout[-2000:]


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_cli_json_lines_identical(results, name):
    py, js = results[f"py-{name}"], results[f"js-{name}"]
    assert py.returncode == 0, py.stderr
    assert js.returncode == 0, js.stderr
    assert len(py.stdout.splitlines()) == 20
    diff = first_diff(py.stdout, js.stdout)
    assert diff is None, f"{name}: python and node --json output differ at {diff}"


def test_cli_text_lines_identical_under_a_roster(results):
    py, js = results["py-text"], results["js-text"]
    assert py.returncode == 0 and js.returncode == 0, (py.stderr, js.stderr)
    counts = [line.rsplit("(", 1)[1] for line in py.stdout.splitlines()]
    assert counts == ["1 peers agree)"] * 3 + ["3 peers agree)"] * 3 + ["2 peers agree)"] * 2, py.stdout
    diff = first_diff(py.stdout, js.stdout)
    assert diff is None, f"python and node text output differ at {diff}"


def test_cli_bad_settings_same_messages():
    """Out-of-range settings: exit 2 and the same 'error: ...' message, no stack trace."""
    # the 2 x 24 processes, 4 at a time (each is mostly its interpreter's start), checked in order
    def pair(args):
        return run([sys.executable, "-m", "daisy.train", *args]), run([NODE, "frontend_js/cli.mjs", *args])
    with ThreadPoolExecutor(max_workers=4) as pool:
        pairs = list(pool.map(pair, BAD_ARGS))
    for args, (py, js) in zip(BAD_ARGS, pairs):
        assert py.returncode == 2 and js.returncode == 2, (args, py.returncode, js.returncode, js.stderr)
        py_msg = py.stderr.strip().splitlines()[-1].split(": error: ", 1)[1]
        js_msg = js.stderr.strip().splitlines()[-1].split(": error: ", 1)[1]
        assert js_msg == py_msg, f"{args}: python says {py_msg!r}, node says {js_msg!r}"
        assert "    at " not in js.stderr, f"{args}: node printed a stack trace:\n{js.stderr}"


def test_cli_bad_threads():
    for args, msg in BAD_JS_ONLY.items():
        js = run([NODE, "frontend_js/cli.mjs", *args])
        assert js.returncode == 2 and js.stderr.strip().endswith(f"error: {msg}"), (args, js.returncode, js.stderr)


def test_cli_data_files(tmp_path):
    """--data: a raw uint16 token file and a text file train; a missing file, a parquet path and
    an out-of-vocabulary token are refused with a message, exit 2."""
    text = "\n\n\n".join(f"document {i}: the quick brown fox jumps over the lazy dog." * 3 for i in range(20))
    (tmp_path / "c.txt").write_text(text, encoding="utf-8")
    import numpy as np
    from daisy.tokenizer import encode_documents
    encode_documents(text.split("\n\n\n")).astype("<u2").tofile(tmp_path / "c.u16")
    a = run([NODE, "frontend_js/cli.mjs", "--data", str(tmp_path / "c.txt"), "--stop-after", "2", "--json"])
    b = run([NODE, "frontend_js/cli.mjs", "--data", str(tmp_path / "c.u16"), "--stop-after", "2", "--json"])
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout and len(a.stdout.splitlines()) == 2
    np.array([1, 2, 300], dtype="<u2").tofile(tmp_path / "bad.u16")
    for path, words in [(tmp_path / "missing.txt", "no such file"), (tmp_path / "x.parquet", "parquet"),
                        (tmp_path / "bad.u16", "outside the vocabulary")]:
        r = run([NODE, "frontend_js/cli.mjs", "--data", str(path), "--stop-after", "1"])
        assert r.returncode == 2 and words in r.stderr and "    at " not in r.stderr, (path, r.returncode, r.stderr)
