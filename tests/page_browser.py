"""Headless Chromium for page tests: the system's /usr/bin/chromium driven by Playwright (sync
API), with the flags of docs/ARCHITECTURE.md "Browser tests" (WebGPU on SwiftShader, no
sandbox as root, no background traffic, loopback WebRTC). Every page opened through
`BrowserPages` records its console errors and uncaught exceptions, so a test can assert there
were none."""
from __future__ import annotations

import contextlib

from playwright.sync_api import sync_playwright

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
        page = context.new_page()
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"{label}: console: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"{label}: uncaught: {e}"))
        page.goto(url, wait_until="load", timeout=30_000)
        return page

    def close_pages(self) -> None:
        for context in self.contexts:
            context.close()
        self.contexts.clear()


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
