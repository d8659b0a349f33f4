"""Membership between real pages (docs/ARCHITECTURE.md "Membership"): devices join a running
group, leave it, crash, lose the leader; the group never forks and loses no step. Every page's
hash at every step must equal `python -m daisy.train --roster SCHEDULE`, where SCHEDULE is the P
schedule the pages report (run.history: [[first 0-based step, P], ...]).
"""
from __future__ import annotations


import pytest

from tests.app_server import offline_app, open_peer, state, wait_state
from tests.reference import reference_hashes
from tests.test_mesh import TINY, ended, linked, open_group

pytestmark = pytest.mark.slow

RUN_MS = 150_000
SETTINGS = {"steps": 10000, **TINY}       # long enough never to end by itself: tests stop it


@pytest.fixture(scope="module")
def app_url():
    with offline_app("members") as base:
        yield base


# ---- helpers --------------------------------------------------------------------------------

RECORD = """() => { window.stepLog = []; window.runStates = [];
    window.daisy.on('step', (e) => window.stepLog.push([e.step, e.hash, e.peers]));
    window.daisy.on('state', (s) => { const last = window.runStates[window.runStates.length - 1];
        const now = s.runState + (s.runState === 'syncing' && s.sync ? ` ${s.sync.pct}` : '');
        if (last !== now) window.runStates.push(now); }); }"""


def record(page) -> None:
    page.evaluate(RECORD)


def final_hashes(page, label: str) -> dict[int, str]:
    """{step: hash} of the steps this page completed, the last computation of each (a step
    recomputed after a departure replaces the first one). Steps only go forward, except a
    one-step rewind right after a departure."""
    log = page.evaluate("window.stepLog")
    out: dict[int, str] = {}
    prev = None
    for step, h, _ in log:
        assert prev is None or step == prev + 1 or step in (prev, prev - 0) or step == prev, \
            f"{label}: step {step} after {prev} (a step skipped or repeated out of order)"
        out[step] = h
        prev = step
    return out


def schedule(history) -> str:
    return ",".join(f"{a}:{p}" for a, p in history)


def assert_reference(label: str, got: dict[int, str], want: list[str]) -> None:
    """got {step: hash} must equal the reference at every step it holds."""
    assert got, f"{label}: no steps"
    for step in sorted(got):
        assert got[step] == want[step - 1], \
            f"{label}: first mismatch at step {step}: page {got[step]}, reference {want[step - 1]}"


def stop_group(pages_labels, settings=SETTINGS, after: int = 5) -> list[dict]:
    """Train `after` more steps, stop the group from its first page; every page must end
    'stopped' at one step, on one history and one hash, and every step it completed must equal
    the reference run of that history."""
    first = pages_labels[0][0]
    at = state(first)["step"]
    wait_state(first, f"s.running && s.step >= {at + after}", f"{after} more steps", RUN_MS)
    first.evaluate("window.daisy.stop()")
    finals = [ended(p, f"{label} stopped", RUN_MS) for p, label in pages_labels]
    for s, (_, label) in zip(finals, pages_labels):
        assert s["runState"] == "stopped", f"{label}: {s['runState']} at {s['step']}: {s['message']}"
    assert len({s["step"] for s in finals}) == 1, [s["step"] for s in finals]
    histories = {schedule(s["run"]["history"]) for s in finals}
    assert len(histories) == 1, f"pages disagree on the schedule: {histories}"
    assert len({s["hash"] for s in finals}) == 1, [s["hash"] for s in finals]
    want = reference_hashes(settings, finals[0]["step"], roster=histories.pop())
    for page, label in pages_labels:
        assert_reference(label, final_hashes(page, label), want)
    return finals


# ---- joining --------------------------------------------------------------------------------

def test_a_device_that_opens_mid_run_is_synced_in_and_trains_the_reference(app_url, pages):
    a, b = open_group(pages, app_url + "/", 2)
    for p in (a, b):
        record(p)
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    wait_state(a, "s.running && s.step >= 10", "10 steps", RUN_MS)
    c = open_peer(pages, app_url + "/", "c")
    record(c)
    wait_state(c, "s.running && s.runState === 'training'", "c synced in", 60_000)
    sc = state(c)
    entered = sc["run"]["history"][-1]
    assert entered[1] == 3 and entered[0] >= 10, sc["run"]["history"]
    finals = stop_group([(a, "a"), (b, "b"), (c, "c")])
    assert finals[0]["run"]["history"] == [[0, 2], entered], finals[0]["run"]["history"]
    seen = c.evaluate("window.runStates")
    assert any(x.startswith("syncing") for x in seen) and seen.index("training") > 0, seen
    # the joiner's first contributed step is the one the roster named; it computed every later one
    steps = sorted(final_hashes(c, "c"))
    assert steps[0] == entered[0] + 1 and steps[-1] == finals[0]["step"], steps[:3]


