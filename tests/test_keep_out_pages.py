"""A user keeps a device out (issue 27, property 6), in real pages: `python app.py` on 127.0.0.1,
headless Chromium pages of one network group linked over WebRTC. A page's user clicks "Don't train
with this device" on the other page's row: its next run goes on without that device, which asks to
join and is told why it is refused. The rule itself (a liar that stalls every roster, kept out, the
next run going on without it) is tests/js/run.test.mjs; the room host's removal by the server is
tests/test_signaling.py."""
from __future__ import annotations

import pytest

from tests.app_server import offline_app, state, wait_state
from tests.test_mesh import RUN_MS, TINY, ended, open_group

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def app_url():
    with offline_app("keepout") as base:
        yield base


def test_a_user_keeps_a_device_out_and_the_next_run_goes_on_without_it(app_url, pages):
    a, x = open_group(pages, app_url + "/", 2)
    xid = state(x)["peerId"]
    a.click(f'#daisy-peer tr[data-peer="{xid}"] button.keep-out')
    wait_state(a, f"s.keptOut[{xid!r}] !== undefined", "the device kept out")
    a.wait_for_selector(f'#daisy-peer tr[data-peer="{xid}"] .daisy-kept-out', timeout=5_000)
    a.evaluate("(cfg) => window.daisy.start(cfg)", {**TINY, "steps": 10000})
    wait_state(a, "s.running && s.step >= 5", "a's run", RUN_MS)
    assert state(a)["run"]["roster"] == [state(a)["peerId"]], state(a)["run"]
    # x, idle, sees its group train and asks to join: refused, and told why
    wait_state(x, "s.notes.some((n) => /keeps this device out/.test(n))", "x told it is kept out", 30_000)
    assert not state(x)["running"] and xid not in state(a)["run"]["roster"]
    a.evaluate("window.daisy.stop()")
    assert ended(a, "a stopped")["runState"] == "stopped"
