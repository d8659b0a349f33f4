"""The headless peer (`node frontend_js/headless.mjs`, docs/ARCHITECTURE.md "Two hosts of one
peer") with real pages: `python app.py` on 127.0.0.1, headless Chromium pages and the Node peer
(@roamhq/wrtc) linked over WebRTC on loopback. Its steps are the page's steps: every hash equals
the page's and `python -m daisy.train` (tests/reference.py) at every step.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.app_server import offline_app, open_peer, state, wait_state
from tests.headless_peer import headless_peer
from tests.reference import reference_hashes
from tests.signal_client import SignalClient
from tests.test_membership import assert_reference, final_hashes, record, schedule
from tests.test_mesh import TINY, ended

pytestmark = pytest.mark.slow

RUN_MS = 150_000
RUN_S = RUN_MS / 1000
LONG = {"steps": 10000, **TINY}          # long enough never to end by itself: tests stop it


@pytest.fixture(scope="module")
def app_url():
    with offline_app("headless") as base:
        yield base


def linked_both(page, h) -> None:
    hid, pid = h.peer_id, state(page)["peerId"]
    wait_state(page, f"s.links['{hid}'] === 'linked'", "the page linked to the headless peer", 30_000)
    h.wait(lambda e: e["event"] == "link" and e["peer"] == pid and e["state"] == "linked", "linked to the page")


def run_ended(h, n: int = 1) -> dict:
    """The headless peer's n-th run-ended event."""
    h.wait(lambda e: e["event"] == "run-ended" and len(h.all("run-ended")) >= n, f"run {n} ended", RUN_S)
    return h.all("run-ended")[n - 1]


def steps_since(h, run_n: int) -> dict[int, str]:
    """{step: hash} of the headless peer's run number run_n (1-based) alone."""
    out, k = {}, 0
    for e in list(h.events):
        if e["event"] == "run-started":
            k += 1
        elif e["event"] == "step" and k == run_n:
            out[e["step"]] = e["hash"]
    return out


def departure(h, history, page) -> str:
    """What each side did around the headless peer's join and departure (a failure's evidence)."""
    keep = ("run-started", "roster-changed", "step-undone", "exit")
    evs = [e for e in h.events if e["event"] in keep or e["event"] == "step"]
    steps = [e for e in evs if e["event"] == "step"]
    tail = [{k: v for k, v in e.items() if k in ("event", "step", "peers", "from", "roster", "epoch", "why")}
            for e in evs if e["event"] in keep or e is steps[0] or e in steps[-3:]]
    log = page.evaluate("window.stepLog")
    return f"page history {history}; headless: {tail}; page steps (step, peers) {[(st, p) for st, _, p in log][-12:]}"


def test_a_page_and_the_headless_peer_train_the_reference_each_leading_once_and_the_keeper_restores_a_fresh_page(
        app_url, pages, tmp_path):
    """Run 1: the page leads a 100-step run to its end, done on both. Run 2: the headless peer
    (--keep) leads (stdin `start`) and stops it (`stop`) after 30 steps. Then the last page closes
    and a fresh page gets the stopped run from the keeper. Every step of both = the reference."""
    settings = {"steps": 100, **TINY}
    want = reference_hashes(settings, 100, peers=2)
    with headless_peer(app_url, tmp_path, "--keep", label="keeper") as h:
        page = open_peer(pages, app_url + "/", "page")
        linked_both(page, h)
        record(page)
        page.evaluate("(cfg) => window.daisy.start(cfg)", settings)              # the page leads
        s = ended(page, "run 1 ended", RUN_MS)
        e = run_ended(h, 1)
        assert s["runState"] == e["state"] == "done" and s["step"] == e["step"] == 100, (s["message"], e)
        assert s["run"]["leader"] == s["peerId"] and s["run"]["roster"] == [s["peerId"], h.peer_id], s["run"]
        assert_reference("page leading", final_hashes(page, "page"), want)
        assert_reference("headless member", steps_since(h, 1), want)
        assert sorted(steps_since(h, 1)) == list(range(1, 101))
        record(page)
        h.send("start " + ",".join(f"{k}={v}" for k, v in LONG.items()))          # the headless peer leads
        started = h.wait(lambda x: x["event"] == "run-started" and len(h.all("run-started")) == 2, "run 2 started")
        assert started["leader"] == h.peer_id, started
        h.wait(lambda x: len(steps_since(h, 2)) >= 30, "30 steps of run 2", RUN_S)
        h.send("stop")                                                           # ... and stops it
        e = run_ended(h, 2)
        s = ended(page, "run 2 ended", RUN_MS)
        assert s["runState"] == e["state"] == "stopped" and e["error"] == "" and s["step"] == e["step"], (s["message"], e)
        assert s["run"]["roster"] == [h.peer_id, s["peerId"]], s["run"]
        want = reference_hashes(LONG, e["step"], peers=2)
        assert_reference("headless leading", steps_since(h, 2), want)
        assert_reference("page member", final_hashes(page, "page"), want)
        page.close()                                       # the last page goes: the keeper holds the run
        fresh = open_peer(pages, app_url + "/", "fresh")
        wait_state(fresh, f"s.resumable && s.resumable.step === {e['step']}", "the fresh page holds the keeper's run", 30_000)
        assert state(fresh)["hash"] == e["hash"] == want[-1], (state(fresh)["hash"], e["hash"])


