"""The stored run: the latest state of each group's run, kept by the server so that a run
outlives its browsers (docs/ARCHITECTURE.md "The stored run").

    store = GroupRunStore.from_env()            # bounded: groups and total bytes
    app.include_router(make_group_run_router(hub, store))

The run's leader POSTs its replica (the state body, daisy/files/state_codec.py) every N steps and at
the end; a page that is alone in its group asks whether a state is stored and may load it.
Who may read or write a group's run is decided ONLY by the caller's signaling identity: the
`token` of its `/signal` welcome, sent in the X-Daisy-Token header (a header, so no log line
carries it), maps to a seat of the SignalingHub and so to that seat's group. A group named by
the client is never believed: no route takes one.

Routes (docs/PROTOCOL.md "The stored run (HTTP)"):
    POST /api/group-run        state body with Adam's moments -> {stored info}
    GET  /api/group-run/info   {"stored": false} or {"stored": true, step, steps, ...}
    GET  /api/group-run        the state body (404 when the group has none)
Refusals are JSON {"error": message naming the problem}: 401 no or unknown token, 403 a room
member the host has not approved, 400 a bad body, 413 too large, 503 busy.

Memory only: a Space's disk is ephemeral, and a restart ends every run's peers anyway.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from daisy.space.bodies import BodyTooLarge, read_body, refuse
from daisy.space.env import env_number
from daisy.space.signaling import SignalingHub
from daisy.files.state_codec import MAX_STATE_BYTES, StateError, decode_state

TOKEN_HEADER = "X-Daisy-Token"
DEFAULT_MAX_RUNS = 64              # groups with a stored run
DEFAULT_MAX_MB = 256               # all stored bodies together (the largest settings' is ~38 MiB)
DEFAULT_MAX_UPLOADS = 2            # uploads read and checked at once (each up to MAX_STATE_BYTES)


@dataclass(frozen=True)
class StoredRun:
    body: bytes
    step: int
    config: dict
    weight_hash: str
    saved_at: int                  # unix time, ms

    def info(self) -> dict:
        return {"stored": True, "step": self.step, "steps": self.config["steps"],
                "weight_hash": self.weight_hash, "config": dict(self.config),
                "saved_at": self.saved_at, "bytes": len(self.body)}


class GroupRunStore:
    """group key -> its latest StoredRun, at most max_runs of them and max_bytes of bodies
    together; the least recently saved go first."""

    def __init__(self, *, max_runs: int = DEFAULT_MAX_RUNS, max_bytes: int = DEFAULT_MAX_MB << 20):
        if max_runs < 1 or max_bytes < 1:
            raise ValueError("a stored-run store needs room for at least one run and one byte")
        self.max_runs, self.max_bytes = max_runs, max_bytes
        self.runs: OrderedDict[str, StoredRun] = OrderedDict()
        self.bytes = 0

    @classmethod
    def from_env(cls, env=os.environ) -> "GroupRunStore":
        return cls(max_runs=env_number(env, "DAISY_STORED_RUNS", DEFAULT_MAX_RUNS, int),
                   max_bytes=env_number(env, "DAISY_STORED_RUN_MB", DEFAULT_MAX_MB, int) << 20)

    def put(self, key: str, run: StoredRun) -> list[str]:
        """Store `run` as `key`'s latest -> the keys evicted to make room."""
        if len(run.body) > self.max_bytes:
            raise ValueError(f"a {len(run.body):,}-byte state cannot fit a store of {self.max_bytes:,} bytes")
        old = self.runs.pop(key, None)
        if old is not None:
            self.bytes -= len(old.body)
        evicted = []
        while self.runs and (len(self.runs) >= self.max_runs or
                             self.bytes + len(run.body) > self.max_bytes):
            gone, dropped = self.runs.popitem(last=False)
            self.bytes -= len(dropped.body)
            evicted.append(gone)
        self.runs[key] = run
        self.bytes += len(run.body)
        return evicted

    def get(self, key: str) -> StoredRun | None:
        return self.runs.get(key)


