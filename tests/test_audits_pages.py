"""Audited gradients between real pages (issue 20; docs/VERIFICATION.md §13, frontend_js/run/
audits.js): three headless Chromium pages train one run over WebRTC while one of them misbehaves
through its test fault plan (window.__daisyTest, set before the page loads; unreachable in a
normal page load). Every page draws the reference run's nonces, so the audit pairs are those of
`python -m daisy.train --attack`: each honest page must end 'done' with the liar removed, say so
on its panel, and keep exactly the reference run of that attack, step by step (the last hash a
page recorded for a step: a conviction rolls the group back, 'step-undone', and the steps from
there are recomputed without the liar; the last JSON line the reference prints for a step is the
run's). tests/js/audit_mesh.test.mjs is the same over the in-memory transport. Then issue 27's
forger that withholds its AUDIT frames and leaves at once: a departure is a barrier. The last test
audits rounds of local steps (tests/js/audit_rounds.test.mjs over the in-memory transport).
"""
from __future__ import annotations

import json
import re

import pytest

from tests.app_server import offline_app, open_peer, state
from tests.reference import setting_args, train_cli
from tests.test_membership import final_hashes, record
from tests.test_mesh import TINY, ended, linked

pytestmark = pytest.mark.slow

RUN_MS = 150_000
STEPS = 100                                  # the shortest run a config allows
SETTINGS = {"steps": STEPS, **TINY}          # int8 exchange, the default on both sides


@pytest.fixture(scope="module")
def app_url():
    with offline_app("audits") as base:
        yield base


# ---- helpers --------------------------------------------------------------------------------

# every note the page ever showed (the panel keeps only its last few) and its 'convicted' events
RECORD_AUDITS = """() => { window.allNotes = []; window.convictions = []; window.moots = [];
    window.daisy.on('state', (s) => { for (const n of s.notes) if (!window.allNotes.includes(n)) window.allNotes.push(n); });
    window.daisy.on('convicted', (e) => window.convictions.push(e));
    window.daisy.on('conviction-moot', (e) => window.moots.push(e)); }"""


def fault_plan(faults: dict | None) -> str:
    """The init script of a page: the reference run's nonces, plus `faults` (forge, liarAuditor)."""
    return f"window.__daisyTest = {json.dumps({'referenceNonces': True, **(faults or {})})};"


# the page leaves (its pagehide: LEAVE, the server told, every link closed, as closing it does) in
# the 'step' event of its step k, before it computes anything of the next step: the reference's
# `leave=k`. Closing the page from here instead lands a few steps later, and a later step's audit
# may then convict it before the barrier does (a conviction at another step than the reference's)
LEAVE_AT = """(k) => window.daisy.on('step', (e) => { if (e.step === k) window.dispatchEvent(new Event('pagehide')); })"""


def open_audited_group(pages, url: str, faulty_slot: int, faults: dict, leaves_at: int | None = None) -> list:
    """Three pages opened one after another (slot order: the starter, then the others by time of
    joining the group; frontend_js/run/start.js), the one of `faulty_slot` with `faults` (and
    leaving once it completed step `leaves_at`, if given), all linked to each other; the run is
    started from the first -> [page of slot 0, 1, 2]."""
    group = [open_peer(pages, url, f"s{i}", init_script=fault_plan(faults if i == faulty_slot else None))
             for i in range(3)]
    for page in group:
        linked(page, [o for o in group if o is not page])
        record(page)
        page.evaluate(RECORD_AUDITS)
    if leaves_at is not None:
        group[faulty_slot].evaluate(LEAVE_AT, leaves_at)
    group[0].evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    roster = state(group[0])["run"]["roster"]
    assert roster == [state(p)["peerId"] for p in group], f"slots {roster}: not the order the pages joined in"
    return group


def reference_attack(attack: str) -> tuple[dict[int, str], list[dict]]:
    """`python -m daisy.train --peers 3 --attack ATTACK --json` with SETTINGS -> ({step: hash of
    the kept timeline (the last line printed for a step)}, [its removal events])."""
    return reference_run("--peers", "3", "--attack", attack)


