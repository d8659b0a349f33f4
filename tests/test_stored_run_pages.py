"""A run that outlives its browsers, in real pages: `python app.py` on 127.0.0.1, headless
Chromium pages linked over WebRTC. The run's leader stores the group's state on the server
every ?storeEvery=N steps; once every page closed, a reopened page offers "Resume step N of the
group's run", resumes, and every later hash equals the reference's
(`python -m daisy.train --peers 2 --stop-after N --save a.pt`, then `--resume a.pt --peers 1`)."""
from __future__ import annotations

import pytest

from tests.app_server import offline_app, open_peer, state, wait_state
from tests.reference import setting_args, train_hashes
from tests.test_mesh import RUN_MS, TINY, assert_hashes_equal, ended, open_group, record_steps, step_hashes

pytestmark = pytest.mark.slow

# steps 10000: the run is still going when the test closes its pages (a tiny step is ~ms)
SETTINGS = {**TINY, "steps": 10000}
STORE_EVERY = 10
RESUMED_STEPS = 12
TINY_FLAGS = setting_args(SETTINGS)


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
    b.context.close()

    c = open_peer(pages, app_url + "/", "reopened")
    wait_state(c, "s.storedOffer !== null", "the offer to resume")
    offer = state(c)["storedOffer"]
    n = offer["step"]
    assert n >= 40 and n % STORE_EVERY == 0, offer
    assert offer["steps"] == SETTINGS["steps"] and offer["config"]["width"] == 16, offer
    # the stored state is the two-page run's at step n, bit for bit
    pt = tmp_path / "a.pt"
    two = train_hashes("--peers", "2", *TINY_FLAGS, "--stop-after", str(n), "--save", str(pt))
    assert offer["hash"] == two[-1], f"stored step {n}: {offer['hash']}, reference {two[-1]}"

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