def checked_run(body: bytes) -> StoredRun:
    """A state body -> the StoredRun to keep, or StateError naming what is wrong. The body
    must be whole (weights and both Adam moments) and carry its weight hash; decode_state
    recomputes the hash over the weights and refuses a mismatch."""
    state = decode_state(body, need_optim=True, need_hash=True)
    cfg, step = state["config"], state["step"]
    if step > cfg["steps"]:
        raise StateError(f"the state is at step {step}, past the end of its {cfg['steps']}-step run")
    if state["adam_t"] != step:
        raise StateError(f"the state's Adam step count ({state['adam_t']}) differs from its step ({step})")
    return StoredRun(body=bytes(body), step=step, config=cfg, weight_hash=state["weight_hash"],
                     saved_at=int(time.time() * 1000))


def make_group_run_router(hub: SignalingHub, store: GroupRunStore | None = None, *,
                          max_uploads: int = DEFAULT_MAX_UPLOADS) -> APIRouter:
    """The stored-run routes over `hub` (whose seats say who is in which group) and `store`
    (from the environment when None)."""
    router = APIRouter()
    store = store or GroupRunStore.from_env()
    uploading: set[str] = set()                      # groups whose upload is being read now

    def group_of(request: Request) -> str | JSONResponse:
        """The caller's group key, from its signaling token only; or the refusal."""
        token = request.headers.get(TOKEN_HEADER)
        if not token:
            return refuse(401, f"no signaling token: send the token of this page's /signal "
                               f"welcome in the {TOKEN_HEADER} header")
        seat = hub.by_token.get(token)
        if seat is None or seat.released:
            return refuse(401, "unknown or expired signaling token: reconnect to /signal and "
                               "use the new welcome's token")
        if not seat.admitted:
            return refuse(403, "this device waits for the room host's approval: only approved "
                               "members may read or store the room's run")
        return seat.group.key

    def stored_run(request: Request) -> StoredRun | None | JSONResponse:
        """The caller's group's stored run (None when it has none), or the caller's refusal."""
        key = group_of(request)
        return key if isinstance(key, JSONResponse) else store.get(key)

    @router.post("/api/group-run")
    async def upload(request: Request):
        key = group_of(request)
        if isinstance(key, JSONResponse):
            return key
        # refused before the body is read: a crowd of uploads cannot fill memory
        if key in uploading:
            return refuse(409, "another upload of this group's run is in progress: retry",
                          {"Retry-After": "2"})
        if len(uploading) >= max_uploads:
            return refuse(503, "busy, retry: other groups' runs are being stored",
                          {"Retry-After": "5"})
        uploading.add(key)
        try:
            # the largest settings' state, or less when the whole store is smaller
            body = await read_body(request, min(MAX_STATE_BYTES, store.max_bytes))
            run = await run_in_threadpool(checked_run, body)      # hashing ~13 MB at most
            store.put(key, run)
        except BodyTooLarge as e:
            return refuse(413, str(e))
        except StateError as e:
            return refuse(400, str(e))
        finally:
            uploading.discard(key)
        return run.info()

    @router.get("/api/group-run/info")
    async def info(request: Request):
        run = stored_run(request)
        if isinstance(run, JSONResponse):
            return run
        return run.info() if run else {"stored": False}

    @router.get("/api/group-run")
    async def download(request: Request):
        run = stored_run(request)
        if isinstance(run, JSONResponse):
            return run
        if run is None:
            return refuse(404, "no stored run for this group")
        return Response(run.body, media_type="application/octet-stream",
                        headers={"X-Daisy-Weight-Hash": run.weight_hash, "X-Daisy-Step": str(run.step),
                                 "Cache-Control": "no-store"})

    router.store, router.uploading = store, uploading       # for tests and status readouts
    return router
