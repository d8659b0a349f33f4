"""The page tests' own helpers, where a mistake would hide a failure: a page whose main thread
never yields makes a wait fail within its bound and name where it spins (tests/page_browser.py
js_stack), instead of leaving the test in an evaluate for good (a CI run would then end only at
its 90-minute limit, saying nothing)."""
from __future__ import annotations

import time
from urllib.parse import quote

import pytest

from tests.app_server import wait_state
from tests.page_browser import chromium_pages

PAGE = """<script>
window.daisy = { state: () => ({ runState: 'training', running: true, message: 'busy' }) };
function spinsHere() { let a = []; for (;;) { a.push(1); if (a.length > 1000) a = []; } }
function startsTheSpin() { spinsHere(); }
window.spinSoon = () => setTimeout(startsTheSpin, 200);
</script>"""


def test_a_wait_on_a_page_that_never_yields_fails_in_bound_naming_where_it_spins():
    with chromium_pages() as pages:
        page = pages.new_page("data:text/html," + quote(PAGE), "spin")
        with pytest.raises(AssertionError, match=r"message 'busy'"):       # answering: its state
            wait_state(page, "false", "the answering page", 300)
        page.evaluate("window.spinSoon()")
        time.sleep(0.5)
        t0 = time.monotonic()
        with pytest.raises(AssertionError) as failed:
            wait_state(page, "false", "the spinning page", 1000)
        took = time.monotonic() - t0
        assert "does not answer" in str(failed.value), failed.value
        assert "spinsHere" in str(failed.value) and "startsTheSpin" in str(failed.value), failed.value
        assert took < 30, f"the wait took {took:.1f} s"
