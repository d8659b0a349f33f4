"""The model routes: the page POSTs its replica (a state body) to turn it into a file, or a .pt
to get its state back.

    make_model_router(sandbox=None) -> APIRouter      mounted by daisy.space.server.create_app

    POST /api/checkpoint.pt       state body -> the .pt (needs the optimizer state)
    POST /api/model.safetensors   state body -> model.safetensors (weights + metadata)
    POST /api/kit.html            state body -> the offline inference kit (daisy/files/kit.py)
    POST /api/load                a .pt's bytes -> its state body (parsed in daisy.space.sandbox)

The server sees weights only when a user asks (docs/ARCHITECTURE.md "Checkpoint routes") and
keeps nothing. Replicas travel in one compact binary form, the *state body*
(daisy/files/state_codec.py: format, encode_state, decode_state).
Refusals are 4xx JSON {"error": message naming the problem}; 413 when a body is over its limit;
503 "busy, retry" (with Retry-After) when /api/load has no free parse slot (daisy.space.sandbox).
"""
from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from daisy.files.checkpoint import DEFAULT_MAX_BYTES, CheckpointError, load_checkpoint, save_checkpoint, save_safetensors
from daisy.files.kit import KitError, render_kit
from daisy.files.state_codec import MAX_STATE_BYTES, StateError, decode_state, encode_state
from daisy.space.bodies import (BodyIncomplete as _BodyIncomplete, BodyTooLarge as _BodyTooLarge,
                                incomplete_refusal as _incomplete_refusal, read_body as _read_body, refuse as _refuse)
from daisy.space.sandbox import ParseBusy, ParseSandbox
from daisy.tokenizer import TOKENIZER_ID

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
        except _BodyIncomplete as e:
            return _incomplete_refusal(e)
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
