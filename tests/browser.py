"""Real pages for browser tests: a static HTTP server over the repo root on 127.0.0.1 (a secure
context, so WebGPU is offered) plus headless /usr/bin/chromium with the flags of
docs/ARCHITECTURE.md "Browser tests".

    with static_server(extra={"/fixtures/": tmp_dir}) as base:      # base = "http://127.0.0.1:PORT"
        with webgpu_page(base + "/tests/pages/gpu_selftest.html") as (page, problems):
            page.evaluate("...")

The browser itself comes from tests/page_browser.py (one launcher for the whole suite: flags,
fresh temporary profile, console-error capture)."""
from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from pathlib import Path

from tests.page_browser import CHROMIUM, FLAGS, chromium_pages   # noqa: F401  (re-exported)

REPO = Path(__file__).resolve().parent.parent

MIME = {".js": "text/javascript", ".mjs": "text/javascript", ".wgsl": "text/plain; charset=utf-8",
        ".html": "text/html; charset=utf-8", ".json": "application/json", ".css": "text/css",
        ".dsyf": "application/octet-stream", ".wasm": "application/wasm"}


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **MIME}
    mounts: dict = {}                     # URL prefix -> directory, besides the repo root

    def translate_path(self, path):
        clean = path.split("?", 1)[0].split("#", 1)[0]
        for prefix, directory in self.mounts.items():
            if clean.startswith(prefix):
                rel = Path(clean[len(prefix):])
                if ".." in rel.parts:
                    return str(Path(directory) / "__forbidden__")
                return str(Path(directory) / rel)
        return super().translate_path(path)

    headers_out: dict = {}                # sent with every response (e.g. COOP/COEP)

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        for k, v in self.headers_out.items():
            self.send_header(k, v)
        super().end_headers()

    def log_message(self, *args):         # quiet: tests print what matters
        pass


@contextlib.contextmanager
def static_server(root: Path = REPO, extra: dict | None = None, headers: dict | None = None):
    """Serves root (and extra {url_prefix: dir}) on 127.0.0.1 at a free port -> base URL;
    headers: sent with every response (the cross-origin isolation headers, say)."""
    handler = type("Handler", (_Handler,), {"mounts": dict(extra or {}), "headers_out": dict(headers or {})})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def webgpu_page(url: str, label: str = "page"):
    """One headless Chromium page on url -> (page, problems): problems lists console errors and
    uncaught exceptions seen so far (tests that provoke faults expect some of them)."""
    with chromium_pages() as pages:
        page = pages.new_page(url, label)
        try:
            yield page, pages.problems
        finally:
            pages.close_pages()
