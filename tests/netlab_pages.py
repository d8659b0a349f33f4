"""Pages behind emulated links (docs/ARCHITECTURE.md "Network lab"), for the browser tests and
bench/bench_wire.py: the app in the root namespace on the lab's address, each page its own
headless Chromium inside its own namespace (optionally pinned to one core), grouped in a room.

    with Netlab([profile("home")] * 2) as lab, lab_app(lab, tmp) as base, LabPages(lab, base) as pages:
        host, guest = room_group(pages, base, [0, 1])     # page i behind lab link i
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets

from playwright.sync_api import Error as PlaywrightError, sync_playwright

from tests.app_server import WAIT_MS, free_port, start_app, state, stop_app, wait_state, wait_up
from tests.page_browser import FLAGS

LINK_MS = 60_000            # bound on a room's links coming up behind slow, lossy links


@contextlib.contextmanager
def lab_app(lab, tmp: str, name: str = "lab", env: dict | None = None):
    """`python app.py` offline, no STUN, listening on the lab's address -> base URL."""
    port = free_port()
    proc, log = start_app(tmp, name, {"HF_HUB_OFFLINE": "1", "DAISY_ICE_SERVERS": "[]", **(env or {})},
                          ["--host", lab.host_addr, "--port", str(port)])
    base = f"http://{lab.host_addr}:{port}"
    try:
        wait_up(proc, base, os.path.join(tmp, f"{name}.log"))
        yield base
    finally:
        stop_app(proc, log)


class LabPages:
    """One browser per page, page i's inside lab namespace i; console errors are collected in
    `problems` as tests/page_browser.py does."""

    def __init__(self, lab, base: str, spki: str | None = None):
        """spki: for an https base, the base64 SHA-256 of the server's public key, the one
        certificate the pages' browsers trust (Chromium's --ignore-certificate-errors-spki-list);
        an http base is treated as a secure origin instead."""
        self.lab, self.base = lab, base
        self.problems: list[str] = []
        self.browsers = []
        self.trust = (f"--ignore-certificate-errors-spki-list={spki}" if spki
                      else f"--unsafely-treat-insecure-origin-as-secure={base}")

    def __enter__(self):
        self.pw = sync_playwright().start()
        return self

    def __exit__(self, *exc):
        self.close_all()
        self.pw.stop()

    def close_all(self) -> None:
        """Close every page's browser (each page says goodbye to the server as it goes)."""
        for b in self.browsers:
            with contextlib.suppress(Exception):
                b.close()
        self.browsers.clear()

    def open(self, i: int, url: str, label: str, cpu: int | None = None, init_script: str | None = None,
             past_warning: bool = False):
        """Page i (behind lab link i) on url, its browser pinned to `cpu` when given;
        init_script: JavaScript run before the page's own (test hooks). past_warning: the
        browser does not trust the https server's certificate; it must show its warning, and
        the page is opened as a person does it: "Advanced", then "Proceed to … (unsafe)"."""
        browser = self.pw.chromium.launch(
            executable_path=self.lab.chromium(i, cpu), timeout=30_000,
            args=FLAGS if past_warning else [*FLAGS, self.trust])
        self.browsers.append(browser)
        context = browser.new_context(permissions=["camera", "microphone"])
        if init_script:
            context.add_init_script(init_script)
        page = context.new_page()
        if past_warning:                                             # the warning, first
            try:
                page.goto(url, wait_until="load", timeout=60_000)
            except PlaywrightError as e:
                if "ERR_CERT_AUTHORITY_INVALID" not in str(e):
                    raise
            else:
                raise AssertionError(f"{label}: the browser opened {url} without warning about its certificate")
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"{label}: console: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"{label}: uncaught: {e}"))
        if past_warning:
            page.click("#details-button", timeout=WAIT_MS)           # "Advanced"
            with page.expect_navigation(url=url, wait_until="load", timeout=60_000):
                page.click("#proceed-link", timeout=WAIT_MS)         # "Proceed to … (unsafe)"
        else:
            page.goto(url, wait_until="load", timeout=60_000)
        page.wait_for_function("window.daisy && window.daisy.state().peerId", timeout=30_000)
        return page


def admit(host, guest) -> None:
    """The room host approves `guest` (window.daisy.approve) once its request arrived."""
    gid = state(guest)["peerId"]
    wait_state(host, f"s.requests.some((r) => r.id === {json.dumps(gid)})", f"join request of {gid}")
    host.evaluate("(id) => window.daisy.approve(id)", gid)
    wait_state(guest, "s.role === 'member'", "guest approved")


def linked(page, others, timeout_ms: int = LINK_MS) -> None:
    ids = [state(o)["peerId"] for o in others]
    wait_state(page, " && ".join(f"s.links[{json.dumps(i)}] === 'linked'" for i in ids) or "true",
               f"links to {ids}", timeout_ms)


def room_url(base: str, query: str = "") -> str:
    return f"{base}/?room=lab-{secrets.token_hex(6)}{query}"


def room_group(pages: LabPages, url: str, indices: list[int], cpus: list | None = None,
               init_script: str | None = None) -> list:
    """Pages for lab links `indices` in the room of `url` (the first hosts and approves the
    others), all linked to each other -> the pages."""
    cpus = cpus or [None] * len(indices)
    group = [pages.open(indices[0], url, f"p{indices[0]}", cpus[0], init_script)]
    wait_state(group[0], "s.role === 'host'", "room host")
    for i, cpu in zip(indices[1:], cpus[1:]):
        guest = pages.open(i, url, f"p{i}", cpu, init_script)
        admit(group[0], guest)
        group.append(guest)
    for page in group:
        linked(page, [o for o in group if o is not page])
        wait_state(page, f"s.peers.length >= {len(group)}", "peer list", WAIT_MS)
    return group
