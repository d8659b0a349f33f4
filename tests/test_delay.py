"""The delayed update (`--delay 1`, Config.delay; docs/VERIFICATION.md "The delayed update"):
W_{s+1} = adam(W_s, G_{s-1}), G_{-1} = no update, and the run's last step applies G_{S-2} then
G_{S-1}. Golden-value rule: the expected hashes come from a loop written here that runs a plain
(delay 0) Group's local steps and collective and calls adam_step itself with the G it kept,
not from Trainer.apply's delayed branch.
Python = Node byte for byte (with churn, the last step, and an audited run with a rollback):
tests/test_js_mirror.py's runner style, here for the delayed setting."""
import copy
import json
import shutil
import subprocess
import sys

import pytest

from daisy import data
from daisy.config import Config, ConfigError
from daisy.hashing import weight_hash
from daisy.optim import adam_step
from daisy.train import Group, copy_replica
from tests.reference import REPO_ROOT, assert_refused, first_diff, setting_args, train_cli, train_json

TINY = {"width": 16, "seq_len": 16, "batch": 2, "layers": 1, "heads": 4, "steps": 100}
TINY_ARGS = setting_args(TINY)
NODE = shutil.which("node")


def by_hand(cfg: Config, peers: int, steps: int) -> list[str]:
    """The delayed rule, written out over a delay-0 Group: the hash after each step."""
    plain = Config(**{**cfg.to_dict(), "delay": 0})
    g = Group(plain, peers, data.builtin_stream())
    roster, pending, hashes = list(range(peers)), None, []
    for s in range(steps):
        hs = [g.collective.exchange(s, roster, slot, *t.local_step(s, slot)) for slot, t in enumerate(g.trainers)]
        _, G = hs[0].result()
        todo = ([pending] if pending is not None else []) + ([G] if s + 1 == cfg.steps else [])
        pending = None if s + 1 == cfg.steps else G
        for r in g.replicas:
            for grads in todo:
                adam_step(r.params, grads, r.adam, cfg.lr)
        hashes.append(weight_hash(g.replicas[0].params))
    return hashes


def test_delayed_run_is_the_rule_written_out_to_its_last_step():
    cfg = Config(**TINY, delay=1)
    got = train_json(*TINY_ARGS, "--delay", "1", "--peers", "2")
    assert len(got) == 100 and all(len(set(line["hashes"])) == 1 for line in got)
    want = by_hand(cfg, 2, 100)
    for line, h in zip(got, want):
        assert line["hashes"][0] == h, f"first mismatch at step {line['step']}: {line['hashes'][0]} != {h}"
    plain = train_json(*TINY_ARGS, "--peers", "2", "--stop-after", "2")
    assert got[0]["hashes"][0] != plain[0]["hashes"][0]            # step 1 applies nothing yet
    assert got[1]["hashes"][0] == plain[0]["hashes"][0]            # step 2 applies G_0: W_2 = plain W_1


def test_replica_state_holds_the_pending_gradient():
    cfg = Config(**TINY, delay=1)
    g = Group(cfg, 2, data.builtin_stream())
    for _ in range(3):
        g.step()
    r = g.replicas[0]
    assert r.step == 3 and r.adam["t"] == 2 and r.pending is not None
    snap = copy_replica(r)                       # the one snapshot rule: the pending G travels
    assert snap.step == 3 and snap.pending is not r.pending
    assert all((snap.pending[k] == r.pending[k]).all() for k in r.pending)
    g.resize(3)                                  # a joiner gets replica 0's pending G too
    step, _, hashes = g.step()
    assert step == 4 and len(set(hashes)) == 1


def test_config_wire_form_and_range():
    assert "delay" not in Config().to_dict()                     # the default's bytes are unchanged
    assert Config(delay=1).to_dict()["delay"] == 1
    assert Config.from_dict(Config(delay=1).to_dict()) == Config(delay=1)
    with pytest.raises(ConfigError, match=r"update delay \(delay\) must be in 0..1, got 2"):
        Config(delay=2)


def test_save_of_a_delayed_run_only_at_its_end(tmp_path):
    assert_refused(train_cli(*TINY_ARGS, "--delay", "1", "--stop-after", "5", "--save", str(tmp_path / "a.pt")),
                   "--save with --delay 1 only at the run's end")
    from daisy.files.checkpoint import load_checkpoint
    lines = train_json(*TINY_ARGS, "--delay", "1", "--peers", "1", "--save", str(tmp_path / "b.pt"))
    ck = load_checkpoint(tmp_path / "b.pt")
    assert ck.config["delay"] == 1 and ck.adam_t == 100 and ck.weight_hash == lines[-1]["hashes"][0]


CASES = {
    # churn: joiners copy replica 0's pending G; the 4-peer steps take the sharded reduce; the last step
    "roster": [*TINY_ARGS, "--delay", "1", "--roster", "0:2,30:4,60:1,80:3", "--json"],
    # an audited run: the forger is removed and every replica rolls back (pending G included)
    "attack": [*TINY_ARGS, "--delay", "1", "--peers", "3", "--attack", "slot=1,from=9,kind=scale:-1000",
               "--stop-after", "30"],
}


@pytest.mark.parametrize("name", list(CASES))
def test_python_and_node_print_the_same_delayed_run(name):
    assert NODE, "node is required"
    args = CASES[name]
    run = lambda cmd: subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    py, js = run([sys.executable, "-m", "daisy.train", *args]), run([NODE, "frontend_js/cli.mjs", *args])
    py_out, js_out = py.communicate(timeout=300)[0], js.communicate(timeout=300)[0]
    assert py.returncode == 0 and js.returncode == 0, (py_out[-800:], js_out[-800:])
    if name == "attack":
        assert "removed" in py_out and "rolled back" in py_out, py_out[-800:]
    else:
        assert len(py_out.splitlines()) == 100 and json.loads(py_out.splitlines()[-1])["step"] == 100
    diff = first_diff(py_out, js_out)
    assert diff is None, f"{name}: python and node differ at {diff}"
