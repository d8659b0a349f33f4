"""Audited rounds of local steps, the Python reference and its Node twin (daisy/attack_rounds.py,
daisy/audit.py; frontend_js/attack_rounds.js, frontend_js/audit.js; docs/VERIFICATION.md §13
"Rounds of local steps"):

0. `python -m daisy.train --local-steps H --attack ...` and `node frontend_js/cli.mjs` with the
   same flags print the same lines, stdout and stderr, for every case below (--json, and text for
   one), and the same refusals;
1. an honest audited run of local steps prints the plain run's lines, byte for byte;
2. each attack kind (the delta forged, the Adam state forged, a round started from another state
   than the one committed to, a lying auditor, a lying owner, colluders, a forge then a departure,
   a forge then a Stop) removes exactly its attackers, and
   the kept timeline (the last line printed for each step) equals `python -m daisy.train
   --local-steps H --roster R` for the roster R it names (the slots that left named);
3. the pure rules: the Adam state's hash, the chain check, the round's end, the transcript's size;
4. random settings (seeded, printed): Python = Node, no honest peer removed, the kept run;
5. the refusals (a Stop mid-round, `moments` without local steps, a leave mid-round)."""
import json
import os
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from daisy import audit
from daisy.optim import adam_init
from tests.reference import first_diff
from tests.test_attacks import NODE, TINY, js, kept, py, roster_of, strip_flags

LOCAL = ["--local-steps", "4", "--stop-after", "60", *TINY]
CASES = {
    "scale": ["--peers", "4", "--audit-rate", "0.5", "--attack", "slot=1,from=30,kind=scale:-1000", *LOCAL],
    "nan": ["--peers", "3", "--attack", "slot=2,from=5,kind=nan", *LOCAL],
    "moments": ["--peers", "3", "--audit-rate", "0.5", "--attack", "slot=1,from=30,kind=moments", *LOCAL],
    "stale": ["--peers", "3", "--audit-rate", "0.5", "--attack", "slot=1,from=20,kind=stale", *LOCAL],
    "otherbatch": ["--peers", "2", "--audit-rate", "0.5", "--attack", "slot=1,from=20,kind=otherbatch", *LOCAL],
    "mismatch-f64": ["--peers", "3", "--exchange", "f64", "--audit-rate", "0.5", "--attack",
                     "slot=1,from=5,kind=mismatch", *LOCAL],
    "liar": ["--peers", "3", "--audit-rate", "0.5", "--attack", "slot=1,from=5,kind=liar-auditor", *LOCAL],
    "liar-owner": ["--peers", "4", "--attack", "slot=1,from=5,kind=liar-owner", *LOCAL],
    "collude-moments": ["--peers", "5", "--audit-rate", "0.5", "--attack", "slot=1+3,from=30,kind=moments", *LOCAL],
    "forge-then-leave": ["--peers", "3", "--attack", "slot=1,from=20,kind=scale:-1000,leave=24", *LOCAL],
    "forge-then-stop": ["--peers", "3", "--attack", "slot=1,from=56,kind=scale:-1000", *LOCAL],
    # a slot that starts a round from another state than it committed to: its transcript breaks the chain
    "unchained": ["--peers", "3", "--audit-rate", "0.5", "--attack", "slot=1,from=30,kind=unchained", *LOCAL],
    "unchained-then-stop": ["--peers", "3", "--attack", "slot=1,from=52,kind=unchained", *LOCAL],
}


TEXT_CASES = {"scale"}