def test_the_headless_peer_joins_mid_run_and_leaves_with_sigterm(app_url, pages, tmp_path):
    page = open_peer(pages, app_url + "/", "page")
    record(page)
    page.evaluate("(cfg) => window.daisy.start(cfg)", LONG)
    wait_state(page, "s.running && s.step >= 5", "5 steps alone", RUN_MS)
    with headless_peer(app_url, tmp_path) as h:
        joined = h.wait(lambda e: e["event"] == "run-started", "the headless peer joined the run", RUN_S)
        first = h.wait(lambda e: e["event"] == "step", "its first step", RUN_S)["step"]
        h.wait(lambda e: e["event"] == "step" and e["step"] >= first + 5, "5 steps together", RUN_S)
        assert h.terminate() == 0, h.log()
        assert h.all("exit")[-1]["why"] == "SIGTERM"
    wait_state(page, "s.run && s.run.roster.length === 1", "the page alone again", 30_000)
    at = state(page)["step"]
    wait_state(page, f"s.step >= {at + 5}", "5 more steps alone", RUN_MS)
    page.evaluate("window.daisy.stop()")
    s = ended(page, "the page stopped", RUN_MS)
    assert s["runState"] == "stopped" and s["error"] == "", s["message"]
    history = s["run"]["history"]
    assert [p for _, p in history] == [1, 2, 1], history              # alone, with the headless peer, alone
    assert joined["roster"][0] == s["peerId"], joined
    want = reference_hashes(LONG, s["step"], roster=schedule(history))
    assert_reference("page", final_hashes(page, "page"), want)
    # The page went on alone after `left` steps (the step it had completed when the headless
    # peer's LEAVE or closed link reached it). The headless peer may have completed one step more
    # with both gradients: its LEAVE (on the least-queued lane) can overtake its last gradient
    # chunks, which closing the links then discards, so the page never completed that step with
    # it and computes it alone. That step is no step of the group's, and equals the reference of
    # the roster it was computed under: the two-device schedule going on.
    left = history[-1][0]
    evidence = departure(h, history, page)
    print(evidence)
    mine = h.steps()
    past = {st: x for st, x in mine.items() if st > left}
    assert set(past) <= {left + 1}, f"headless: steps past the page's {left} other than the one in flight: {sorted(past)}; {evidence}"
    assert_reference("headless", {st: x for st, x in mine.items() if st <= left}, want)
    if past:
        with_it = reference_hashes(LONG, left + 1, roster=schedule(history[:-1]))
        assert_reference(f"headless, its step in flight past the page's {left}", past, with_it)


def test_the_headless_peer_hosts_a_room_approves_a_page_and_comes_back_as_the_same_seat(app_url, pages, tmp_path):
    room = f"headless-{secrets.token_hex(4)}"
    with headless_peer(app_url, tmp_path, "--room", room, "--approve", "all", label="host") as h:
        welcome = h.wait(lambda e: e["event"] == "welcome", "welcome")
        assert welcome["role"] == "host", welcome
        page = open_peer(pages, f"{app_url}/?room={room}", "guest")
        pid = state(page)["peerId"]
        req = h.wait(lambda e: e["event"] == "request", "the page's join request")
        assert req["peer"] == pid and req["verdict"] == "approve", req
        wait_state(page, "s.role === 'member'", "the page approved")
        linked_both(page, h)
        assert h.terminate() == 0
    wait_state(page, f"!s.peers.some((p) => p.id === '{welcome['peerId']}')", "the host's goodbye")
    # restarted with its saved identity: the same peer id, asking the room's new host (the page)
    with headless_peer(app_url, tmp_path, "--room", room, label="host") as h2:
        again = h2.wait(lambda e: e["event"] == "welcome", "welcome again")
        assert again["peerId"] == welcome["peerId"], (again, welcome)
        wait_state(page, f"s.requests.some((r) => r.id === '{welcome['peerId']}')", "the page sees the same seat ask")


