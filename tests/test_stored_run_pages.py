"""A run that outlives its browsers, in real pages: `python app.py` on 127.0.0.1, headless
Chromium pages linked over WebRTC. The run's leader stores the group's state on the server
every ?storeEvery=N steps; once every page closed, a reopened page offers "Resume step N of the
group's run", resumes, and every later hash equals the reference's
(`python -m daisy.train --peers 2 --stop-after N --save a.pt`, then `--resume a.pt --peers 1`)."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from tests.app_server import offline_app, open_peer, state, wait_state
from daisy.files.state_codec import decode_state
from tests.reference import setting_args, train_hashes
from tests.signal_client import SignalClient
from tests.test_stored_run import tiny_body
from tests.test_mesh import RUN_MS, TINY, assert_hashes_equal, ended, open_group, record_steps, step_hashes

pytestmark = pytest.mark.slow

# steps 10000: the run is still going when the test closes its pages (a tiny step is ~ms)
SETTINGS = {**TINY, "steps": 10000}
STORE_EVERY = 10
RESUMED_STEPS = 12
TINY_FLAGS = setting_args(SETTINGS)
# refused stores (a lone page's run after the group's, vouched by fewer; the liar's) log the
# browser's 409 line: expected in every page test (tests/conftest.py ALWAYS_EXPECTED)


@pytest.fixture(scope="module")
def app_url():
    with offline_app("stored") as base:
        yield base


def test_every_page_closes_and_a_reopened_page_resumes_the_groups_run(app_url, pages, tmp_path):
    a, b = open_group(pages, f"{app_url}/?storeEvery={STORE_EVERY}", 2)
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)                # a leads, b joins
    wait_state(a, "s.storedStep >= 40", "the leader stored step 40", RUN_MS)
    assert state(b)["storedStep"] is None, "a member stored the run: only the leader does"
    a.context.close()                                    # every page of the group closes
    # b may lead on alone for a few steps before it closes (a's departure is evidence of its own):
    # its run's P schedule then says so, and the stored state is that schedule's
    run_b = state(b)["run"]
    b.context.close()
    history = run_b["history"] if run_b else [[0, 2]]

    c = open_peer(pages, app_url + "/", "reopened")
    wait_state(c, "s.storedOffer !== null", "the offer to resume")
    offer = state(c)["storedOffer"]
    n = offer["step"]
    assert n >= 40 and n % STORE_EVERY == 0, offer
    assert offer["steps"] == SETTINGS["steps"] and offer["config"]["width"] == 16, offer
    # the stored state is the two-page run's at step n, bit for bit
    pt = tmp_path / "a.pt"
    roster = ",".join(f"{s}:{p}" for s, p in history if s < n)
    two = train_hashes("--roster", roster, *TINY_FLAGS, "--stop-after", str(n), "--save", str(pt))
    assert offer["hash"] == two[-1], f"stored step {n} (P schedule {roster}): {offer['hash']}, reference {two[-1]}"

    record_steps(c)
    c.get_by_role("button", name=f"Resume step {n} of the group's run").click()   # the label goes on naming the run and its storing peer
    wait_state(c, f"s.running && s.step >= {n + RESUMED_STEPS}", "resumed steps", RUN_MS)
    c.evaluate("window.daisy.stop()")
    sc = ended(c, "resumed run stopped")
    assert sc["runState"] == "stopped" and sc["run"]["roster"] == [sc["peerId"]], sc["message"]
    assert sc["storedOffer"] is None and sc["config"]["steps"] == SETTINGS["steps"], sc
    got = step_hashes(c)
    want = train_hashes("--resume", str(pt), "--peers", "1", "--stop-after", str(max(got) - n))
    assert_hashes_equal("resumed page", got, want, first=n + 1)


def as_member(app_url: str, act) -> list:
    """await act(seat, http, answers) as a member of the pages' network group: a real signaling
    seat from loopback (no page), on its own event loop beside Playwright's -> answers."""
    answers = []

    async def main():
        async with await SignalClient.open(app_url.replace("http://", "ws://"), name="liar") as seat:
            async with httpx.AsyncClient(base_url=app_url, timeout=30) as http:
                await act(seat, http, answers)
    thread = threading.Thread(target=lambda: asyncio.run(main()))
    thread.start()
    thread.join(60)
    return answers


