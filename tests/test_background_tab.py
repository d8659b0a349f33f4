"""A run whose page is a background tab must not stall (docs/ARCHITECTURE.md "Background tabs").
The pages are real tabs of a Chromium started for this (tests/page_browser.py
chromium_hideable_pages): a hidden one is in a minimized window, its
`document.visibilityState` is 'hidden' and its timers are throttled as a user's background
tab's (the first test proves it). Each test trains the same run twice, every page visible and
then one hidden, and compares step rates; the hashes must equal `python -m daisy.train`.
"""
from __future__ import annotations

import time

import pytest

from tests.app_server import WAIT_MS, offline_app, open_peer, state, wait_state
from tests.browser import static_server
from tests.page_browser import chromium_hideable_pages
from tests.test_mesh import RUN_MS, TINY, assert_hashes_equal, linked, record_steps, reference_hashes, step_hashes

pytestmark = pytest.mark.slow

STEPS = 100                 # the fewest steps a run may have


@pytest.fixture(scope="module")
def browser():
    """Overrides conftest's: the `pages` fixture then hands out HideablePages."""
    with chromium_hideable_pages() as pages:
        yield pages


@pytest.fixture(scope="module")
def app_url():
    with offline_app("bgtab") as base:
        yield base


# ---- helpers --------------------------------------------------------------------------------

