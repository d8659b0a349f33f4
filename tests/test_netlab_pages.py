"""A group behind emulated links (docs/ARCHITECTURE.md "Network lab"), exchanging int8
gradients: every page its own headless Chromium in its own network namespace, two behind the
`home` profile (20 Mbit/s up, 40 ms to the app, 80 ms between them, 0.5 % loss each way) and one
behind `far` (120 ms, 1 % loss), real WebRTC through the lab's router, the app in the root
namespace. The home pair trains at least 30 steps, every step equal to `python -m daisy.train
--exchange int8`; the far page joins mid-run, is synced in over its slow link and ends on the
same hash as the others and the reference of the run's roster schedule. A slow, lossy link may
slow the group; it must never change a bit.
"""
from __future__ import annotations

import tempfile

import pytest

from tests.app_server import state, wait_state
from tests.netlab_pages import LabPages, admit, lab_app, linked, room_url
from tests.test_membership import assert_reference, final_hashes, record, schedule
from tests.test_mesh import TINY, ended
from tests.reference import reference_hashes
from tools.netlab import Netlab, profile

pytestmark = pytest.mark.slow

RUN_MS = 180_000
# tests stop it; int8 gradients (the codec's 1/7.9 of f64's bytes): what a home link carries
SETTINGS = {"steps": 10000, **TINY, "exchange": "int8"}
STOP_AT = 30


def test_home_pair_trains_the_reference_and_a_far_page_joins_mid_run():
    with tempfile.TemporaryDirectory(prefix="daisy-netlab-pages-") as tmp, \
            Netlab([profile("home"), profile("home"), profile("far")]) as lab, \
            lab_app(lab, tmp) as base, LabPages(lab, base) as pages:
        url = room_url(base, "&gpu=off")
        a = pages.open(0, url, "home-a", cpu=0)
        wait_state(a, "s.role === 'host'", "room host")
        b = pages.open(1, url, "home-b", cpu=1)
        admit(a, b)
        linked(a, [b])
        for p in (a, b):
            record(p)
        a.evaluate("(cfg) => window.daisy.start(cfg)", SETTINGS)
        wait_state(a, "s.running && s.step >= 10", "10 steps behind home links", RUN_MS)

        c = pages.open(2, url, "far-c", cpu=0)
        record(c)
        admit(a, c)
        wait_state(c, "s.running && s.runState === 'training'", "the far page synced in", RUN_MS)
        entered = state(c)["run"]["history"][-1]
        wait_state(a, f"s.running && s.step >= {max(STOP_AT, entered[0] + 5)}", "30 steps, 5 with the far page", RUN_MS)
        a.evaluate("window.daisy.stop()")
        labels = ((a, "home-a"), (b, "home-b"), (c, "far-c"))
        finals = [ended(p, f"{label} stopped", RUN_MS) for p, label in labels]
        logs = {label: final_hashes(p, label) for p, label in labels}
        router = lab.stats()
        problems = list(pages.problems)

    print("roster schedule", finals[0]["run"]["history"], "stopped at", finals[0]["step"], "router", router)
    for s, (_, label) in zip(finals, labels):
        print(label, s["runState"], s["step"], s["run"]["history"], s["message"], s["notes"][-3:])
    for s, (_, label) in zip(finals, labels):
        assert s["runState"] == "stopped", f"{label}: {s['runState']} at {s['step']}: {s['message']}"
    assert len({s["step"] for s in finals}) == 1 and len({s["hash"] for s in finals}) == 1, \
        [(s["step"], s["hash"][:16]) for s in finals]
    history = finals[0]["run"]["history"]
    assert history == [[0, 2], entered] and entered[0] >= 10, history
    assert all(s["run"]["history"] == history for s in finals), [s["run"]["history"] for s in finals]
    want = reference_hashes(SETTINGS, finals[0]["step"], roster=schedule(history))
    for label, got in logs.items():
        if label.startswith("home"):
            assert sorted(got) == list(range(1, finals[0]["step"] + 1)), f"{label}: steps {sorted(got)[:3]}.."
        assert_reference(label, got, want)
    assert sorted(logs["far-c"])[0] == entered[0] + 1
    # the links really were lossy: the router dropped packets on the way
    assert sum(d["lost"] for d in router["up"] + router["down"]) > 0, router
    assert not problems, "console errors:\n" + "\n".join(problems)