@pytest.fixture(scope="module")
def both():
    """{(cli, name): its run}: python and node, every case in --json, TEXT_CASES as text too."""
    assert NODE, "node is required (install nodejs)"
    jobs = {}
    for name, args in CASES.items():
        jobs[("py", name)] = lambda a=args: py([*a, "--json"])
        jobs[("js", name)] = lambda a=args: js([*a, "--json"])
    for name in TEXT_CASES:
        jobs[("py-text", name)] = lambda a=CASES[name]: py(a)
        jobs[("js-text", name)] = lambda a=CASES[name]: js(a)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {k: pool.submit(f) for k, f in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


@pytest.fixture(scope="module")
def results(both):
    return {name: both[("py", name)] for name in CASES}


@pytest.fixture(scope="module")
def references(results):
    """{name: `python -m daisy.train --roster R` of the roster R its run names}, two at a time."""
    jobs = {name: lambda a=CASES[name], r=results[name]: py(["--roster", roster_of(r.stderr), *strip_flags(a), "--json"])
            for name in CASES if results[name].returncode == 0}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {k: pool.submit(f) for k, f in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_python_and_node_print_the_same_audited_rounds(both, name):
    p, j = both[("py", name)], both[("js", name)]
    assert p.returncode == 0, p.stderr
    assert j.returncode == 0, j.stderr
    diff = first_diff(p.stdout + p.stderr, j.stdout + j.stderr)
    assert diff is None, f"{name}: python and node differ at {diff}"
    if name in TEXT_CASES:
        pt, jt = both[("py-text", name)], both[("js-text", name)]
        assert "audit: round of peer 1 did not reproduce at step " in pt.stdout, pt.stdout
        diff = first_diff(pt.stdout + pt.stderr, jt.stdout + jt.stderr)
        assert diff is None, f"{name} (text): python and node differ at {diff}"


def test_an_honest_audited_run_of_local_steps_is_the_plain_run():
    a = py(["--peers", "4", "--audit-rate", "0.5", "--local-steps", "4", "--stop-after", "24", *TINY, "--json"])
    b = py(["--peers", "4", "--local-steps", "4", "--stop-after", "24", *TINY, "--json"])
    j = js(["--peers", "4", "--audit-rate", "0.5", "--local-steps", "4", "--stop-after", "24", *TINY, "--json"])
    assert a.returncode == 0 and b.returncode == 0 and j.returncode == 0, (a.stderr, b.stderr, j.stderr)
    assert a.stdout == b.stdout == j.stdout and a.stderr == j.stderr and len(a.stdout.splitlines()) == 24
    # 6 rounds of 4 slots at rate 0.5: the audits drawn, none failed
    assert a.stderr.strip().endswith("13 audits, 0 steps recomputed; the run's roster: 0:4"), a.stderr


@pytest.mark.parametrize("name", list(CASES))
def test_each_attack_on_rounds_removes_its_attackers_and_keeps_the_reference(results, references, name):
    p = results[name]
    assert p.returncode == 0, p.stderr
    args = CASES[name]
    attackers = args[args.index("--attack") + 1].split(",")[0][5:].split("+")
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    events = [d for d in lines if "event" in d]
    assert sorted(str(e["peer"]) for e in events) == sorted(attackers), events
    for d in lines:
        assert "event" in d or len(set(d["hashes"])) == 1, f"{name}: replicas differ at step {d['step']}"
    assert all(e["rollback_to"] % 4 == 0 for e in events), events          # a round's start
    roster, ref = roster_of(p.stderr), references[name]
    assert ref.returncode == 0, ref.stderr
    got, want = kept(p.stdout), ref.stdout.splitlines()
    assert len(got) == 60
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{name}: the kept run and daisy.train --roster {roster} differ at step {i + 1}:\n{g}\n{w}"


def test_the_cases_reach_what_they_name(results):
    """Each case shows its mechanism: a rollback that names a slot, a cheap check, the moments
    caught, the end's and the departure's barriers, a false accusation, a lying owner."""
    why = {name: [json.loads(line) for line in r.stdout.splitlines() if '"event"' in line] for name, r in results.items()}
    assert roster_of(results["scale"].stderr) == "0:4,12:3:1"
    assert "is 92800 bytes where 11784 are due" in why["nan"][0]["why"]
    assert why["moments"][0]["rollback_to"] > 0 and "round of peer 1 did not reproduce" in why["moments"][0]["why"]
    assert roster_of(results["collude-moments"].stderr) == "0:5,24:3:1.3"
    assert "checked when it left" in why["forge-then-leave"][0]["why"]
    assert "checked at the run's end" in why["forge-then-stop"][0]["why"]
    assert "accused peer" in why["liar"][0]["why"]
    assert why["liar-owner"][0]["why"].startswith("reduced shard from peer 1 did not reproduce")
    broken = "its Adam state at the round's start is not the one it committed to"
    assert f"({broken}; audited by peer " in why["unchained"][0]["why"], why["unchained"]
    # the end's barrier recomputes forward from the committed state: the round after the switch does not reproduce
    assert why["unchained-then-stop"][0]["why"].endswith("did not reproduce at step 60: removed (checked at the run's end)"), why
    assert roster_of(results["unchained-then-stop"].stderr) == "0:3,48:2:1"


# -- the pure rules -----------------------------------------------------------------------------
def test_the_adam_state_hash_the_chain_and_the_round():
    params = {"a": np.zeros((2, 3)), "b": np.zeros(4)}
    fresh = adam_init(params)
    h = audit.adam_state_hash(fresh)
    assert audit.check_start_state(fresh, h) is None
    for change in ("m", "v", "t"):
        other = adam_init(params)
        if change == "t":
            other["t"] = 1
        else:
            other[change]["b"][3] = np.nextafter(0.0, 1.0)
        assert audit.adam_state_hash(other) != h, change
        assert audit.check_start_state(other, h) == "its Adam state at the round's start is not the one it committed to"
    # the same bytes for m and v swapped are another state
    swapped = adam_init(params)
    swapped["m"]["a"][0, 0], swapped["v"]["b"][0] = 1.0, 1.0
    crossed = adam_init(params)
    crossed["v"]["a"][0, 0], crossed["m"]["b"][0] = 1.0, 1.0
    assert audit.adam_state_hash(swapped) != audit.adam_state_hash(crossed)
    assert [audit.round_end(s, 4, 10) for s in range(10)] == [3, 3, 3, 3, 7, 7, 7, 7, 9, 9]
    assert audit.state_transcript_bytes(1000) == 16004
    d = audit.round_digest(7, 1, 2.5, [b"\x01" * 32], h)
    assert d == audit.slot_digest(7, 1, 2.5, [b"\x01" * 32, h]) != audit.round_digest(7, 1, 2.5, [b"\x01" * 32], bytes(32))


def test_refusals():
    for args, needle in (
            (["--local-steps", "4", "--stop-after", "61", "--attack", "slot=1,kind=nan"],
             "--stop-after with --local-steps 4 and audits ends at a round's exchange (a multiple of 4, or the run's steps), got 61"),
            (["--attack", "slot=1,kind=moments"],
             "--attack kind 'moments' forges a round's Adam state: only with --local-steps above 1"),
            (["--local-steps", "4", "--attack", "slot=1,from=5,kind=nan,leave=10"],
             "--attack leave 10: with --local-steps 4 a peer leaves at a round's start (a multiple of 4)")):
        for r in (py(args), js(args)):
            assert r.returncode == 2 and r.stderr.strip().endswith(f"error: {needle}"), r.stderr


@pytest.mark.parametrize("name", list(CASES))
def test_each_attack_on_rounds_caught_within_its_bound_in_rounds(results, name):
    """p per round is §13's p per step with "round" for "step": every forger removed within the
    rounds its p allows but once in 10^6 runs, counted from the first round it forged."""
    args, H = CASES[name], 4
    spec = dict(part.split("=", 1) for part in args[args.index("--attack") + 1].split(","))
    P, first = int(args[args.index("--peers") + 1]), int(spec["from"]) // H
    attackers = [int(a) for a in spec["slot"].split("+")]
    rate = float(args[args.index("--audit-rate") + 1]) if "--audit-rate" in args else audit.DEFAULT_AUDIT_RATE
    if spec["kind"] == "nan":
        p_each = 1.0
    elif len(attackers) == 1:
        p_each = audit.detection_probability(P, rate, liar=spec["kind"] == "liar-auditor")
    else:                                  # a colluder: audited, by an honest auditor
        p_each = rate * (P - len(attackers)) / (P - 1)
    cap = 1 if p_each == 1.0 else int(np.ceil(np.log(1e-6) / np.log(1 - p_each)))
    events = [json.loads(line) for line in results[name].stdout.splitlines() if '"event"' in line]
    rounds = {e["peer"]: (e["step"] - 1) // H - first + 1 for e in events}
    assert sorted(rounds) == sorted(attackers), events
    assert all(1 <= n <= cap for n in rounds.values()), f"{name}: rounds to detection {rounds}, bound {cap}"


def test_random_attacks_on_rounds_python_equals_node_and_the_kept_run():
    """3 random settings (H, P, codec, rate, kind, colluders, a leave): Python = Node byte for
    byte, no honest peer removed, and where every attacker was removed the kept run = the
    --roster reference. Seed: DAISY_FUZZ_SEED, else drawn (printed)."""
    seed = int(os.environ.get("DAISY_FUZZ_SEED") or random.randrange(2**31))
    print(f"random attacks on rounds: seed {seed}")
    rng = random.Random(seed)
    kinds = ["scale:-1000", "nan", "noise", "const", "stale", "otherbatch", "mismatch", "liar-auditor",
             "liar-owner", "moments", "unchained"]
    settings = []
    for _ in range(3):
        H, P, kind = rng.choice([2, 3, 4, 7]), rng.randint(2, 5), rng.choice(kinds)
        slots = sorted(rng.sample(range(P), rng.choice([1, 2]) if P >= 4 else 1))
        start, stop = rng.randint(0, 40), (48 // H) * H
        spec = f"slot={'+'.join(map(str, slots))},from={start},kind={kind}"
        if rng.random() < 0.3 and (start // H + 1) * H < stop:
            spec += f",leave={(start // H + 1) * H}"
        settings.append((slots, ["--peers", str(P), "--local-steps", str(H), "--stop-after", str(stop), "--audit-rate",
                                 rng.choice(["0.1", "0.5", "1"]), "--exchange", rng.choice(["int8", "f64"]),
                                 "--attack", spec, *TINY, "--json"]))
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [(pool.submit(py, a), pool.submit(js, a)) for _, a in settings]
        runs = [(p.result(), j.result()) for p, j in runs]
    for (slots, args), (p, j) in zip(settings, runs):
        assert p.returncode == 0, (seed, args, p.stderr)
        diff = first_diff(p.stdout + p.stderr, j.stdout + j.stderr)
        assert diff is None, f"seed {seed}, {' '.join(args)}: python and node differ at {diff}"
        removed = sorted(json.loads(line)["peer"] for line in p.stdout.splitlines() if '"removed"' in line)
        assert set(removed) <= set(slots), (seed, args, removed)
        if removed == slots:
            ref = py(["--roster", roster_of(p.stderr), *strip_flags(args)])
            assert ref.returncode == 0 and kept(p.stdout) == ref.stdout.splitlines(), (seed, args, ref.stderr[-300:])