def poll(page, js: str, what: str, timeout_ms: int = RUN_MS):
    """page.evaluate(js) until truthy, polled from here: Playwright's wait_for_function polls on
    animation frames, which a hidden page does not run."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not (got := page.evaluate(js)):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_ms} ms; state is {str(state(page))[:1500]}"
        time.sleep(0.05)
    return got


def open_tab(pages, url: str, label: str):
    tab = pages.new_tab(url, label)
    tab.wait_for_function("window.daisy && window.daisy.state().peerId", timeout=WAIT_MS)   # still visible here
    return tab


def record(page) -> None:
    """window.stepHashes (tests/test_mesh.py) and window.stepTimes {step: performance.now()}."""
    record_steps(page)
    page.evaluate("() => { window.stepTimes = {}; window.daisy.on('step', (e) => { window.stepTimes[e.step] = performance.now(); }); }")


def steps_per_s(page, first: int, last: int) -> float:
    t = {int(k): v for k, v in page.evaluate("window.stepTimes").items()}
    return (last - first) * 1000 / (t[last] - t[first])


# ---- the harness --------------------------------------------------------------------------

# chained timers and page_clock yields, each counted for `ms` in the page
COUNT_WAKES_JS = """async (ms) => {
  const { yieldToPage } = await import('/frontend_js/page_clock.js');
  const count = async (next) => { let n = 0; const t0 = performance.now();
    while (performance.now() - t0 < ms) { await next(); n++; } return n; };
  const timers = await count(() => new Promise((r) => setTimeout(r, 0)));
  const yields = await count(yieldToPage);
  return { visibility: document.visibilityState, timers, yields };
}"""


def test_a_minimized_tab_is_hidden_its_timers_throttled_and_its_yields_not(pages):
    with static_server() as base:
        tab = pages.new_tab(base + "/tests/pages/blank.html", "tab")
        shown = tab.evaluate(COUNT_WAKES_JS, 2000)
        pages.hide(tab)
        hidden = tab.evaluate(COUNT_WAKES_JS, 2000)
        pages.show(tab)
        again = tab.evaluate(COUNT_WAKES_JS, 2000)
    print(f"in 2 s: visible {shown}, hidden {hidden}, visible again {again}")
    assert shown["visibility"] == again["visibility"] == "visible" and hidden["visibility"] == "hidden"
    # Chromium's 4 ms clamp allows ~250 chained timers a second in a visible page; a hidden one
    # wakes them once a second (after the first few)
    assert shown["timers"] >= 100 and again["timers"] >= 100, (shown, again)
    assert hidden["timers"] <= 20, f"the hidden tab's timers are not throttled: {hidden}"
    assert hidden["yields"] >= 1000, f"yieldToPage is throttled in the hidden tab: {hidden}"


# ---- runs ---------------------------------------------------------------------------------

def test_a_group_with_a_hidden_page_trains_at_least_half_as_fast(app_url, pages):
    """Two pages; `tab` leads and is hidden in the second run, `front` stays visible."""
    settings = {"steps": STEPS, **TINY}
    want = reference_hashes(2, settings, STEPS)
    rates = {}
    for hide in (False, True):
        front = open_peer(pages, app_url + "/", "front")
        tab = open_tab(pages, app_url + "/", "tab")
        linked(front, [tab])
        linked(tab, [front])
        for page in (front, tab):
            record(page)
        if hide:
            pages.hide(tab)
        tab.evaluate("(cfg) => window.daisy.start(cfg)", settings)
        poll(tab, "window.daisy.state().runState === 'done'", "the tab finished")
        wait_state(front, "!s.running && s.runState === 'done'", "the front page finished", RUN_MS)
        assert tab.evaluate("document.visibilityState") == ("hidden" if hide else "visible")
        rates[hide] = steps_per_s(tab, 1, STEPS)
        run = "hidden" if hide else "visible"
        assert_hashes_equal(f"tab ({run} run)", step_hashes(tab), want)
        assert_hashes_equal(f"front ({run} run)", step_hashes(front), want)
        pages.close_pages()
        time.sleep(0.3)                        # the closed pages' goodbyes reach the server
    print(f"steps/s: every page visible {rates[False]:.1f}, one hidden {rates[True]:.1f}")
    assert rates[True] >= rates[False] / 2, f"the hidden page stalls the group: {rates[True]:.1f} steps/s, all visible {rates[False]:.1f}"


# Steps long enough (~70 ms on the CPU here) that the batch prefetch stays ahead: then nothing in
# a step waits on another task (no peer, no fetch), so the loop's own yield is all the page
# scheduler sees; with a timer that yield is throttled to one wake a second in a hidden tab.
MEDIUM = {"width": 64, "seq_len": 64, "batch": 4, "layers": 2, "heads": 4}
MEASURED = 30               # steps whose rate is compared (then the run is stopped)


def test_a_hidden_page_training_alone_trains_at_least_a_quarter_as_fast(app_url, pages):
    settings = {"steps": STEPS, **MEDIUM}
    rates, hashes, took = {}, {}, None
    for hide in (False, True):
        tab = open_tab(pages, app_url + "/?gpu=off", "tab")
        record(tab)
        if hide:
            pages.hide(tab)
        t0 = time.monotonic()
        tab.evaluate("(cfg) => window.daisy.start(cfg)", settings)
        # the hidden run gets twice the visible run's time (and 10 s) to do its steps: a stalled
        # one is measured on the steps it did, so it fails on its rate, not on a timeout
        bound = RUN_MS if took is None else int(2000 * took) + 10_000
        deadline = time.monotonic() + bound / 1000
        while tab.evaluate("window.daisy.state().step") < MEASURED and time.monotonic() < deadline:
            time.sleep(0.05)
        tab.evaluate("window.daisy.stop()")
        poll(tab, "!window.daisy.state().running", "the tab stopped")
        took = took or time.monotonic() - t0
        assert tab.evaluate("document.visibilityState") == ("hidden" if hide else "visible")
        hashes[hide] = step_hashes(tab)
        done = min(len(hashes[hide]), MEASURED)
        assert hide or done == MEASURED, f"the visible run did {done} steps in {RUN_MS} ms"
        rates[hide] = steps_per_s(tab, 1, done) if done >= 2 else 0.0
        pages.close_pages()
    want = reference_hashes(1, settings, max(len(h) for h in hashes.values()))
    for hide, got in hashes.items():
        assert_hashes_equal("hidden run" if hide else "visible run", got, want[:len(got)])
    print(f"steps/s: visible {rates[False]:.1f}, hidden {rates[True]:.1f}")
    # what it guards: a hidden page whose steps wait for throttled timers (1 s apart, or a minute)
    # does at most 1 step/s against ~17 visible; a loaded 2-core CI box once measured 4.5 against
    # 17.2 (a hidden page gets fewer cycles), so a quarter, not a half
    assert rates[True] >= rates[False] / 4, f"the hidden page stalls its run: {rates[True]:.2f} steps/s, visible {rates[False]:.1f}"
