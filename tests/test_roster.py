"""`python -m daisy.train --roster`: a run whose peer count changes between steps.

Golden-value rule: the expected lines are not produced by the roster code. They come from the
chain of plain runs that save and resume where P changes (`--peers 2 --stop-after 3 --save
a.pt`, `--resume a.pt --peers 3 ... --save b.pt`, ...): a checkpoint holds one replica, so the
chain builds every new replica from the file, not from `Group.resize`'s copy of replica 0
(docs/VERIFICATION.md, "Roster schedule").
"""
import pytest

from tests.reference import assert_refused, reference_hashes, setting_args, train_cli, train_json

TINY = {"width": 16, "seq_len": 16, "batch": 2, "layers": 1, "heads": 4, "steps": 100}
TINY_ARGS = setting_args(TINY)


def chain_of_plain_runs(tmp_path, segments, start_args) -> list[dict]:
    """segments: [(steps, P), ...] run one after the other, each a plain `--peers P` run resumed
    from the previous one's checkpoint; start_args begins the first (settings or --resume)."""
    lines, args = [], list(start_args)
    for i, (n, peers) in enumerate(segments):
        saved = tmp_path / f"chain{i}.pt"
        lines += train_json(*args, "--peers", str(peers), "--stop-after", str(n), "--save", str(saved))
        args = ["--resume", str(saved)]
    return lines


def assert_same_lines(got: list[dict], want: list[dict], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} lines, the chain has {len(want)}"
    for g, w in zip(got, want):
        assert g == w, f"{what}: first mismatch at step {w['step']}:\n  --roster: {g}\n  chain:    {w}"


@pytest.mark.parametrize("roster,segments", [
    ("0:2,3:3", [(3, 2), (3, 3)]),                          # a peer joins
    ("0:3,3:1", [(3, 3), (2, 1)]),                          # two leave
    ("0:2,2:4,4:1,5:3", [(2, 2), (2, 4), (1, 1), (2, 3)]),  # both; 4 peers take the sharded reduce
], ids=["grow", "shrink", "both"])
def test_roster_run_equals_chain_of_plain_runs(tmp_path, roster, segments):
    steps = sum(n for n, _ in segments)
    got = train_json(*TINY_ARGS, "--roster", roster, "--stop-after", str(steps))
    assert [len(line["hashes"]) for line in got] == [p for n, p in segments for _ in range(n)]
    assert_same_lines(got, chain_of_plain_runs(tmp_path, segments, TINY_ARGS), roster)


def test_roster_with_resume_uses_absolute_steps(tmp_path):
    base = tmp_path / "base.pt"
    train_json(*TINY_ARGS, "--peers", "2", "--stop-after", "3", "--save", str(base))
    # resumes at step index 3: steps 3, 4 on 2 peers (entry 0:2), 5, 6 on 3, 7, 8 on 2
    roster = "0:2,5:3,7:2"
    got = train_json("--resume", str(base), "--roster", roster, "--stop-after", "6")
    assert [line["step"] for line in got] == [4, 5, 6, 7, 8, 9]
    want = chain_of_plain_runs(tmp_path, [(2, 2), (2, 3), (2, 2)], ["--resume", str(base)])
    assert_same_lines(got, want, f"--resume with {roster}")
    # tests/reference.py, the browser tests' helper, gives the same hashes
    assert reference_hashes({}, 6, roster=roster, resume=str(base)) == [w["hashes"][0] for w in want]


def test_reference_helper_with_roster_equals_json_lines():
    got = reference_hashes(TINY, 4, roster="0:1,2:2")
    want = train_json(*TINY_ARGS, "--roster", "0:1,2:2", "--stop-after", "4")
    assert got == [line["hashes"][0] for line in want]
    assert [len(line["hashes"]) for line in want] == [1, 1, 2, 2]


def test_text_line_says_the_peer_count():
    r = train_cli(*TINY_ARGS, "--roster", "0:1,1:3", "--stop-after", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and "(1 peers agree)" in lines[0] and "(3 peers agree)" in lines[1], lines


@pytest.mark.parametrize("args,needle", [
    (["--roster", ""], "--roster entry '' is not STEP:PEERS"),
    (["--roster", "0:2,x:3"], "--roster entry 'x:3' is not STEP:PEERS"),
    (["--roster", "0:2,5"], "--roster entry '5' is not STEP:PEERS"),
    (["--roster", "0:2 ,5:3"], "--roster entry '0:2 ' is not STEP:PEERS"),
    (["--roster", "0:1234567890"], "--roster entry '0:1234567890' is not STEP:PEERS"),
    (["--roster", "0:0"], "--roster entry '0:0': peers must be in 1..64"),
    (["--roster", "0:2,4:65"], "--roster entry '4:65': peers must be in 1..64"),
    (["--roster", "0:2,5:3,5:2"], "--roster entry '5:2': steps must be strictly increasing (it follows '5:3')"),
    (["--roster", "0:2,5:3,4:2"], "--roster entry '4:2': steps must be strictly increasing (it follows '5:3')"),
    (["--roster", "1:2"], "--roster entry '1:2': the first entry must be at or before step 0, where this run starts"),
    (["--roster", "0:2,100:3", "--steps", "100"], "--roster entry '100:3' is past the run's last step index 99"),
    (["--roster", "0:2", "--peers", "2"], "give --roster or --peers, not both"),
], ids=["empty", "not-a-number", "no-colon", "space", "too-long", "zero-peers", "too-many-peers",
        "repeated-step", "decreasing-step", "late-start", "past-end", "with-peers"])
def test_bad_schedules_are_refused_by_name(args, needle):
    assert_refused(train_cli(*args), needle)


@pytest.mark.parametrize("roster,needle", [
    ("4:2", "--roster entry '4:2': the first entry must be at or before step 3, where this run starts"),
    ("0:2,100:3", "--roster entry '100:3' is past the run's last step index 99"),
], ids=["late-start", "past-end"])
def test_bad_schedules_with_resume_are_refused_by_name(tmp_path, roster, needle):
    base = tmp_path / "base.pt"
    train_json(*TINY_ARGS, "--peers", "1", "--stop-after", "3", "--save", str(base))
    assert_refused(train_cli("--resume", str(base), "--roster", roster), needle)
