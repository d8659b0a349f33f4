"""The Gradio page: the widgets (settings, Start/Continue/Stop, Generate, checkpoint and kit
buttons), the peer panel and the data-source line.

    build_page(source) -> gr.Blocks       mounted at "/" by daisy.space.server.create_app

The widgets' events run JavaScript only (fn=None): each `js=` is a one-line stub that imports
the served module frontend_js/peer/widgets.js and calls one of its exports with the event's
inputs; what the export returns (or resolves to) is the event's output value. Gradio passes an
event's inputs as positional arguments in `inputs` order; with no outputs the stub returns [].
widgets.js calls `window.daisy` (frontend_js/peer/peer.js); nothing round-trips to the server.

The peer's own DOM (peer list, join requests, live readouts, loss plot) lives in ONE gr.HTML
whose value is never set again: setting it would re-render the template and strip the DOM the
JS built (docs/ARCHITECTURE.md "The page").
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import gradio as gr

from daisy.config import RANGES, Config
from daisy.generate import MAX_TEMPERATURE, MAX_TOKENS
from daisy.space.datastream import DataSource
from daisy.tokenizer import VOCAB_SIZE

ROOT = Path(__file__).resolve().parents[2]   # the repository (this file: daisy/space/)
JS_DIR = ROOT / "frontend_js"
JS_PREFIX = "/js"
WIDGETS_JS = f"{JS_PREFIX}/peer/widgets.js"

# The five group settings on the page: (Config field, slider label, slider step, help).
# Width moves in steps of 16 so it stays a multiple of the default head count (4). The page
# accepts only the sliders' values (min + k * step); widgets.js says so naming the setting.
SETTINGS = [
    ("width", "Model width", 16, "embedding / channel width of the transformer"),
    ("seq_len", "Sequence length", 1, "context window in tokens"),
    ("batch", "Batch per device", 1, "sequences each device adds per step"),
    ("steps", "Steps", 100, "training steps of the run"),
    ("lr_x1000", "Learning rate ×1000", 1, "Adam learning rate times 1000 (10 = 0.01)"),
]
assert 16 % Config().heads == 0, "width slider step must keep width a multiple of heads"
# A run setting under the five, folded away: local steps (docs/VERIFICATION.md "Local steps"), which
# the peer panel suggests when the exchange slows the group ("… local steps 12 would hide it")
ADVANCED = [
    ("local_steps", "Local steps", 1, "steps each device takes between exchanges (1 = exchange every "
     "step); more hides a slow link: the panel suggests a number"),
]

NO_MODEL = "Train or load a model first."


def _call(export: str, *lead: str) -> str:
    """A js= stub: import widgets.js, call `export` with `lead` (JS literals) and the event's inputs."""
    args = ", ".join([*lead, "...a"])
    return f"(...a) => import('{WIDGETS_JS}').then((m) => m.{export}({args}))"


def _on_load(export: str, what: str) -> str:
    """A js_on_load stub (Gradio gives it `element`): mount `export` on the gr.HTML's element."""
    return (f"import('{WIDGETS_JS}').then((m) => m.{export}(element))"
            f".catch((e) => {{ element.textContent = {json.dumps(what + ' failed to load: ')} + e; }});")


def settings_spec() -> list[dict]:
    """The settings as the page's JS checks them: the sliders' names, labels and allowed values."""
    return [{"name": name, "label": label, "min": RANGES[name][0], "max": RANGES[name][1], "step": step}
            for name, label, step, _ in SETTINGS + ADVANCED]


def peer_panel_html() -> str:
    """The peer panel's static HTML. Two lists ride along as data attributes: the frontend_js
    modules the server has (paths under frontend_js/), so the JS imports optional parts without
    probing for them (a 404 is a console error), and the settings' allowed values (settings_spec)."""
    modules = json.dumps(sorted(p.relative_to(JS_DIR).as_posix() for p in JS_DIR.rglob("*.js")))
    settings = json.dumps(settings_spec())
    return (f'<div id="daisy-peer" class="daisy-peer" data-modules="{html.escape(modules, quote=True)}" '
            f'data-settings="{html.escape(settings, quote=True)}" '
            f'data-no-model="{html.escape(NO_MODEL, quote=True)}">Starting the peer…</div>')


