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
    window.daisy.on('step-undone', (e) => { window.stepLog = window.stepLog.filter(([s]) => s <= e.step); });
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

def test_a_bad_or_broken_state_transfer_is_caught_and_retried(app_url, pages):
    """The leader's next state is tampered in transit (the digest catches it), then the joiner's
    state goes wrong after its own checks (the leader catches its hash and re-syncs it); a second
    joiner's transfer is cut in the middle (it asks again). All end on the reference."""
    # the leader's next state transfer to a device whose last one stalled waits 1 s times 4, not
    # the page's 5 s times 4 (TIMING.resyncIntervalMs): the same rule, shorter waits
    a, b = open_group(pages, app_url + "/", 2, init_script="window.__daisyTest = {timing: {resyncIntervalMs: 1000}};")
    for p in (a, b):
        record(p)
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    wait_state(a, "s.running && s.step >= 5", "5 steps", RUN_MS)
    a.evaluate("window.daisy.testing.faultNextState('tamper')")
    c = open_peer(pages, app_url + "/", "c", init_script="window.__daisyTest = {corruptNextSync: true};")
    record(c)
    # the digest's drop line is noted while c waits: forwarded gradients that reach c between its
    # attempts are dropped too and can push it out of the page's last 50 drop lines
    c.wait_for_function("""() => {
        if (window.daisy.mesh.drops().recent.some((l) => l.includes('digest mismatch'))) window.sawDigestMismatch = true;
        const s = window.daisy.state();
        return s.running && s.runState === 'training';
    }""", timeout=90_000)
    seen = c.evaluate("window.runStates")
    assert any(x.startswith("syncing") for x in seen) and seen.index("training") > 0, seen
    entered = state(c)["run"]["history"][-1]
    assert entered[1] == 3 and entered[0] >= 5, state(c)["run"]["history"]
    notes = " ".join(state(a)["notes"])
    assert "re-syncing" in notes, state(a)["notes"]
    assert c.evaluate("window.sawDigestMismatch === true"), c.evaluate("window.daisy.mesh.drops()")
    a.evaluate("window.daisy.testing.faultNextState('cut')")
    # the leader may refuse d's cut sync (it confirmed none of it): d asks again after 3 s, not
    # the page's 30 s (TIMING.refusedWaitMs; the rest of this test waits on the page's timings)
    d = open_peer(pages, app_url + "/", "d", init_script="window.__daisyTest = {timing: {refusedWaitMs: 3000}};")
    record(d)
    wait_state(d, "s.running && s.runState === 'training'", "d synced in after the cut", 90_000)
    # it asked again: its own stall timer, or the leader dropped the sync it confirmed nothing of
    assert any("stalled" in n or "asking again" in n or "confirmed none" in n for n in state(d)["notes"]), state(d)["notes"]
    stop_group([(a, "a"), (b, "b"), (c, "c"), (d, "d")])
    # the joiner's first contributed step is the one the roster named; it computed every later one
    steps = sorted(final_hashes(c, "c"))
    assert steps[0] == entered[0] + 1, steps[:3]


# ---- leaving and crashing ---------------------------------------------------------------------

def test_the_leader_closes_its_page_then_a_member_crashes_the_group_goes_on(app_url, pages):
    """Only a browser shows these: a page's goodbye on `pagehide` and a crashed page's links
    ending. The next senior peer leads on; both departed steps are recomputed without them."""
    group = [open_peer(pages, app_url + "/", label) for label in "abcd"]
    for p in group:
        linked(p, [o for o in group if o is not p])
        record(p)
    a = group[0]
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    roster = state(a)["run"]["roster"]
    by_id = {state(p)["peerId"]: (p, label) for p, label in zip(group, "abcd")}
    wait_state(a, "s.running && s.step >= 10", "10 steps", RUN_MS)
    a.context.close()                                     # the leader's page closes: goodbye
    lead, _ = by_id[roster[1]]
    wait_state(lead, f"s.run && s.run.roster.length === 3 && s.run.leader === '{roster[1]}'", "the next senior peer leads", 30_000)
    wait_state(lead, "s.running && s.step >= 20", "20 steps", RUN_MS)
    crashed, _ = by_id[roster[3]]
    crashed.evaluate("window.daisy.testing.crash()")      # no goodbye: links and socket just end
    wait_state(lead, "s.run && s.run.roster.length === 2", "the crashed page removed", 30_000)
    rest = [by_id[i] for i in roster[1:3]]
    finals = stop_group(rest)
    hist = finals[0]["run"]["history"]
    # the crash came after the leader's step 20; a survivor may be one step behind (the group goes on from the lower)
    assert [p for _, p in hist] == [4, 3, 2] and hist[1][0] >= 9 and hist[2][0] >= 19, hist
    assert all(s["run"]["roster"] == roster[1:3] for s in finals), [s["run"]["roster"] for s in finals]


def test_a_frozen_peer_in_a_two_device_group_stops_it_without_a_split(app_url, pages):
    """Half the group unreachable and no word from the server that it left: the survivor must
    not go on alone (the frozen one might come back and go on too), so it stops and keeps the
    last agreed state."""
    # the server's word never comes (b's socket stays): a waits 2 s for it, not the page's 10 s
    # (TIMING.confirmWaitMs; the deadline that finds b gone is the page's own)
    a, b = open_group(pages, app_url + "/", 2, init_script="window.__daisyTest = {timing: {confirmWaitMs: 2000}};")
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


