"""Shared fixtures of the browser tests: one headless Chromium per test module (the flags of
tests/page_browser.py), and `pages`, the pages of one test, closed after it.

A test module may set EXPECTED_CONSOLE (substrings) for console errors its tests provoke on
purpose; any other console error or uncaught exception fails the test that caused it.

Expected everywhere: the browser's "Failed to load resource … 409 (Conflict)" line of a stored-run
upload the server declines (only /api/group-run answers 409: docs/PROTOCOL.md "The stored run").
The tests of one module share one server and so one network group, whose stored run a test's
group vouched by more devices keeps; a later, smaller group's uploads are then declined — the
rule working, and the page says so on its panel."""
from __future__ import annotations

import time

import pytest

from tests.page_browser import chromium_pages

ALWAYS_EXPECTED = ("status of 409 (Conflict)",)


@pytest.fixture(scope="module")
def browser():
    with chromium_pages() as pages:
        yield pages


@pytest.fixture
def pages(browser, request):
    """Pages for one test; after it, no page may have logged an unexpected console error."""
    expected = ALWAYS_EXPECTED + tuple(getattr(request.module, "EXPECTED_CONSOLE", ()))
    browser.problems.clear()
    yield browser
    problems = [p for p in browser.problems if not any(x in p for x in expected)]
    browser.close_pages()
    time.sleep(0.3)          # the closed pages' goodbyes reach the server before the next test
    assert not problems, "console errors:\n" + "\n".join(problems)
