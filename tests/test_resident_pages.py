"""The resident step in a group run between real pages (`?gpu=resident`: backends.js mode
'resident', the run loop's trainer a gpu/resident.js ResidentTrainer; docs/ARCHITECTURE.md "The
resident step"): two headless Chromium pages on WebGPU (SwiftShader here) train together over
WebRTC with weights, moments and activations on the GPU, and every step's hash on both pages
equals `python -m daisy.train --peers 2` for at least 30 steps. Tiny settings: SwiftShader
emulating float64 on this 2-core machine took ~37 s per step of the default settings (16 steps
in 10 minutes, every loss the reference's), too slow for CI; the shapes differ, the code does not."""
from __future__ import annotations

import pytest

from tests.app_server import offline_app, open_peer, state, wait_state
from tests.reference import reference_hashes
from tests.test_mesh import TINY, assert_hashes_equal, ended, linked, record_steps, step_hashes

pytestmark = pytest.mark.slow

BOOT_MS = 300_000          # the resident kernels' compile and gates on SwiftShader (two pages at once)
RUN_MS = 400_000           # 30 tiny steps in float64 emulated on SwiftShader


@pytest.fixture(scope="module")
def app_url():
    with offline_app("resident") as base:
        yield base


def test_two_resident_pages_train_the_run_of_the_reference(app_url, pages):
    a = open_peer(pages, app_url + "/?gpu=resident", "res-a")
    b = open_peer(pages, app_url + "/?gpu=resident", "res-b")
    for page, name in ((a, "a"), (b, "b")):
        wait_state(page, "s.path !== null", f"page {name} picks its backend", BOOT_MS)
        s = state(page)
        assert s["path"] == "gpu" and s["pathLabel"] == "GPU (WebGPU, the whole step resident)", (s["pathLabel"], s["pathReason"])
    linked(a, [b])
    for page in (a, b):
        record_steps(page)
        page.evaluate("() => { window.stepAt = []; window.daisy.on('step', () => window.stepAt.push(Math.round(performance.now()))); }")
    settings = {"steps": 100, **TINY}
    b.evaluate("(cfg) => window.daisy.start(cfg)", settings)
    try:
        wait_state(b, "s.running && s.step >= 30", "30 resident steps", RUN_MS)
    except AssertionError as e:
        gaps = {n: p.evaluate("window.stepAt.map((t, i, a) => i ? t - a[i - 1] : 0)") for n, p in (("a", a), ("b", b))}
        raise AssertionError(f"{e}\npage a: {state(a)['message']!r}\nms between steps: {gaps}") from None
    b.evaluate("window.daisy.stop()")
    sa, sb = ended(a, "a stopped"), ended(b, "b stopped")
    assert sa["step"] == sb["step"] >= 30 and sa["hash"] == sb["hash"], (sa["message"], sb["message"])
    want = reference_hashes(settings, sb["step"], peers=2)
    assert_hashes_equal("page a", step_hashes(a), want)
    assert_hashes_equal("page b", step_hashes(b), want)
    # no step left the GPU (a GPU error would have turned the compute line to the CPU)
    for page in (a, b):
        assert state(page)["pathLabel"] == "GPU (WebGPU, the whole step resident)", state(page)["pathReason"]
