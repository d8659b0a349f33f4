"""Local steps (`--local-steps H`, Config.local_steps; docs/VERIFICATION.md "Local steps"): each
replica takes H Adam steps on its own batches, then the group averages D_i = anchor - W_i through
the exchange codec (keyed on the round's last step) and steps to the mean: anchor = anchor - D;
the run's last step always exchanges.
Golden-value rule: the expected hashes come from a loop written here over a plain (H = 1)
Group's trainers, its collective and daisy.optim.adam_step, not from Group.local_step.
Python = Node byte for byte (churn at round starts, named slots leaving, the sharded reduce, a
partial last round)."""
import copy
import shutil
import subprocess
import sys

import pytest

from daisy import data
from daisy.config import Config, ConfigError
from daisy.hashing import weight_hash
from daisy.optim import adam_init, adam_step
from daisy.train import Group, Replica, Trainer, copy_replica
from tests.reference import REPO_ROOT, assert_refused, first_diff, setting_args, train_cli, train_json

TINY = {"width": 16, "seq_len": 16, "batch": 2, "layers": 1, "heads": 4, "steps": 100}
TINY_ARGS = setting_args(TINY)
NODE = shutil.which("node")


def by_hand(cfg: Config, peers: int, steps: int, leave=None, join=None) -> list[str]:
    """The rule, written out over an H = 1 Group: the anchor's hash after each step. leave:
    {round start: [slots that leave there]}: the other trainers keep their order and their own
    state, under their new slot numbers (their position in the list); join: {round start: how
    many join there}: appended, each with the anchor as its weights and a fresh Adam state."""
    g = Group(Config(**{**cfg.to_dict(), "local_steps": 1}), peers, data.builtin_stream())
    H = cfg.local_steps
    trainers = list(g.trainers)
    anchor = copy.deepcopy(g.replicas[0].params)
    hashes = []
    for s in range(steps):
        gone = (leave or {}).get(s, [])
        trainers = [t for i, t in enumerate(trainers) if i not in gone]
        trainers += [Trainer(g.cfg, Replica(copy.deepcopy(anchor), adam_init(anchor)), g.batches)
                     for _ in range((join or {}).get(s, 0))]
        roster = list(range(len(trainers)))
        for slot, t in enumerate(trainers):
            _, grads = t.local_step(s, slot)
            adam_step(t.replica.params, grads, t.replica.adam, cfg.lr)
        if (s + 1) % H == 0 or s + 1 == cfg.steps:
            hs = [g.collective.exchange(s, roster, slot, 0.0, {k: anchor[k] - t.replica.params[k] for k in anchor})
                  for slot, t in enumerate(trainers)]
            D = hs[0].result()[1]
            for k in anchor:
                anchor[k] = anchor[k] - D[k]
            for t in trainers:
                t.replica.params = copy.deepcopy(anchor)
        hashes.append(weight_hash(anchor))
    return hashes


def test_local_steps_run_is_the_rule_written_out_to_its_last_step():
    cfg = Config(**TINY, local_steps=3)                  # 100 = 33 rounds of 3, then a round of 1
    got = train_json(*TINY_ARGS, "--local-steps", "3", "--peers", "2")
    assert len(got) == 100 and all(len(set(line["hashes"])) == 1 for line in got)
    want = by_hand(cfg, 2, 100)
    for line, h in zip(got, want):
        assert line["hashes"][0] == h, f"first mismatch at step {line['step']}: {line['hashes'][0]} != {h}"
    # the anchor moves only at an exchange: steps 1, 2 keep the initial weights, 3 moves, 99 and 100 both do
    assert got[0]["hashes"] == got[1]["hashes"] != got[2]["hashes"]
    assert got[97]["hashes"] != got[98]["hashes"] != got[99]["hashes"]


def test_a_departure_at_a_round_start_keeps_each_survivors_own_state():
    """--roster R:P:SLOTS: the slots named leave at round start R; the others keep their order
    and their own Adam state under their new slot numbers (docs/VERIFICATION.md "Local steps")."""
    cfg = Config(**TINY, local_steps=4)
    got = train_json(*TINY_ARGS, "--local-steps", "4", "--roster", "0:4,8:3:1,16:1:0.2", "--stop-after", "24")
    assert [len(line["hashes"]) for line in got] == [4] * 8 + [3] * 8 + [1] * 8
    want = by_hand(cfg, 4, 24, leave={8: [1], 16: [0, 2]})
    for line, h in zip(got, want):
        assert line["hashes"][0] == h, f"first mismatch at step {line['step']}: {line['hashes'][0]} != {h}"
    # which slot left matters with local steps (each replica's own Adam state): slot 1 is not slot 3
    other = train_json(*TINY_ARGS, "--local-steps", "4", "--roster", "0:4,8:3:3", "--stop-after", "12")
    assert other[7]["hashes"] == got[7]["hashes"] and other[11]["hashes"] != got[11]["hashes"]
    # per-step runs (H = 1): every replica is the same, so 8:3:1 = 8:3 (the highest slot leaving)
    named = train_json(*TINY_ARGS, "--roster", "0:4,8:3:1", "--stop-after", "10")
    assert named == train_json(*TINY_ARGS, "--roster", "0:4,8:3", "--stop-after", "10")