GROUP_UPLOAD_BUSY = "another upload of this group's run is in progress"
BUSY_RETRY_S, BUSY_BUDGET_S = 0.1, 20.0


def liar_stores(app_url: str, run_id: int, roster: list[str], body: bytes) -> list[tuple[int, str]]:
    """A member vouches for `body` over its seat, first naming the pages' roster plus itself,
    then itself alone, and uploads it under the pages' run id each time -> [(status, text)].
    The group's leader uploads every STORE_EVERY steps (tiny steps: nearly back to back), and the
    server takes one upload per group at a time: one that finds the group's own in progress is
    answered 409 "retry" before its body is read (its vouching is unknown until the body is
    hashed), so the liar retries that one, as any client does; the answer kept is the first other."""
    state = decode_state(body, need_optim=False)

    async def lie(liar, http, answers):
        for claimed in (roster + [liar.id], [liar.id]):
            await liar.send({"type": "vouch", "run": run_id, "step": state["step"], "final": False,
                             "hash": state["weight_hash"], "roster": claimed})
            give_up = time.monotonic() + BUSY_BUDGET_S
            while True:
                r = await http.post(f"/api/group-run?run={run_id}&final=0", content=body,
                                    headers={"X-Daisy-Token": liar.welcome["token"]})
                if not (r.status_code == 409 and GROUP_UPLOAD_BUSY in r.text) or time.monotonic() > give_up:
                    break
                await asyncio.sleep(BUSY_RETRY_S)
            answers.append((r.status_code, r.text))
    return as_member(app_url, lie)


def group_info(app_url: str) -> dict:
    async def ask(seat, http, answers):
        answers.append((await http.get("/api/group-run/info", headers={"X-Daisy-Token": seat.welcome["token"]})).json())
    return as_member(app_url, ask)[0]


def test_a_member_cannot_pre_empt_the_store_and_the_groups_vouched_state_is_stored(app_url, pages):
    """Issue 27's finding 2 in real pages: a member uploads a poisoned state under the running
    run's id. Named as the run's roster it is vouched by 1 of 3: refused. As a run of its own
    it is vouched by 1, never more than the group's state the pages vouched (2 of 2), which is
    stored and is what a page's own step hash says."""
    a, b = open_group(pages, f"{app_url}/?storeEvery={STORE_EVERY}", 2)
    record_steps(a)
    a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
    wait_state(a, f"s.storedStep >= {STORE_EVERY}", "the group's first stored step", RUN_MS)
    run = state(a)["run"]
    poison = tiny_body(1, seed=66)
    answers = liar_stores(app_url, run["id"], run["roster"], poison)
    assert len(answers) == 2, answers
    assert answers[0][0] == 409 and "vouched by 1 of 3 devices" in answers[0][1], answers
    assert answers[1][0] == 409 and "vouched by 2 devices" in answers[1][1], answers
    # the group goes on storing its own state, vouched by both pages
    done = state(a)["storedStep"]
    wait_state(a, f"s.storedStep > {done} || !s.running", "a later stored step", RUN_MS)
    assert state(a)["running"], (state(a)["message"], state(b)["message"], state(a)["error"])
    info = group_info(app_url)
    hashes = step_hashes(a)
    assert info["run_id"] == run["id"] and (info["vouched_by"], info["roster_size"]) == (2, 2), info
    assert info["weight_hash"] == hashes[info["step"]], (info, hashes.get(info["step"]))
    a.evaluate("window.daisy.stop()")
    ended(a, "stopped")