def test_a_bad_or_broken_state_transfer_is_caught_and_retried(app_url, pages):
    """The leader's next state is tampered in transit (the digest catches it), then the joiner's
    state goes wrong after its own checks (the leader catches its hash and re-syncs it); a second
    joiner's transfer is cut in the middle (it asks again). All end on the reference."""
    a, b = open_group(pages, app_url + "/", 2)
    for p in (a, b):
        record(p)
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    wait_state(a, "s.running && s.step >= 5", "5 steps", RUN_MS)
    a.evaluate("window.daisy.testing.faultNextState('tamper')")
    c = open_peer(pages, app_url + "/", "c", init_script="window.__daisyTest = {corruptNextSync: true};")
    record(c)
    wait_state(c, "s.running && s.runState === 'training'", "c synced in after the retries", 90_000)
    notes = " ".join(state(a)["notes"])
    assert "re-syncing" in notes, state(a)["notes"]
    drops = c.evaluate("window.daisy.mesh.drops()")
    assert any("digest mismatch" in line for line in drops["recent"]), drops
    a.evaluate("window.daisy.testing.faultNextState('cut')")
    d = open_peer(pages, app_url + "/", "d")
    record(d)
    wait_state(d, "s.running && s.runState === 'training'", "d synced in after the cut", 90_000)
    assert any("stalled" in n or "asking again" in n for n in state(d)["notes"]), state(d)["notes"]
    stop_group([(a, "a"), (b, "b"), (c, "c"), (d, "d")])


# ---- leaving and crashing ---------------------------------------------------------------------

def test_a_closed_page_and_a_crashed_page_are_recomputed_without(app_url, pages):
    a, b = open_peer(pages, app_url + "/", "a"), open_peer(pages, app_url + "/", "b")
    c = open_peer(pages, app_url + "/", "c")
    d = open_peer(pages, app_url + "/", "d")
    group = [a, b, c, d]
    for p in group:
        linked(p, [o for o in group if o is not p])
        record(p)
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    assert state(a)["run"]["topology"] in ("rsag", "allgather")
    wait_state(a, "s.running && s.step >= 15", "15 steps", RUN_MS)
    d.context.close()                                     # goodbye
    wait_state(a, "s.run && s.run.roster.length === 3", "d removed", 20_000)
    wait_state(a, "s.running && s.step >= 25", "25 steps", RUN_MS)
    c.evaluate("window.daisy.testing.crash()")            # no goodbye: links and socket just end
    wait_state(a, "s.run && s.run.roster.length === 2", "c removed", 30_000)
    finals = stop_group([(a, "a"), (b, "b")])
    hist = finals[0]["run"]["history"]
    assert [p for _, p in hist] == [4, 3, 2] and hist[1][0] >= 15 and hist[2][0] >= 25, hist


def test_the_leader_leaves_and_the_next_senior_peer_leads_on(app_url, pages):
    group = open_group(pages, app_url + "/", 3)
    for p in group:
        record(p)
    a, b, c = group
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    roster = state(a)["run"]["roster"]
    wait_state(a, "s.running && s.step >= 10", "10 steps", RUN_MS)
    by_id = {state(p)["peerId"]: (p, label) for p, label in zip(group, "abc")}
    a.context.close()                                     # the leader's page closes
    rest = [by_id[i] for i in roster[1:]]
    new_leader = roster[1]
    for p, _ in rest:
        wait_state(p, f"s.run && s.run.leader === '{new_leader}'", "the next senior peer leads", 30_000)
    finals = stop_group(rest)
    assert all(s["run"]["roster"] == roster[1:] for s in finals), [s["run"]["roster"] for s in finals]


def test_a_frozen_peer_in_a_two_device_group_stops_it_without_a_split(app_url, pages):
    """Half the group unreachable and no word from the server that it left: the survivor must
    not go on alone (the frozen one might come back and go on too), so it stops and keeps the
    last agreed state."""
    a, b = open_group(pages, app_url + "/", 2)
    settings = {"steps": 1000, **TINY}
    record(a)
    a.evaluate("(cfg) => window.daisy.start(cfg)", settings)
    wait_state(a, "s.running && s.step >= 5", "training")
    b.evaluate("setTimeout(() => { for (;;) {} }, 0)")      # no goodbye, no frames, socket stays
    sa = ended(a, "a stopped", 40_000)
    assert sa["runState"] == "stopped" and "split" in sa["message"], sa["message"]
    want = reference_hashes(settings, sa["step"], peers=2)
    assert sa["hash"] == want[-1], f"kept state at step {sa['step']}: {sa['hash']} vs reference {want[-1]}"
    b.context.close()