def reference_run(*args: str) -> tuple[dict[int, str], list[dict]]:
    """`python -m daisy.train ARGS --json` with SETTINGS -> as reference_attack."""
    out = train_cli(*args, "--json", *setting_args(SETTINGS))
    assert out.returncode == 0, f"daisy.train {' '.join(args)} failed:\n{out.stderr}"
    hashes, events = {}, []
    for line in map(json.loads, out.stdout.splitlines()):
        if "event" in line:
            events.append(line)
            continue
        assert len(set(line["hashes"])) == 1, f"the reference's replicas disagree: {line}"
        hashes[line["step"]] = line["hashes"][0]
    assert sorted(hashes) == list(range(1, STEPS + 1)), sorted(hashes)
    return hashes, events


def assert_kept_timeline(label: str, page, want: dict[int, str]) -> None:
    """Every step 1..STEPS the page kept (its last hash of each) = the reference's, exactly."""
    got = final_hashes(page, label)
    for step in range(1, STEPS + 1):
        assert step in got, f"{label} kept no step {step} (kept {sorted(got)[:3]}..{sorted(got)[-3:]})"
        assert got[step] == want[step], \
            f"{label}: first mismatch at step {step}: page {got[step]}, reference {want[step]}"


def group_story(group) -> str:
    """What each page of the group did, for a failure: its end, its run's P schedule, the peers of
    the first steps it kept, its convictions and every note it showed."""
    lines = []
    for i, page in enumerate(group):
        s = state(page)
        run = s["run"] or {}
        peers = [(st, p) for st, _, p in page.evaluate("window.stepLog")][:12]
        lines.append(f"slot {i} ({s['peerId']}): {s['runState']} at {s['step']}, history {run.get('history')}, "
                     f"roster {run.get('roster')}; peers of its first kept steps {peers}; "
                     f"convictions {page.evaluate('window.convictions')}; notes {page.evaluate('window.allNotes')}")
    return "\n".join(lines)


def audited_run(pages, url: str, faulty_slot: int, faults: dict, attack: str):
    """The run with one misbehaving page, its reference -> (honest [(page, label, final state)],
    [(peer id, the name the panel gives it)] by slot, the reference's single removal event)."""
    want, events = reference_attack(attack)
    assert len(events) == 1 and events[0]["peer"] == faulty_slot, f"the reference removes slot {faulty_slot}: {events}"
    group = open_audited_group(pages, url, faulty_slot, faults)
    names = [state(p)["name"] for p in group]
    ids = [state(p)["peerId"] for p in group]
    honest = [(p, f"slot {i}") for i, p in enumerate(group) if i != faulty_slot]
    finals = []
    for page, label in honest:
        s = ended(page, f"{label} finished", RUN_MS)
        try:
            assert s["runState"] == "done" and s["step"] == STEPS, f"{label}: {s['runState']} at {s['step']}: {s['message']}"
            assert ids[faulty_slot] not in s["run"]["roster"], f"{label} still has the liar: {s['run']['roster']}"
            assert_kept_timeline(label, page, want)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{group_story(group)}") from None
        finals.append((page, label, s))
    assert len({s["hash"] for _, _, s in finals}) == 1, [s["hash"] for _, _, s in finals]
    return finals, [(i, f"{n} ({i})") for i, n in zip(ids, names)], events[0]      # peer.js nameOf


def assert_convicted(page, label: str, pattern: str, event: dict, peer_id: str) -> None:
    """The page's notes hold the removal in the words of `pattern` (group 1: the 1-based step),
    at the reference's step, and it emitted 'convicted' for that peer, rolled back where the
    reference rolled back."""
    notes = page.evaluate("window.allNotes")
    hits = [m for n in notes if (m := re.search(pattern, n))]
    assert hits, f"{label}: no note matches {pattern!r}: {notes}"
    # a verdict may come up to W steps late: a later failing audit may be heard first, and the
    # page then finds the earlier one itself (run/verdicts.js checkingEarlier); the settled
    # conviction is at the reference's step
    assert any(int(m.group(1)) == event["step"] for m in hits), f"{label}: {[m.group(0) for m in hits]}, the reference: {event['why']}"
    convicted = page.evaluate("window.convictions")
    assert [c["peer"] for c in convicted] == [peer_id], f"{label}: {convicted}"
    assert convicted[0]["step"] == event["step"], f"{label} convicted at step {convicted[0]['step']}, the reference at {event['step']}"
    assert convicted[0]["back"] == event["rollback_to"], \
        f"{label} rolled back to step {convicted[0]['back']}, the reference to {event['rollback_to']}"