# ---- one lying member (docs/PROTOCOL.md "One lying member") -----------------------------------

# a JSON frame from this page to `to`, made with the page's own frame codec (a hostile page can
# send anything its links carry)
SEND_JSON_JS = """async ([to, type, obj, runId, slot]) => {
  const f = await window.daisy.mesh.frames();
  const chunks = await f.encodeMessage({ type: f.TYPES[type], slot, runId, step: 0, payload: f.jsonPayload(obj) },
                                       0x7fff0000 + Math.floor(Math.random() * 1e6), 64 * 1024);
  for (const c of chunks) await window.daisy.mesh.sendRaw(to, c);
}"""


def test_a_member_that_tells_each_side_the_other_is_gone_forks_nothing(app_url, pages):
    """The two-faced attempt: h tells the leader that b is gone and b that the leader is gone,
    while both are linked. No fork: either one run goes on (b still in it, equal hashes) or every
    honest page stops with the alarm naming the liar's claim."""
    a, b, h = open_group(pages, app_url + "/", 3)
    for p in (a, b):
        record(p)
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    wait_state(b, "s.running && s.step >= 5", "training", RUN_MS)
    ia, ib, sh = state(a)["peerId"], state(b)["peerId"], state(h)
    run = sh["run"]
    for to, gone in ((ia, ib), (ib, ia)):
        status = {"runId": run["id"], "epoch": run["epoch"], "completed": sh["step"], "hash": sh["hash"], "gone": [gone]}
        h.evaluate(SEND_JSON_JS, [to, "STATUS", status, run["id"], 2])
        h.evaluate(SEND_JSON_JS, [to, "HALT", {"runId": run["id"], "epoch": run["epoch"] + 1, "gone": [gone]}, run["id"], 2])
    at = state(a)["step"]
    wait_state(a, f"!s.running || s.step >= {at + 10}", "the run goes on or stops", RUN_MS)
    if state(a)["running"]:
        finals = stop_group([(a, "a"), (b, "b")])
        assert all(ib in s["run"]["roster"] for s in finals)
    else:
        finals = [ended(p, label) for p, label in ((a, "a"), (b, "b"))]
        for s in finals:
            assert s["runState"] == "stopped" and s["error"] in ("split alarm", "replica mismatch"), s["message"]
        assert any(sh["peerId"] in s["message"] for s in finals), [s["message"] for s in finals]
        # the liar's STATUS claims a position it read a moment before (one step behind, a claim an
        # honest member could make): a page that gives up on it stops there, one its own alarm ended
        # may be a step or two on (CI once: 6 and 8). No fork is what holds: every step either
        # page completed, and the state each ended on, is the reference's
        steps = [s["step"] for s in finals]
        assert abs(steps[0] - steps[1]) <= 2, finals
        want = reference_hashes(SETTINGS, max(steps), roster=schedule(finals[0]["run"]["history"]))
        for page, label, s in ((a, "a", finals[0]), (b, "b", finals[1])):
            assert_reference(label, final_hashes(page, label), want)
            assert s["hash"] == want[s["step"] - 1], f"{label} ended on {s['hash']} at step {s['step']}, the reference has {want[s['step'] - 1]}"
    for s in finals:
        assert [p for _, p in s["run"]["history"]] == [3], s["run"]["history"]


def test_a_forged_eviction_of_a_linked_peer_is_refused_and_named(app_url, pages):
    """h sends the leader a roster of itself alone, and b a roster without the leader: both
    refuse, say so on the panel, and the run goes on with all three."""
    a, b, h = open_group(pages, app_url + "/", 3)
    for p in (a, b, h):
        record(p)
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    wait_state(b, "s.running && s.step >= 5", "training", RUN_MS)
    ia, ib, sh = state(a)["peerId"], state(b)["peerId"], state(h)
    run, at = sh["run"], sh["step"]
    base = {"runId": run["id"], "epoch": run["epoch"] + 1, "base": run["epoch"], "from": at, "joined": [], "reason": "forged"}
    h.evaluate(SEND_JSON_JS, [ia, "ROSTER", {**base, "roster": [sh["peerId"]], "left": [ia, ib], "history": [[0, 1]]}, run["id"], 2])
    h.evaluate(SEND_JSON_JS, [ib, "ROSTER", {**base, "roster": [sh["peerId"], ib], "left": [ia], "history": [[0, 2]]}, run["id"], 2])
    name_h = sh["name"]
    wait_state(a, f"s.notes.some((n) => n.startsWith('Refused a new roster from {name_h}') && n.includes('drops this device'))", "a refuses, named")
    wait_state(b, f"s.notes.some((n) => n.startsWith('Refused a new roster from {name_h}'))", "b refuses, named")
    wait_state(a, f"s.running && s.step >= {at + 10}", "the run goes on", RUN_MS)
    finals = stop_group([(a, "a"), (b, "b"), (h, "h")])
    assert [p for _, p in finals[0]["run"]["history"]] == [3]