def test_without_a_policy_the_headless_host_asks_each_join_request_on_stdin(app_url, tmp_path):
    """Two devices ask to join its room (signaling clients: no page needed): `y` admits the
    first, `n` declines the second (the server closes its socket, 4403)."""
    room = f"ask-{secrets.token_hex(4)}"
    ws_base = app_url.replace("http", "ws", 1)

    async def until(client, kind: str) -> dict:
        while (msg := await client.next(10)).get("type") != kind:
            pass
        return msg

    async def ask(h) -> None:
        yes = await SignalClient.open(ws_base, room=room, name="yes")
        no = await SignalClient.open(ws_base, room=room, name="no")
        try:
            assert yes.welcome["role"] == no.welcome["role"] == "pending"
            for client, answer in ((yes, "y"), (no, "n")):
                await asyncio.to_thread(h.wait, lambda e, c=client: e["event"] == "request" and e["peer"] == c.id, "the request")
                assert [e["verdict"] for e in h.all("request") if e["peer"] == client.id] == ["ask"]
                h.send(answer)
            assert (await until(yes, "approved"))["role"] == "member"
            code, _ = await no.wait_closed(10)
            assert code == 4403, code
        finally:
            await yes.close()
            await no.close()

    with headless_peer(app_url, tmp_path, "--room", room, label="asker") as h:
        assert h.wait(lambda e: e["event"] == "welcome", "welcome")["role"] == "host"
        # in a thread of its own: Playwright's sync API keeps an event loop running on this one
        with ThreadPoolExecutor(1) as pool:
            pool.submit(lambda: asyncio.run(asyncio.wait_for(ask(h), 60))).result()


def test_a_large_run_stopped_mid_exchange_ends_cleanly_on_both(app_url, pages, tmp_path):
    """The largest model (width 128, 8 layers: a 12.8 MB float64 gradient, ~1600 frames) with the
    smallest batch and sequence, so a step is mostly its exchange and a Stop lands mid-exchange;
    the other side's gradient still arriving must not close the link or raise an alarm. Where a
    Stop lands is the machine's timing: the run is continued and stopped again (up to 4 times)
    until frames of the ended run did arrive after it ended, and every stop must be clean. Audits
    off: an audited run's Stop waits at the end's barrier (docs/PROTOCOL.md "Audited gradients")
    while those frames arrive, so nothing of it comes after the end."""
    big = {"width": 128, "layers": 8, "heads": 4, "seq_len": 16, "batch": 2, "steps": 10000, "auditRate": 0}
    with headless_peer(app_url, tmp_path, "--keep") as h:
        page = open_peer(pages, app_url + "/", "page")
        linked_both(page, h)
        hid, pid = h.peer_id, state(page)["peerId"]
        stale = 0
        for attempt in range(1, 5):
            at = state(page)["step"]
            page.evaluate("(cfg) => window.daisy.start(cfg)", big if attempt == 1 else {"resume": True, "auditRate": 0})
            wait_state(page, f"s.running && s.step >= {at + 2}", "2 steps", RUN_MS)
            page.evaluate("window.daisy.stop()")
            s = ended(page, "the page stopped", RUN_MS)
            e = run_ended(h, attempt)
            assert s["runState"] == e["state"] == "stopped", (attempt, s["message"], e)
            assert s["error"] == e["error"] == "", (attempt, s["message"], e["message"])
            assert s["step"] == e["step"] and s["hash"] == e["hash"], (attempt, s["step"], e["step"])
            time.sleep(3)                                  # what was on its way has arrived
            links = state(page)["links"]
            assert links[hid] == "linked", (links, page.evaluate("window.daisy.mesh.drops()")["recent"][-6:])
            h.send("drops")
            h.wait(lambda x: x["event"] == "drops" and len(h.all("drops")) == attempt, "the headless peer's drops")
            d, pd = h.all("drops")[-1], page.evaluate("window.daisy.mesh.drops()")
            closed = [x["state"] for x in h.events if x["event"] == "link" and x["peer"] == pid and x["state"].startswith("closed")]
            assert not closed, (closed, d["recent"][-6:])
            print(f"stop {attempt} at step {s['step']}: stale frames dropped: page {pd['stale']}, headless {d['stale']}; "
                  f"bad: page {pd['count']}, headless {d['count']}")
            assert pd["count"] < 50 and d["count"] < 50, (pd["recent"][-5:], d["recent"][-5:])
            if pd["stale"] + d["stale"] > stale:
                break
            stale = pd["stale"] + d["stale"]
        assert pd["stale"] + d["stale"] > 0, "no Stop landed mid-exchange in 4 tries: nothing arrived after a run ended"
