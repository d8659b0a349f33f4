"""The Space's web app: one FastAPI app carrying the signaling route, the data routes, the
browser peer's static files and the Gradio page.

    create_app() -> FastAPI        used by app.py (uvicorn) and by the tests

Routes (first match wins, so Gradio's catch-all mount at "/" comes last):
    /signal        WebSocket signaling          daisy.space.signaling
    /data/...      training data                daisy.space.datastream
    /js/...        frontend_js/ (ES modules)    the browser peer
    /kernels/...   kernels/ (WGSL)              loaded by frontend_js at run time
    /api/checkpoint.pt, /api/model.safetensors, /api/kit.html, /api/load
                   the model routes             make_model_router() (below)
    /api/group-run, /api/group-run/info
                   the group's stored run       daisy.space.group_run
    /              the Gradio Blocks page       build_page()
Gradio owns /static and /assets, so our files live under their own prefixes.

The page. Gradio widgets hold the settings, Start/Stop, Generate and the checkpoint/kit
controls; their events run JavaScript only (fn=None, js=...), calling `window.daisy`
(frontend_js/peer/peer.js). The peer's own DOM (peer list, join requests, live readouts, loss plot)
lives in ONE gr.HTML whose value is never set again: setting it would re-render the template
and strip the DOM the JS built (docs/ARCHITECTURE.md "The page").

The model routes. The server sees weights only when a user asks (docs/ARCHITECTURE.md
"Checkpoint routes"): the page POSTs its replica to turn it into a file (.pt, model.safetensors, the inference kit), or POSTs a .pt to
get its state back. Replicas travel in one compact binary form, the *state body*
(daisy/files/state_codec.py: format, encode_state, decode_state).
Refusals are 4xx JSON {"error": message naming the problem}; 413 when a body is over its limit;
503 "busy, retry" (with Retry-After) when /api/load has no free parse slot (daisy.space.sandbox).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import gradio as gr
from fastapi import APIRouter, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from daisy.space.bodies import BodyTooLarge as _BodyTooLarge, read_body as _read_body, refuse as _refuse
from daisy.files.checkpoint import (DEFAULT_MAX_BYTES, CheckpointError, load_checkpoint, save_checkpoint,
                         save_safetensors)
from daisy.config import RANGES, Config
from daisy.space.datastream import DataSource, make_data_router
from daisy.space.group_run import make_group_run_router
from daisy.files.kit import KitError, render_kit
from daisy.space.sandbox import ParseBusy, ParseSandbox
from daisy.space.signaling import SignalingHub, make_room_router, make_signaling_router
from daisy.files.state_codec import (MAX_STATE_BYTES, StateError, decode_state,  # noqa: F401  (re-exported)
                          encode_state)
from daisy.tokenizer import TOKENIZER_ID

ROOT = Path(__file__).resolve().parents[2]   # the repository (this file: daisy/space/)
JS_DIR = ROOT / "frontend_js"
KERNELS_DIR = ROOT / "kernels"
JS_PREFIX = "/js"
KERNELS_PREFIX = "/kernels"

# The five group settings on the page: (Config field, slider label, slider step, help).
# Width moves in steps of 16 so it stays a multiple of the default head count (4).
SETTINGS = [
    ("width", "Model width", 16, "embedding / channel width of the transformer"),
    ("seq_len", "Sequence length", 1, "context window in tokens"),
    ("batch", "Batch per device", 1, "sequences each device adds per step"),
    ("steps", "Steps", 100, "training steps of the run"),
    ("lr_x1000", "Learning rate ×1000", 1, "Adam learning rate times 1000 (10 = 0.01)"),
]
assert 16 % Config().heads == 0, "width slider step must keep width a multiple of heads"

NO_MODEL = "Train or load a model first."
# Runs once when the panel mounts: load the peer's UI module and hand it the panel element.
MOUNT_JS = (f"import('{JS_PREFIX}/peer/ui.js').then((m) => m.mount(element))"
            ".catch((e) => { element.textContent = 'The peer failed to load: ' + e; });")


def peer_panel_html() -> str:
    """The peer panel's static HTML. The list of frontend_js modules (paths under frontend_js/) rides along as a data
    attribute, so the JS imports optional parts without probing for them (a 404 is a console
    error)."""
    modules = json.dumps(sorted(p.relative_to(JS_DIR).as_posix() for p in JS_DIR.rglob("*.js")))
    return (f'<div id="daisy-peer" class="daisy-peer" data-modules="{html.escape(modules, quote=True)}">'
            'Starting the peer…</div>')


def data_status_text(source: DataSource) -> str:
    """One line for the page: which corpus the Space serves, and why when it fell back."""
    info = source.info()
    if info["source"] == "builtin":
        why = info.get("error") or info.get("reason") or "no reason given"
        return f"**Training data:** built-in corpus (FineWeb-Edu unavailable: {why})"
    commit = f", commit `{info['commit'][:12]}`" if info.get("commit") else ""
    return (f"**Training data:** FineWeb-Edu `{info['dataset']}` ({info['config']}, "
            f"revision `{info['revision']}`{commit}), streamed by row group")


def _start_js() -> str:
    names = [name for name, *_ in SETTINGS]
    fields = ", ".join(f"{n}: Math.round({n})" for n in names)
    return (f"({', '.join(names)}) => {{ "
            # the panel shows why a start failed; catch so it is not an unhandled rejection
            f"if (window.daisy) window.daisy.start({{{fields}}}).catch(() => {{}}); "
            f"else alert('The peer has not loaded yet.'); return []; }}")


# Generate: runs in the page (frontend_js/generate.js through window.daisy.generate) on the
# peer's current weights: the weights stay in the browser, and the page's text is the one the
# Python reference gives for the same weights, prompt, settings and seed (tested).
GENERATE_JS = f"""async (prompt, temperature, top_k, seed, tokens) => {{
  const d = window.daisy;
  if (!d || !d.hasModel || !d.hasModel()) return {json.dumps(NO_MODEL)};
  if (typeof d.generate !== 'function') return 'Generation is not available in this build yet.';
  try {{
    const text = await d.generate(prompt, {{temperature, topK: Math.round(top_k), seed: Math.round(seed),
                                           tokens: Math.round(tokens)}});
    return prompt + text;
  }} catch (e) {{ return 'Generation failed: ' + (e && e.message || e); }}
}}"""


# Checkpoint / kit buttons: the page sends its replica to the model routes and saves the file
# they return; the message (file, size, hash) lands in the status line.
def _model_action_js(method: str, what: str) -> str:
    return f"""async () => {{
  const d = window.daisy;
  if (!d || !d.hasModel || !d.hasModel()) return {json.dumps(NO_MODEL)};
  if (typeof d.{method} !== 'function') return {json.dumps(what + " is not available in this build yet.")};
  try {{ return await d.{method}(); }} catch (e) {{ return '{what} failed: ' + (e && e.message || e); }}
}}"""


# Load checkpoint: a native file input in its own gr.HTML (value never set again, like the
# peer panel), wired by ui.js mountLoader. A Gradio upload would put the file on the server's
# disk and back through a Python event; the page needs the state in the browser, so it POSTs
# the file to /api/load itself and hands the answer to window.daisy.load.
LOADER_HTML = ('<div id="daisy-loader" class="daisy-loader">'
               '<button type="button" class="daisy-load-button" data-role="load-button">Load checkpoint (.pt)</button>'
               '<input type="file" accept=".pt" data-role="load-file" hidden>'
               '<span class="daisy-load-status" data-role="load-status"></span></div>')
LOADER_JS = (f"import('{JS_PREFIX}/peer/ui.js').then((m) => m.mountLoader(element))"
             ".catch((e) => { element.textContent = 'The checkpoint loader failed to load: ' + e; });")


# Create a room: a server-made code (daisy.space.signaling.make_room_router), then this page reopens
# in it; the link in the address bar is what to share.
CREATE_ROOM_JS = """async () => {
  const r = await fetch('/api/room', {method: 'POST'});
  if (!r.ok) { alert('Could not create a room: HTTP ' + r.status); return []; }
  location.search = '?room=' + encodeURIComponent((await r.json()).room);
  return [];
}"""


def build_page(source: DataSource) -> gr.Blocks:
    defaults = Config()
    with gr.Blocks(title="DaisyChain-Web") as page:
        gr.Markdown("# DaisyChain-Web\nEvery browser on this page trains one small language "
                    "model together. Open it on several devices of one network (or share a "
                    "`?room=CODE` link), pick the settings on one device and press **Start training**.")
        data_status = gr.Markdown("**Training data:** checking…", elem_id="daisy-data-status")
        create_room = gr.Button("Create a room", size="sm", elem_id="daisy-create-room")
        with gr.Row():
            with gr.Column(scale=1, min_width=280):
                gr.Markdown("### Group settings\nThe starter's settings apply to the whole group.")
                sliders = []
                for name, label, step, info in SETTINGS:
                    lo, hi, _ = RANGES[name]
                    sliders.append(gr.Slider(lo, hi, value=getattr(defaults, name), step=step,
                                             label=label, info=info, elem_id=f"setting-{name}"))
                with gr.Row():
                    start = gr.Button("Start training", variant="primary", elem_id="daisy-start")
                    stop = gr.Button("Stop", elem_id="daisy-stop")
            with gr.Column(scale=2, min_width=360):
                gr.HTML(peer_panel_html(), js_on_load=MOUNT_JS, elem_id="daisy-peer-panel")
        with gr.Row():
            with gr.Column():
                gr.Markdown("### Generate")
                prompt = gr.Textbox(label="Prompt", value="The ", elem_id="gen-prompt")
                with gr.Row():
                    temperature = gr.Slider(0.1, 2.0, value=0.8, step=0.05, label="Temperature",
                                            elem_id="gen-temperature")
                    top_k = gr.Slider(1, 257, value=40, step=1, label="Top-k", elem_id="gen-top-k")
                    seed = gr.Number(value=0, precision=0, label="Seed", elem_id="gen-seed")
                    tokens = gr.Slider(1, 2000, value=200, step=1, label="Tokens", elem_id="gen-tokens")
                generate = gr.Button("Generate", elem_id="gen-button")
                generated = gr.Textbox(label="Generated text", value=NO_MODEL, interactive=False,
                                       lines=4, elem_id="gen-output")
            with gr.Column():
                gr.Markdown("### Checkpoint and inference kit")
                with gr.Row():
                    save_ckpt = gr.Button("Download checkpoint (.pt)", elem_id="ckpt-download")
                    save_weights = gr.Button("Download weights (model.safetensors)",
                                             elem_id="safetensors-download")
                    kit = gr.Button("Download inference kit", elem_id="kit-download")
                gr.HTML(LOADER_HTML, js_on_load=LOADER_JS, elem_id="ckpt-load")
                model_status = gr.Markdown(NO_MODEL, elem_id="model-status")

        start.click(None, inputs=sliders, outputs=None, js=_start_js())
        create_room.click(None, js=CREATE_ROOM_JS)
        stop.click(None, js="() => { if (window.daisy) window.daisy.stop(); return []; }")
        generate.click(None, inputs=[prompt, temperature, top_k, seed, tokens], outputs=generated,
                       js=GENERATE_JS)
        save_ckpt.click(None, outputs=model_status,
                        js=_model_action_js("downloadCheckpoint", "Checkpoint download"))
        save_weights.click(None, outputs=model_status,
                           js=_model_action_js("downloadSafetensors", "Weights download"))
        kit.click(None, outputs=model_status, js=_model_action_js("downloadKit", "Inference kit"))
        page.load(lambda: data_status_text(source), outputs=data_status)
    return page


# ---------------------------------------------------------------------------------------------
# The model routes (the state body: daisy/files/state_codec.py)

MAX_CHECKPOINT_BYTES = DEFAULT_MAX_BYTES           # uploads to /api/load


def _attachment(data, media_type: str, filename: str, state: dict) -> Response:
    return Response(data, media_type=media_type, headers={
        "Content-Disposition": f'attachment; filename="{filename}"',
        "X-Daisy-Weight-Hash": state["weight_hash"], "X-Daisy-Step": str(state["step"])})


def _checkpoint_file(state: dict) -> Response:
    data = save_checkpoint(None, config=state["config"], params=state["params"], step=state["step"],
                           adam_m=state["adam_m"], adam_v=state["adam_v"], adam_t=state["adam_t"],
                           extra=state["extra"])
    return _attachment(data, "application/octet-stream", f"daisychain-step{state['step']}.pt", state)


def _safetensors_file(state: dict) -> Response:
    meta = {"format": "daisychain", "tokenizer": TOKENIZER_ID, "step": str(state["step"]),
            "config": json.dumps(state["config"], sort_keys=True), "weight_hash": state["weight_hash"]}
    data = save_safetensors(None, state["params"], metadata=meta)
    return _attachment(data, "application/octet-stream", "model.safetensors", state)


def _kit_file(state: dict) -> Response:
    html_text = render_kit(state["config"], state["params"], state["step"])
    return _attachment(html_text.encode("utf-8"), "text/html; charset=utf-8",
                       f"daisychain-kit-step{state['step']}.html", state)


def _loaded_state(body: bytes, load=load_checkpoint) -> Response:
    ck = load(body, max_bytes=MAX_CHECKPOINT_BYTES)
    data = encode_state(config=ck.config, step=ck.step, params=ck.params, adam_m=ck.adam_m,
                        adam_v=ck.adam_v, adam_t=ck.adam_t, weight_hash=ck.weight_hash, extra=ck.extra)
    return Response(data, media_type="application/octet-stream",
                    headers={"X-Daisy-Weight-Hash": ck.weight_hash, "X-Daisy-Step": str(ck.step)})


def make_model_router(sandbox: ParseSandbox | None = None) -> APIRouter:
    """POST /api/checkpoint.pt, /api/model.safetensors, /api/kit.html: a state body -> the file
    (as an attachment). POST /api/load: a .pt file's bytes -> its state body (all three parts),
    parsed in `sandbox` (daisy.space.sandbox; from the environment when None)."""
    router = APIRouter()
    sandbox = sandbox or ParseSandbox.from_env()

    async def answer(request: Request, limit: int, make) -> Response:
        try:
            body = await _read_body(request, limit)
            # parsing and writing a ~40 MB file is CPU work: keep it off the event loop
            return await run_in_threadpool(make, body)
        except _BodyTooLarge as e:
            return _refuse(413, str(e))
        except (StateError, CheckpointError, KitError) as e:
            return _refuse(400, str(e))

    def from_state(build, need_optim: bool):
        return lambda body: build(decode_state(body, need_optim=need_optim))

    @router.post("/api/checkpoint.pt")
    async def checkpoint_pt(request: Request):
        return await answer(request, MAX_STATE_BYTES, from_state(_checkpoint_file, True))

    @router.post("/api/model.safetensors")
    async def model_safetensors(request: Request):
        return await answer(request, MAX_STATE_BYTES, from_state(_safetensors_file, False))

    @router.post("/api/kit.html")
    async def kit_html(request: Request):
        return await answer(request, MAX_STATE_BYTES, from_state(_kit_file, False))

    @router.post("/api/load")
    async def load(request: Request):
        # An uploaded file is untrusted: parsed in a limited process, a bounded number at once;
        # the slot is taken before the body is read (docs/TROUBLESHOOTING.md, "busy, retry").
        try:
            with sandbox.slot():
                return await answer(request, MAX_CHECKPOINT_BYTES,
                                    lambda body: _loaded_state(body, sandbox.load_checkpoint))
        except ParseBusy as e:
            return JSONResponse({"error": str(e)}, status_code=503, headers={"Retry-After": "5"})

    return router


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
