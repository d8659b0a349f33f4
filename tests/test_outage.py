"""Server outage mid-run (issue 11, deliverable 5): `python app.py` is stopped while two pages
train and started again on the same port. Training is peer to peer, so the run goes on: the
pages wait for the data server (their batches come from it), reconnect to /signal with their
tokens (same peer ids: docs/PROTOCOL.md "Identity"), and finish with every step's hash equal to
`python -m daisy.train --peers 2`. A page opened after the restart links to both."""
from __future__ import annotations

import os
import tempfile
import time

import pytest

from tests.app_server import free_port, open_peer, start_app, state, stop_app, wait_state, wait_up
from tests.test_mesh import (RUN_MS, TINY, assert_hashes_equal, ended, linked, open_group,
                             reference_hashes, step_hashes)

pytestmark = pytest.mark.slow

DOWN_S = 4                  # how long the server stays down (app start adds its own seconds)
# what a browser logs while the server is away (failed batch fetches, refused WebSockets)
EXPECTED_CONSOLE = ("ERR_CONNECTION_REFUSED", "ERR_CONNECTION_RESET", "ERR_EMPTY_RESPONSE",
                    "WebSocket connection to")
ENV = {"HF_HUB_OFFLINE": "1", "DAISY_ICE_SERVERS": "[]"}


def record_progress(page) -> None:
    """Every step event in order: a doubled or missing step shows."""
    page.evaluate("() => { window.stepLog = []; window.daisy.on('step', (e) => window.stepLog.push(e.step)); }")


def test_signal_stops_and_restarts_mid_run_no_step_lost_later_joins_work(pages):
    port = free_port()
    base, args = f"http://127.0.0.1:{port}", ["--host", "127.0.0.1", "--port", str(port)]
    with tempfile.TemporaryDirectory(prefix="daisy-outage-") as tmp:
        proc, log = start_app(tmp, "before", ENV, args)
        try:
            wait_up(proc, base, os.path.join(tmp, "before.log"))
            a, b = open_group(pages, base + "/", 2)
            ids = [state(p)["peerId"] for p in (a, b)]
            for page in (a, b):
                record_progress(page)
            settings = {"steps": 100, **TINY}
            a.evaluate("(cfg) => window.daisy.start(cfg)", settings)
            wait_state(b, "s.running && s.step >= 3", "b trains", RUN_MS)
        finally:
            stop_app(proc, log)                                   # the server goes away mid-run
        try:
            for page in (a, b):
                wait_state(page, "s.signal === 'reconnecting'", "the page notices the outage")
            time.sleep(DOWN_S)
            for page, label in ((a, "a"), (b, "b")):
                s = state(page)
                assert s["running"] and s["runState"] == "training" and s["step"] < 100, \
                    f"{label}: not stalled mid-run while the server is down: {s['runState']} at {s['step']}: {s['message']}"
                assert "Reconnecting to the server… training goes on peer to peer" in s["message"], s["message"]
                assert "waiting for the data server" in s["message"], s["message"]
            proc, log = start_app(tmp, "after", ENV, args)            # the same port
            wait_up(proc, base, os.path.join(tmp, "after.log"))
            finals = [ended(page, f"{label} finished") for page, label in ((a, "a"), (b, "b"))]
            for s in finals:
                assert s["runState"] == "done" and s["step"] == 100, s["message"]
            want = reference_hashes(2, settings, 100)
            for page, label in ((a, "a"), (b, "b")):
                assert page.evaluate("window.stepLog") == list(range(1, 101)), f"{label}: steps lost or doubled"
                assert_hashes_equal(label, step_hashes(page), want)
            # back on /signal with the same ids, both in one group again
            for page, pid, other in ((a, ids[0], ids[1]), (b, ids[1], ids[0])):
                wait_state(page, f"s.signal === 'connected' && s.peerId === '{pid}' && s.peers.some((p) => p.id === '{other}')",
                           "back on /signal with the same id", 40_000)
            c = open_peer(pages, base + "/", "c")                     # a later join
            linked(c, [a, b])
            linked(a, [c])
            linked(b, [c])
        finally:
            stop_app(proc, log)