def data_status_text(source: DataSource) -> str:
    """One line for the page: which corpus the Space serves. After a fallback the line says what it
    means (/data/info `summary`) and the reason opens from it, as the compute line's does."""
    info = source.info()
    if info["source"] == "builtin":
        if info.get("error"):
            summary, detail = "no training data: the built-in corpus cannot be read", info["error"]
        else:
            summary, detail = info.get("summary") or "using the built-in corpus", info.get("reason") or "no reason given"
        return (f'<details class="daisy-data-details"><summary><b>Training data:</b> {html.escape(summary)}</summary>'
                f"{html.escape(detail)}</details>")
    commit = f", commit `{info['commit'][:12]}`" if info.get("commit") else ""
    return (f"**Training data:** FineWeb-Edu `{info['dataset']}` ({info['config']}, "
            f"revision `{info['revision']}`{commit}), streamed by row group")


# Load checkpoint: a native file input in its own gr.HTML (value never set again, like the
# peer panel), wired by ui.js mountLoader. A Gradio upload would put the file on the server's
# disk and back through a Python event; the page needs the state in the browser, so it POSTs
# the file to /api/load itself and hands the answer to window.daisy.load.
LOADER_HTML = ('<div id="daisy-loader" class="daisy-loader">'
               '<button type="button" class="daisy-load-button" data-role="load-button">Load checkpoint (.pt)</button>'
               '<input type="file" accept=".pt" data-role="load-file" hidden>'
               '<span class="daisy-load-status" data-role="load-status"></span></div>'
               # the model line: what this tab holds, or a download's result (widgets.js)
               f'<div id="model-status" class="daisy-model-status" data-kind="auto">{html.escape(NO_MODEL)}</div>')


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
                with gr.Accordion("Speed", open=False, elem_id="daisy-advanced"):
                    for name, label, step, info in ADVANCED:
                        lo, hi, _ = RANGES[name]
                        sliders.append(gr.Slider(lo, hi, value=getattr(defaults, name), step=step,
                                                 label=label, info=info, elem_id=f"setting-{name}"))
                with gr.Row():
                    # widgets.js relabels Start ("Start a new run" once this tab holds a model) and
                    # shows Continue only while there is a run to continue (its label says the step)
                    start = gr.Button("Start training", variant="primary", elem_id="daisy-start")
                    resume = gr.Button("Continue", variant="primary", elem_id="daisy-continue")
                    stop = gr.Button("Stop", elem_id="daisy-stop")
                start_status = gr.Markdown("", elem_id="daisy-start-status")
            with gr.Column(scale=2, min_width=360):
                gr.HTML(peer_panel_html(), js_on_load=_on_load("mount", "The peer"), elem_id="daisy-peer-panel")
        with gr.Row():
            with gr.Column():
                gr.Markdown("### Generate")
                prompt = gr.Textbox(label="Prompt", value="The ", elem_id="gen-prompt")
                with gr.Row():
                    temperature = gr.Slider(0.0, MAX_TEMPERATURE, value=0.8, step=0.05, label="Temperature",
                                            info="0 = greedy (always the likeliest byte)", elem_id="gen-temperature")
                    top_k = gr.Slider(0, VOCAB_SIZE, value=40, step=1, label="Top-k", info="0 = all",
                                      elem_id="gen-top-k")
                    seed = gr.Number(value=0, precision=0, label="Seed", elem_id="gen-seed")
                    tokens = gr.Slider(1, MAX_TOKENS, value=200, step=1, label="Tokens", elem_id="gen-tokens")
                generate = gr.Button("Generate", elem_id="gen-button")
                # empty until Generate; its placeholder says what to do (widgets.js keeps it current)
                generated = gr.Textbox(label="Generated text", value="", placeholder=NO_MODEL,
                                       interactive=False, lines=4, elem_id="gen-output")
            with gr.Column():
                gr.Markdown("### Checkpoint and inference kit")
                with gr.Row():
                    save_ckpt = gr.Button("Download checkpoint (.pt)", elem_id="ckpt-download")
                    save_weights = gr.Button("Download weights (model.safetensors)",
                                             elem_id="safetensors-download")
                    kit = gr.Button("Download inference kit", elem_id="kit-download")
                gr.HTML(LOADER_HTML, js_on_load=_on_load("mountLoader", "The checkpoint loader"),
                        elem_id="ckpt-load")

        start.click(None, inputs=sliders, outputs=start_status, js=_call("start"))
        resume.click(None, outputs=start_status, js=_call("continueRun"))
        stop.click(None, js=_call("stop"))
        create_room.click(None, js=_call("createRoom"))
        generate.click(None, inputs=[prompt, temperature, top_k, seed, tokens], outputs=generated,
                       js=_call("generate"))
        for button, method, what in ((save_ckpt, "downloadCheckpoint", "Checkpoint download"),
                                     (save_weights, "downloadSafetensors", "Weights download"),
                                     (kit, "downloadKit", "Inference kit")):
            button.click(None, js=_call("modelAction", json.dumps(method), json.dumps(what)))
        page.load(lambda: data_status_text(source), outputs=data_status)
    return page
