"""The Space's web app: one FastAPI app carrying the signaling route, the data routes, the
model routes, the browser peer's static files and the Gradio page.

    create_app() -> FastAPI        used by app.py (uvicorn) and by the tests

Routes (first match wins, so Gradio's catch-all mount at "/" comes last):
    /signal        WebSocket signaling          daisy.space.signaling (routes, hub)
    /data/...      training data                daisy.space.datastream
    /js/...        frontend_js/ (ES modules)    the browser peer
    /kernels/...   kernels/ (WGSL)              loaded by frontend_js at run time
    /api/checkpoint.pt, /api/model.safetensors, /api/kit.html, /api/load
                   the model routes             daisy.space.model_routes
    /api/group-run, /api/group-run/info
                   the group's stored run       daisy.space.group_run
    /api/room      a new room code              daisy.space.signaling.routes
    /              the Gradio Blocks page       daisy.space.page
Gradio owns /static and /assets, so our files live under their own prefixes.

Every HTTP response carries the cross-origin isolation headers (CrossOriginIsolation): an
isolated page has SharedArrayBuffer, which the threaded CPU backend needs (frontend_js/cpu/threads.js).
The page's HTML gets frontend_js/peer/frame_guard.js first in its <head> (GradioFrameGuard), and
Gradio's queue polls every QUEUE_IDLE_POLL_S while idle: neither burns a device's CPU when idle.
"""
from __future__ import annotations

import gradio as gr
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from daisy.space.datastream import DataSource, make_data_router
from daisy.space.group_run import make_group_run_router
from daisy.space.model_routes import make_model_router
from daisy.space.page import JS_DIR, JS_PREFIX, ROOT, build_page
from daisy.space.signaling.config import SignalingConfig
from daisy.space.signaling.hub import SignalingHub
from daisy.space.signaling.redaction import install_log_redaction
from daisy.space.signaling.routes import make_room_router, make_signaling_router

KERNELS_DIR = ROOT / "kernels"
KERNELS_PREFIX = "/kernels"

# How often Gradio's queue looks for work, and for progress to send, while it has none
# (gradio/queueing.py `sleep_when_free`, `progress_update_sleep_when_free`: 1 and 10 ms by default
# on Linux). Those polls cost ~50 ms of CPU per second with no visitor at all, taken from the pages
# wherever the server shares a device with them (the room host of `python app.py --https`, the
# network lab's benches: TEST_RESULTS.md "Where a group step's CPU goes"). The page's one queued
# event is the data line's on load, without progress: 50 ms is plenty.
QUEUE_IDLE_POLL_S = 0.05

# COEP `credentialless` rather than `require-corp`: a cross-origin asset the page may load (a
# theme's web font) needs no Cross-Origin-Resource-Policy header of its own; it is fetched
# without credentials instead. A page embedded by a parent that is not isolated (the Space's
# iframe on huggingface.co) stays unisolated: the peer then runs one thread and says why.
ISOLATION_HEADERS = [(b"cross-origin-opener-policy", b"same-origin"),
                     (b"cross-origin-embedder-policy", b"credentialless")]


class CrossOriginIsolation:
    """ASGI middleware: the isolation headers on every HTTP response (WebSockets untouched).
    Plain ASGI, not BaseHTTPMiddleware, so Gradio's streamed responses pass through as they are."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in ISOLATION_HEADERS if k not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


FRAME_GUARD_TAG = f'<script src="{JS_PREFIX}/peer/frame_guard.js"></script>'.encode()


class GradioFrameGuard:
    """ASGI middleware: the page's HTML (GET /, Gradio's) gets frontend_js/peer/frame_guard.js as the
    first script of its <head>, ahead of Gradio's modules: it ends the requestAnimationFrame loop
    Gradio's app loader leaks (the script says why). Gradio adds a Blocks' `head` from its own
    JavaScript, after its modules took their requestAnimationFrame, so the tag goes in here."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] != "/":
            return await self.app(scope, receive, send)
        start, body = None, []

        async def send_guarded(message):
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            html = b"".join(body)
            headers = [(k, v) for k, v in start.get("headers", [])]
            kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            if start["status"] == 200 and kind.startswith(b"text/html") and b"<head>" in html:
                html = html.replace(b"<head>", b"<head>" + FRAME_GUARD_TAG, 1)
                headers = [(k, str(len(html)).encode() if k.lower() == b"content-length" else v) for k, v in headers]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": html})

        await self.app(scope, receive, send_guarded)


def create_app(*, hub: SignalingHub | None = None, data_source: DataSource | None = None) -> FastAPI:
    """The whole Space as one ASGI app (hub and data source built from the environment when
    not given). The one hub serves /signal and tells the stored-run routes who is where."""
    if data_source is None:
        data_source = DataSource()
        data_source.start()          # pin the data's commit at start-up, not on the first request
    hub = hub or SignalingHub(SignalingConfig.from_env())
    install_log_redaction()
    app = FastAPI(title="DaisyChain-Web")
    app.include_router(make_signaling_router(hub))
    app.include_router(make_group_run_router(hub))     # its callers' groups: the hub's seats
    app.include_router(make_room_router())
    app.include_router(make_data_router(data_source))
    app.include_router(make_model_router())
    app.mount(JS_PREFIX, StaticFiles(directory=JS_DIR), name="frontend_js")
    app.mount(KERNELS_PREFIX, StaticFiles(directory=KERNELS_DIR, check_dir=False), name="kernels")
    css = (JS_DIR / "peer" / "page.css").read_text(encoding="utf-8")
    page = build_page(data_source)
    # Gradio's own attributes: tests/test_server_idle.py checks that its queue still reads them
    page._queue.sleep_when_free = page._queue.progress_update_sleep_when_free = QUEUE_IDLE_POLL_S
    app = gr.mount_gradio_app(app, page, path="/", css=css, ssr_mode=False, footer_links=[])
    app.add_middleware(GradioFrameGuard)
    app.add_middleware(CrossOriginIsolation)
    return app
