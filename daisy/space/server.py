"""The Space's web app: one FastAPI app carrying the signaling route, the data routes, the
model routes, the browser peer's static files and the Gradio page.

    create_app() -> FastAPI        used by app.py (uvicorn) and by the tests

Routes (first match wins, so Gradio's catch-all mount at "/" comes last):
    /signal        WebSocket signaling          daisy.space.signaling
    /data/...      training data                daisy.space.datastream
    /js/...        frontend_js/ (ES modules)    the browser peer
    /kernels/...   kernels/ (WGSL)              loaded by frontend_js at run time
    /api/checkpoint.pt, /api/model.safetensors, /api/kit.html, /api/load
                   the model routes             daisy.space.model_routes
    /api/group-run, /api/group-run/info
                   the group's stored run       daisy.space.group_run
    /api/room      a new room code              daisy.space.signaling
    /              the Gradio Blocks page       daisy.space.page
Gradio owns /static and /assets, so our files live under their own prefixes.
"""
from __future__ import annotations

import gradio as gr
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from daisy.space.datastream import DataSource, make_data_router
from daisy.space.group_run import make_group_run_router
from daisy.space.model_routes import make_model_router
from daisy.space.page import JS_DIR, JS_PREFIX, ROOT, build_page
from daisy.space.signaling import SignalingHub, make_room_router, make_signaling_router

KERNELS_DIR = ROOT / "kernels"
KERNELS_PREFIX = "/kernels"


def create_app(*, hub: SignalingHub | None = None, data_source: DataSource | None = None) -> FastAPI:
    """The whole Space as one ASGI app (hub and data source built from the environment when
    not given)."""
    if data_source is None:
        data_source = DataSource()
        data_source.start()          # pin the data's commit at start-up, not on the first request
    app = FastAPI(title="DaisyChain-Web")
    signal_router = make_signaling_router(hub)
    app.include_router(signal_router)
    app.include_router(make_group_run_router(signal_router.hub))   # its callers' groups: the hub's seats
    app.include_router(make_room_router())
    app.include_router(make_data_router(data_source))
    app.include_router(make_model_router())
    app.mount(JS_PREFIX, StaticFiles(directory=JS_DIR), name="frontend_js")
    app.mount(KERNELS_PREFIX, StaticFiles(directory=KERNELS_DIR, check_dir=False), name="kernels")
    css = (JS_DIR / "peer" / "page.css").read_text(encoding="utf-8")
    return gr.mount_gradio_app(app, build_page(data_source), path="/", css=css, ssr_mode=False,
                               footer_links=[])
