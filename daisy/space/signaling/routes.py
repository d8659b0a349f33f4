"""The signaling server's routes: the WebSocket /signal over a hub, POST /api/room, and
make_app (an app serving only these: tests, the load benchmark). The Space's app is
daisy.space.server.create_app."""
from __future__ import annotations

import base64
import secrets

from fastapi import APIRouter, FastAPI, WebSocket

from daisy.space.signaling.config import SignalingConfig
from daisy.space.signaling.hub import SignalingHub
from daisy.space.signaling.redaction import install_log_redaction


def make_room_router() -> APIRouter:
    """POST /api/room: a new room code made by the server, 24 characters of base32 (120 bits):
    unguessable, unlike a chosen word (README "Rooms"). Nothing is stored: the first to
    connect with it is its host, and only its creator has it."""
    room_router = APIRouter()

    @room_router.post("/api/room")
    async def new_room() -> dict:
        return {"room": base64.b32encode(secrets.token_bytes(15)).decode().lower()}

    return room_router


def make_signaling_router(hub: SignalingHub) -> APIRouter:
    """The APIRouter with the WebSocket route /signal over `hub`. Its only route: nothing lists
    rooms, codes or peers."""
    signal_router = APIRouter()

    @signal_router.websocket("/signal")
    async def signal(websocket: WebSocket) -> None:
        await hub.serve(websocket)

    return signal_router


def make_app(hub: SignalingHub | None = None) -> FastAPI:
    """A FastAPI app serving only /signal over `hub` (from the environment when None: uvicorn's
    --factory), with the log redaction installed."""
    install_log_redaction()
    app = FastAPI()
    app.include_router(make_signaling_router(hub or SignalingHub(SignalingConfig.from_env())))
    return app