# ---- the tests ------------------------------------------------------------------------------

def test_a_member_scaling_its_gradient_by_minus_1000_is_caught_removed_and_the_run_is_the_reference(app_url, pages):
    """Slot 1 sends -1000 x its gradient from step index 5, committed to honestly: an audit's
    recomputation does not reproduce it; both honest pages remove it, roll back and recompute,
    and finish the run `python -m daisy.train --attack "slot=1,from=5,kind=scale:-1000"` keeps."""
    finals, slots, event = audited_run(pages, app_url + "/", 1, {"forge": {"from": 5, "kind": "scale", "factor": -1000}},
                                       "slot=1,from=5,kind=scale:-1000")
    forger_id, forger = slots[1]
    for page, label, _ in finals:
        assert_convicted(page, label, rf"gradient from {re.escape(forger)} did not reproduce at step (\d+): removed \(",
                         event, forger_id)


def test_a_lying_auditor_is_removed_by_the_recomputation_of_its_accusation(app_url, pages):
    """Slot 2 accuses whomever it audits from step index 4: every honest page recomputes the
    accused gradient, which reproduces, and removes the accuser; the run is `python -m
    daisy.train --attack "slot=2,from=4,kind=liar-auditor"`."""
    finals, slots, event = audited_run(pages, app_url + "/", 2, {"liarAuditor": {"from": 4}},
                                       "slot=2,from=4,kind=liar-auditor")
    accused = int(re.search(r"accused peer (\d+)", event["why"]).group(1))
    liar_id, liar = slots[2]
    liar, victim = re.escape(liar), re.escape(slots[accused][1])
    for page, label, _ in finals:
        assert_convicted(page, label, rf"{liar} accused {victim} at step (\d+), whose gradient reproduced: {liar} removed",
                         event, liar_id)


def test_a_forger_that_withholds_its_audit_frames_and_leaves_is_checked_at_the_barrier(app_url, pages):
    """Issue 27 §1: slot 1 sends -1000 x its gradient at step index 9, withholds its AUDIT frames
    from there (no commitment, no reveal: its audits cannot be drawn) and leaves (its page's
    pagehide) right after step 10. A departure is a barrier: each honest page recomputes the
    leaver's steps since its last passed audit from its own kept states against the bytes it
    received. Where both survivors completed step 10, both convict it, roll back and finish the run
    `python -m daisy.train --attack "slot=1,from=9,kind=scale:-1000,leave=10"` keeps. A closing
    page's last frames may be lost: a survivor that never got the forged message of step 10 cannot
    complete that step, the roster resumes from step 9 (undoing step 10 where it was completed: the
    lie is moot) and both finish the plain run of slot 1 leaving at step index 9
    (`--roster 0:3,9:2:1`). Either way the forged step is kept nowhere and both survivors agree."""
    K = 9
    attack = f"slot=1,from={K},kind=scale:-1000,leave={K + 1}"
    convicted_run, events = reference_attack(attack)
    assert [(e["event"], e["peer"], e["step"]) for e in events] == [("removed", 1, K + 1)], events
    left_run, _ = reference_run("--roster", f"0:3,{K}:2:1")
    group = open_audited_group(pages, app_url + "/", 1, {"forge": {"from": K, "kind": "scale", "factor": -1000},
                                                          "withholdAudits": {"from": K}}, leaves_at=K + 1)
    ids = [state(p)["peerId"] for p in group]
    group[1].wait_for_function(f"window.daisy.state().step >= {K + 1}", timeout=RUN_MS)
    group[1].close()                                   # (it left at step K + 1 already)
    outcomes = []
    for page, label in ((group[0], "slot 0"), (group[2], "slot 2")):
        s = ended(page, f"{label} finished", RUN_MS)
        assert s["runState"] == "done" and s["step"] == STEPS, f"{label}: {s['runState']} at {s['step']}: {s['message']}"
        assert ids[1] not in s["run"]["roster"], f"{label} still has the leaver: {s['run']['roster']}"
        moot = {(m["peer"], m["step"]) for m in page.evaluate("window.moots")}
        standing = [c for c in page.evaluate("window.convictions") if (c["peer"], c["step"]) not in moot]
        if standing:
            assert_kept_timeline(label, page, convicted_run)
            assert [(c["peer"], c["step"], c["back"]) for c in standing] == [(ids[1], K + 1, events[0]["rollback_to"])], standing
            assert "checked when it left" in standing[0]["why"], standing
        else:
            assert moot <= {(ids[1], K + 1)}, moot
            assert_kept_timeline(label, page, left_run)
        outcomes.append(bool(standing))
    assert outcomes[0] == outcomes[1], f"the survivors judged otherwise (convicted: slot 0 {outcomes[0]}, slot 2 {outcomes[1]})"


