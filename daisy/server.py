"""The Space's web app: one FastAPI app carrying the signaling route, the data routes, the
browser peer's static files and the Gradio page.

    create_app() -> FastAPI        used by app.py (uvicorn) and by the tests

Routes (first match wins, so Gradio's catch-all mount at "/" comes last):
    /signal        WebSocket signaling          daisy.signaling
    /data/...      training data                daisy.datastream
    /js/...        frontend_js/ (ES modules)    the browser peer
    /kernels/...   kernels/ (WGSL)              loaded by frontend_js at run time
    /              the Gradio Blocks page       build_page()
Gradio owns /static and /assets, so our files live under their own prefixes.

The page. Gradio widgets hold the settings, Start/Stop, Generate and the checkpoint/kit
controls; their events run JavaScript only (fn=None, js=...), calling `window.daisy`
(frontend_js/peer.js). The peer's own DOM (peer list, join requests, live readouts, loss plot)
lives in ONE gr.HTML whose value is never set again: setting it would re-render the template
and strip the DOM the JS built (DESIGN §5).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import gradio as gr
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from .config import RANGES, Config
from .datastream import DataSource, make_data_router
from .signaling import SignalingHub, make_signaling_router

ROOT = Path(__file__).resolve().parent.parent
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
MOUNT_JS = (f"import('{JS_PREFIX}/ui.js').then((m) => m.mount(element))"
            ".catch((e) => { element.textContent = 'The peer failed to load: ' + e; });")


def peer_panel_html() -> str:
    """The peer panel's static HTML. The list of frontend_js modules rides along as a data
    attribute, so the JS imports optional parts without probing for them (a 404 is a console
    error)."""
    modules = json.dumps(sorted(p.name for p in JS_DIR.glob("*.js")))
    return (f'<div id="daisy-peer" class="daisy-peer" data-modules="{html.escape(modules, quote=True)}">'
            'Starting the peer…</div>')


def data_status_text(source: DataSource) -> str:
    """One line for the page: which corpus the Space serves, and why when it fell back."""
    info = source.info()
    if info["source"] == "builtin":
        why = info.get("error") or info.get("reason") or "no reason given"
        return f"**Training data:** built-in corpus (FineWeb-Edu unavailable: {why})"
    return (f"**Training data:** FineWeb-Edu `{info['dataset']}` ({info['config']}, "
            f"revision `{info['revision']}`), streamed by row group")


def _start_js() -> str:
    names = [name for name, *_ in SETTINGS]
    fields = ", ".join(f"{n}: Math.round({n})" for n in names)
    return (f"({', '.join(names)}) => {{ "
            # the panel shows why a start failed; catch so it is not an unhandled rejection
            f"if (window.daisy) window.daisy.start({{{fields}}}).catch(() => {{}}); "
            f"else alert('The peer has not loaded yet.'); return []; }}")


# Generate: window.daisy.generate(prompt, {temperature, topK, seed}) -> text, when a model exists.
GENERATE_JS = f"""async (prompt, temperature, top_k, seed) => {{
  const d = window.daisy;
  if (!d || !d.hasModel || !d.hasModel()) return {json.dumps(NO_MODEL)};
  if (typeof d.generate !== 'function') return 'Generation is not available in this build yet.';
  try {{ return await d.generate(prompt, {{temperature, topK: Math.round(top_k), seed: Math.round(seed)}}); }}
  catch (e) {{ return 'Generation failed: ' + (e && e.message || e); }}
}}"""

# Checkpoint / kit buttons: a model exists only in the browsers; until the peer can export one,
# say so instead of failing silently.
def _model_action_js(method: str, what: str) -> str:
    return f"""async () => {{
  const d = window.daisy;
  if (!d || !d.hasModel || !d.hasModel()) return {json.dumps(NO_MODEL)};
  if (typeof d.{method} !== 'function') return {json.dumps(what + " is not available in this build yet.")};
  try {{ return await d.{method}(); }} catch (e) {{ return '{what} failed: ' + (e && e.message || e); }}
}}"""


def build_page(source: DataSource) -> gr.Blocks:
    defaults = Config()
    with gr.Blocks(title="DaisyChain-Web") as page:
        gr.Markdown("# DaisyChain-Web\nEvery browser on this page trains one small language "
                    "model together. Open it on several devices of one network (or share a "
                    "`?room=CODE` link), pick the settings on one device and press **Start training**.")
        data_status = gr.Markdown("**Training data:** checking…", elem_id="daisy-data-status")
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
                generate = gr.Button("Generate", elem_id="gen-button")
                generated = gr.Textbox(label="Generated text", value=NO_MODEL, interactive=False,
                                       lines=4, elem_id="gen-output")
            with gr.Column():
                gr.Markdown("### Checkpoint and inference kit")
                with gr.Row():
                    save_ckpt = gr.Button("Download checkpoint (.pt)", elem_id="ckpt-download")
                    load_ckpt = gr.UploadButton("Load checkpoint (.pt)", file_types=[".pt"],
                                                elem_id="ckpt-load")
                    kit = gr.Button("Download inference kit", elem_id="kit-download")
                model_status = gr.Markdown(NO_MODEL, elem_id="model-status")

        start.click(None, inputs=sliders, outputs=None, js=_start_js())
        stop.click(None, js="() => { if (window.daisy) window.daisy.stop(); return []; }")
        generate.click(None, inputs=[prompt, temperature, top_k, seed], outputs=generated,
                       js=GENERATE_JS)
        save_ckpt.click(None, outputs=model_status,
                        js=_model_action_js("downloadCheckpoint", "Checkpoint download"))
        kit.click(None, outputs=model_status, js=_model_action_js("downloadKit", "Inference kit"))
        load_ckpt.upload(lambda f: "Loading checkpoints arrives with the checkpoint widgets; "
                                   "nothing was loaded.", inputs=load_ckpt, outputs=model_status)
        page.load(lambda: data_status_text(source), outputs=data_status)
    return page


def create_app(*, hub: SignalingHub | None = None, data_source: DataSource | None = None) -> FastAPI:
    """The whole Space as one ASGI app (hub and data source built from the environment when
    not given)."""
    data_source = data_source or DataSource()
    app = FastAPI(title="DaisyChain-Web")
    app.include_router(make_signaling_router(hub))
    app.include_router(make_data_router(data_source))
    app.mount(JS_PREFIX, StaticFiles(directory=JS_DIR), name="frontend_js")
    app.mount(KERNELS_PREFIX, StaticFiles(directory=KERNELS_DIR, check_dir=False), name="kernels")
    css = (JS_DIR / "page.css").read_text(encoding="utf-8")
    return gr.mount_gradio_app(app, build_page(data_source), path="/", css=css, ssr_mode=False,
                               footer_links=[])