ROSTER_REFUSALS = [
    ("0:3,8:2:3", "--roster entry '8:2:3': the slots that leave must be increasing slots of the 3 peers before it"),
    ("0:3,8:1:2.0", "--roster entry '8:1:2.0': the slots that leave must be increasing slots of the 3 peers before it"),
    ("0:3,8:1:1", "--roster entry '8:1:1': 2 of the 3 peers stay, more than 1"),
    ("0:1:0", "--roster entry '0:1:0': the slots that leave must be increasing slots of the 0 peers before it"),
    ("0:3,8:2:a", "--roster entry '8:2:a' is not STEP:PEERS (a 0-based step index and a peer count, e.g. 0:2,10:3) "
                  "or STEP:PEERS:SLOTS (the slots that leave, e.g. 8:1:0.2)"),
    ("0:3,9:2:1", "--roster entry '9:2:1': with --local-steps 4 the roster changes only at a round's start "
                  "(a step index that is a multiple of 4)"),
    ("0:3,6:4", "--roster entry '6:4': with --local-steps 4 the roster changes only at a round's start "
                "(a step index that is a multiple of 4)"),
]


@pytest.mark.parametrize("roster,needle", ROSTER_REFUSALS)
def test_bad_rosters_of_local_steps_are_refused_by_name_in_both_clis(roster, needle):
    assert NODE, "node is required"
    args = [*TINY_ARGS, "--local-steps", "4", "--roster", roster]
    assert_refused(train_cli(*args), needle)
    js = subprocess.run([NODE, "frontend_js/cli.mjs", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert js.returncode == 2 and js.stderr.strip().splitlines()[-1].endswith(f"error: {needle}"), js.stderr


def test_a_joiner_at_a_round_start_takes_the_anchor_and_a_fresh_adam_state():
    """A roster that grows in a run of local steps: each joiner starts at the anchor (the group's
    weights, which it can check) with m = v = 0, t = 0 (nothing another device's own moments
    would have to be trusted for); "8:3:0" = slot 0 leaves and two join, at one round start."""
    cfg = Config(**TINY, local_steps=4)
    got = train_json(*TINY_ARGS, "--local-steps", "4", "--roster", "0:2,8:3,16:3:0", "--stop-after", "24")
    assert [len(line["hashes"]) for line in got] == [2] * 8 + [3] * 16
    want = by_hand(cfg, 2, 24, leave={16: [0]}, join={8: 1, 16: 1})
    for line, h in zip(got, want):
        assert line["hashes"][0] == h, f"first mismatch at step {line['step']}: {line['hashes'][0]} != {h}"
    g = Group(cfg, 2, data.builtin_stream())
    for _ in range(4):
        g.step()
    g.resize(3)
    j = g.replicas[2]
    assert j.step == 4 and j.adam["t"] == 0 and all((j.adam["m"][k] == 0).all() for k in j.adam["m"])
    assert weight_hash(j.params) == weight_hash(g.replicas[0].anchor)


def test_replica_state_and_the_one_snapshot_rule():
    g = Group(Config(**TINY, local_steps=4), 2, data.builtin_stream())
    for _ in range(2):
        g.step()
    r = g.replicas[1]
    assert r.step == 2 and r.anchor is not None
    snap = copy_replica(r)                        # what a joiner copies, what a rollback restores
    assert snap.anchor is not r.anchor and all((snap.anchor[k] == r.anchor[k]).all() for k in r.anchor)
    for _ in range(2):
        g.step()
    g.resize(3)                                   # a joiner at a round's start: the anchor, a fresh Adam state
    for _ in range(4):
        step, _, hashes = g.step()
    assert step == 8 and len(set(hashes)) == 1    # step 8 exchanged: every replica the same weights
    assert len({weight_hash(x.params) for x in g.replicas}) == 1


def test_config_wire_form_and_range():
    assert "local_steps" not in Config().to_dict()               # the default's bytes are unchanged
    assert Config(local_steps=8).to_dict()["local_steps"] == 8
    assert Config.from_dict(Config(local_steps=8).to_dict()) == Config(local_steps=8)
    with pytest.raises(ConfigError, match=r"local steps \(local_steps\) must be in 1..64, got 0"):
        Config(local_steps=0)


def test_save_only_at_the_end_and_audits_end_at_a_round(tmp_path):
    assert_refused(train_cli(*TINY_ARGS, "--local-steps", "4", "--stop-after", "8", "--save", str(tmp_path / "a.pt")),
                   "--save with --local-steps only at the run's end")
    assert_refused(train_cli(*TINY_ARGS, "--local-steps", "4", "--audit-rate", "1", "--stop-after", "9"),
                   "--stop-after with --local-steps 4 and audits ends at a round's exchange")
    from daisy.files.checkpoint import load_checkpoint
    lines = train_json(*TINY_ARGS, "--local-steps", "4", "--peers", "2", "--save", str(tmp_path / "b.pt"))
    ck = load_checkpoint(tmp_path / "b.pt")
    assert ck.config["local_steps"] == 4 and ck.adam_t == 100 and ck.weight_hash == lines[-1]["hashes"][0]


def test_python_and_node_print_the_same_run_of_local_steps():
    """Churn at round starts (fresh joiners, named slots leave, one leaving as one joins at 70),
    4 peers (the sharded reduce), a partial last round (100 = 14 rounds of 7, then 2)."""
    assert NODE, "node is required"
    args = [*TINY_ARGS, "--local-steps", "7", "--roster", "0:2,28:4,63:2:0.2,70:2:0,77:3", "--json"]
    run = lambda cmd: subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    py, js = run([sys.executable, "-m", "daisy.train", *args]), run([NODE, "frontend_js/cli.mjs", *args])
    py_out, js_out = py.communicate(timeout=300)[0], js.communicate(timeout=300)[0]
    assert py.returncode == 0 and js.returncode == 0, (py_out[-800:], js_out[-800:])
    assert len(py_out.splitlines()) == 100
    diff = first_diff(py_out, js_out)
    assert diff is None, f"python and node differ at {diff}"