def test_audited_rounds_of_local_steps_a_forger_is_removed_and_the_run_is_the_reference(app_url, pages):
    """Local steps (H 4) with audits of rounds (docs/VERIFICATION.md §13 "Rounds of local steps"),
    three pages over WebRTC (tests/js/audit_rounds.test.mjs is the same over the in-memory transport): slot 1 sends
    -1000 x its round's delta from step index 5, committed to honestly. An audit of its round (its
    auditor asks it for its Adam state at the round's start: ROUND_STATE over WebRTC) does not
    reproduce; both honest pages remove it, each restores its own state at the round start after
    its last pass, and they finish the run `python -m daisy.train --local-steps 4 --attack
    "slot=1,from=5,kind=scale:-1000" --audit-rate 0.3` keeps, step by step."""
    attack, rate = "slot=1,from=5,kind=scale:-1000", 0.3
    want, events = reference_run("--peers", "3", "--local-steps", "4", "--attack", attack, "--audit-rate", str(rate))
    assert len(events) == 1 and events[0]["peer"] == 1, f"the reference removes slot 1: {events}"
    group = [open_peer(pages, app_url + "/", f"r{i}", init_script=fault_plan(
        {"forge": {"from": 5, "kind": "scale", "factor": -1000}} if i == 1 else {})) for i in range(3)]
    for page in group:
        linked(page, [o for o in group if o is not page])
        record(page)
        page.evaluate(RECORD_AUDITS)
    group[0].evaluate("(cfg) => window.daisy.start(cfg)", {**SETTINGS, "local_steps": 4, "auditRate": rate})
    ids = [state(p)["peerId"] for p in group]
    assert state(group[0])["run"]["roster"] == ids, "slots: not the order the pages joined in"
    forger = f"{state(group[1])['name']} ({ids[1]})"                  # peer.js nameOf
    for i in (0, 2):
        page, label = group[i], f"slot {i}"
        s = ended(page, f"{label} finished", RUN_MS)
        try:
            assert s["runState"] == "done" and s["step"] == STEPS, f"{label}: {s['runState']} at {s['step']}: {s['message']}"
            assert ids[1] not in s["run"]["roster"], f"{label} still has the forger: {s['run']['roster']}"
            assert_kept_timeline(label, page, want)
            assert_convicted(page, label, rf"round of {re.escape(forger)} did not reproduce at step (\d+): removed \(", events[0], ids[1])
        except AssertionError as e:
            drops = "\n".join(f"slot {j} dropped {p.evaluate('window.daisy.mesh.drops()')['recent'][-12:]}" for j, p in enumerate(group))
            raise AssertionError(f"{e}\n{group_story(group)}\n{drops}") from None
