"""Headless Chromium for page tests: the system's /usr/bin/chromium driven by Playwright (sync
API), with the flags of docs/ARCHITECTURE.md "Browser tests" (WebGPU on SwiftShader, no
sandbox as root, no background traffic, loopback WebRTC). Every page opened through
`BrowserPages` records its console errors and uncaught exceptions, so a test can assert there
were none. `chromium_hideable_pages` starts a browser whose tabs can really be hidden (a
background tab's throttling included), which a Playwright launch cannot (docs/ARCHITECTURE.md
"Browser tests", hidden pages)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.app_server import stop_app

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--enable-unsafe-webgpu", "--no-sandbox", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
    "--disable-features=WebRtcHideLocalIpsWithMdns", "--allow-loopback-in-peer-connection",
]


class BrowserPages:
    """One browser; each new_page() gets its own context (like a separate browser profile)."""

    def __init__(self, browser):
        self.browser = browser
        self.problems: list[str] = []     # "<page label>: <console error or page error>"
        self.contexts = []

    def new_page(self, url: str, label: str, init_script: str | None = None):
        """init_script: JavaScript run in the page before its own scripts (test hooks)."""
        context = self.browser.new_context(permissions=["camera", "microphone"])
        self.contexts.append(context)
        if init_script:
            context.add_init_script(init_script)
        return self.open(context.new_page(), url, label)

    def open(self, page, url: str, label: str):
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"{label}: console: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"{label}: uncaught: {e}"))
        watch_stack(page)
        page.goto(url, wait_until="load", timeout=30_000)
        return page

    def close_pages(self) -> None:
        for context in self.contexts:
            context.close()
        self.contexts.clear()


# A page's JavaScript stack on demand, also while its main thread never yields (a test that waits on
# such a page then fails saying where it spins, instead of waiting forever in an evaluate): the
# Debugger domain is enabled when the page opens, because enabling it needs the main thread;
# Debugger.pause then interrupts whatever runs.
_DEBUGGERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def watch_stack(page) -> None:
    cdp = page.context.new_cdp_session(page)
    cdp.send("Debugger.enable")
    _DEBUGGERS[page] = cdp


def js_stack(page, timeout_ms: int = 3000) -> str | None:
    """The JavaScript stack of a page that does not answer (its main thread runs JavaScript and
    never yields), innermost first; None when no pause came within timeout_ms or the page has no
    debugger (not opened through BrowserPages). Only for such a page: on an idle one the pause
    would wait for its next script and stop it there (and Debugger.disable, which could cancel
    it, needs the main thread, so it would wait for good on a spinning page)."""
    cdp = _DEBUGGERS.get(page)
    if cdp is None:
        return None
    frames: list = []
    on_pause = lambda event: frames.append(event["callFrames"])   # noqa: E731
    cdp.on("Debugger.paused", on_pause)
    try:
        cdp.send("Debugger.pause")
        deadline = time.monotonic() + timeout_ms / 1000
        while not frames and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        if frames:
            cdp.send("Debugger.resume")
    finally:
        cdp.remove_listener("Debugger.paused", on_pause)
    if not frames:
        return None
    return " <- ".join(f"{f['functionName'] or '(anonymous)'} ({f['url'].rsplit('/', 1)[-1]}:{f['location']['lineNumber'] + 1})"
                       for f in frames[0][:16])


@contextlib.contextmanager
def chromium_pages():
    """Playwright's launch() gives the browser a fresh temporary profile of its own (it refuses
    --user-data-dir; that is what launch_persistent_context is for)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, timeout=30_000)
        try:
            yield BrowserPages(browser)
        finally:
            browser.close()


class HideablePages(BrowserPages):
    """BrowserPages plus tabs that can really be hidden (docs/ARCHITECTURE.md "Browser tests",
    hidden pages): new_tab() opens a page in a window of its own in the browser's default
    context, where Playwright (connected with no_defaults) applies no focus emulation, the
    capture that otherwise keeps every page visible; hide() minimizes that window:
    document.visibilityState is 'hidden' and timers are throttled as in a background tab.
    new_page() pages (contexts of their own, focus emulated) always stay visible."""

    def __init__(self, browser):
        super().__init__(browser)
        self.tabs = []

    def new_tab(self, url: str, label: str):
        context = self.browser.contexts[0]
        context.grant_permissions(["camera", "microphone"])
        cdp = self.browser.new_browser_cdp_session()
        try:
            with context.expect_page() as opened:
                cdp.send("Target.createTarget", {"url": "about:blank", "newWindow": True})
        finally:
            cdp.detach()
        page = opened.value
        self.tabs.append(page)
        return self.open(page, url, label)

    def set_window(self, page, state: str) -> None:
        cdp = page.context.new_cdp_session(page)
        try:
            window = cdp.send("Browser.getWindowForTarget")["windowId"]
            cdp.send("Browser.setWindowBounds", {"windowId": window, "bounds": {"windowState": state}})
        finally:
            cdp.detach()

    def hide(self, page) -> None:
        """Minimize the tab's window; returns once the page itself says it is hidden."""
        assert page in self.tabs, "only a page of new_tab() can be hidden (a new_page() one is kept visible)"
        self.set_window(page, "minimized")
        self.wait_visibility(page, "hidden")

    def show(self, page) -> None:
        self.set_window(page, "normal")
        self.wait_visibility(page, "visible")

    @staticmethod
    def wait_visibility(page, want: str, timeout_s: float = 10) -> None:
        # polled from here: a hidden page runs no animation frames and its timers are throttled
        deadline = time.monotonic() + timeout_s
        while (got := page.evaluate("document.visibilityState")) != want:
            assert time.monotonic() < deadline, f"the page stayed {got!r}, not {want!r}, for {timeout_s} s"
            time.sleep(0.05)

    def close_pages(self) -> None:
        for page in self.tabs:
            page.close()
        self.tabs.clear()
        super().close_pages()


@contextlib.contextmanager
def chromium_hideable_pages():
    """/usr/bin/chromium started here (headless, FLAGS, a fresh profile, none of Playwright's
    launch switches such as --disable-background-timer-throttling) and driven over CDP, so a
    hidden tab is throttled as a user's would be -> HideablePages."""
    with tempfile.TemporaryDirectory(prefix="daisy-chromium-") as profile, sync_playwright() as p:
        log = open(os.path.join(profile, "chromium.log"), "wb")
        proc = subprocess.Popen([CHROMIUM, "--headless", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                                 *FLAGS, "about:blank"], stdout=log, stderr=subprocess.STDOUT)
        try:
            # the browser writes its port and path once DevTools listens
            port_file, deadline = Path(profile, "DevToolsActivePort"), time.monotonic() + 30
            while not (port_file.exists() and len(port_file.read_text().split()) == 2):
                assert proc.poll() is None, f"chromium exited with {proc.returncode}: {Path(log.name).read_text()[-2000:]}"
                assert time.monotonic() < deadline, "chromium opened no DevTools port within 30 s"
                time.sleep(0.05)
            port, path = port_file.read_text().split()
            browser = p.chromium.connect_over_cdp(f"ws://127.0.0.1:{port}{path}", no_defaults=True, timeout=30_000)
            try:
                yield HideablePages(browser)
            finally:
                browser.close()
        finally:
            stop_app(proc, log)                 # terminate, kill after 10 s, close the log
