"""The stored run: the latest state of each group's run, kept by the server so that a run
outlives its browsers (docs/ARCHITECTURE.md "The stored run").

    store = GroupRunStore.from_env()            # bounded: groups and total bytes
    app.include_router(make_group_run_router(hub, store))

Every member of a run reports over its own signaling seat (`vouch`: run id, roster, step, weight
hash) every N steps and at the end; the run's leader POSTs its replica (the state body,
daisy/files/state_codec.py) at those steps. The server hashes the body's weights itself and keeps
the state only when more than half of the roster its reporters named reported that hash for that
step (store_refusal): who uploads does not matter. A page that is alone in its group asks whether
a state is stored and may load it. Which group a request reads or writes is decided ONLY by the
caller's signaling identity: the `token` of its `/signal` welcome, sent in the X-Daisy-Token
header (a header, so no log line carries it), maps to a seat of the SignalingHub and so to that
seat's group. A group named by the client is never believed: no route takes one.

Routes (docs/PROTOCOL.md "The stored run (HTTP)"):
    POST /api/group-run?run=ID&final=0|1   state body with Adam's moments -> {stored info}
    GET  /api/group-run/info   {"stored": false} or {"stored": true, step, steps, run_id, final, vouched_by, roster_size, ...}
    GET  /api/group-run        the state body (404 when the group has none)
Refusals are JSON {"error": message naming the problem}: 401 no or unknown token, 403 a room
member the host has not approved, 400 a bad body or query, 408 a body too slow, 409 a write the
run's rules refuse (store_refusal) or an upload of the group already in progress, 413 too large,
429 an upload from the same address in progress, 503 busy.

Memory only: a Space's disk is ephemeral, and a restart ends every run's peers anyway.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections import OrderedDict
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from daisy.space.bodies import (DEFAULT_PACE, BodyIncomplete, BodyTooLarge, Pace, incomplete_refusal, read_body,
                               refuse)
from daisy.space.env import env_number
from daisy.space.signaling.hub import SignalingHub
from daisy.space.signaling.messages import MAX_RUN_ID
from daisy.files.state_codec import MAX_STATE_BYTES, StateError, decode_state

TOKEN_HEADER = "X-Daisy-Token"
DEFAULT_MAX_RUNS = 64              # groups with a stored run
DEFAULT_MAX_MB = 256               # all stored bodies together (the largest settings' is ~38 MiB)
DEFAULT_UPLOAD_BYTES = 2 * MAX_STATE_BYTES   # bodies being uploaded, all together (bytes received)
VOUCH_WAIT_S = 5.0                 # an upload waits this long at most for its step's reports
VOUCH_POLL_S = 0.05


@dataclass(frozen=True)
class StoredRun:
    body: bytes
    step: int
    config: dict
    weight_hash: str               # computed here over the body's weights (decode_state)
    saved_at: int                  # unix time, ms
    run_id: int                    # the mesh's run id (RUN's runId)
    final: bool                    # its run ended with this state (vouched so)
    vouchers: frozenset            # the peer ids whose reports vouched this state
    roster_size: int               # the devices of the roster they named

    def info(self) -> dict:
        return {"stored": True, "step": self.step, "steps": self.config["steps"],
                "weight_hash": self.weight_hash, "config": dict(self.config),
                "saved_at": self.saved_at, "bytes": len(self.body), "run_id": self.run_id,
                "final": self.final, "vouched_by": len(self.vouchers), "roster_size": self.roster_size}


@dataclass(frozen=True)
class Write:
    """What an upload claims: its run id and whether the run ended with it."""
    run_id: int
    final: bool


UNVOUCHED, OUTVOUCHED, ENDED, BEHIND = "unvouched", "outvouched", "ended", "behind"   # the refusals' kinds


def store_refusal(stored: StoredRun | None, run: StoredRun) -> tuple[str, str] | None:
    """(kind, why) the checked, vouch-counted `run` may not replace `stored` (None: it may). The rules
    (docs/PROTOCOL.md "The stored run (HTTP)"): more than half of the roster its vouchers named
    vouched it; a state vouched by more devices replaces any; one vouched by as many, or by more
    than half of those that vouched the stored one (the same group carrying on with fewer),
    replaces another run, or its own run's earlier step while that run has not ended."""
    k, n = len(run.vouchers), run.roster_size
    if 2 * k <= n:
        return UNVOUCHED, (f"step {run.step} of run {run.run_id} (weights {run.weight_hash[:12]}) is vouched by "
                f"{k} of {n} devices of its roster: more than half of them must report that hash")
    if stored is None or k > len(stored.vouchers):
        return None
    shared = len(run.vouchers & stored.vouchers)
    if k < len(stored.vouchers) and 2 * shared <= len(stored.vouchers):
        return OUTVOUCHED, (f"the group's stored run {stored.run_id} (step {stored.step}) is vouched by "
                f"{len(stored.vouchers)} devices; this state by {k}, {shared} of them among those: it may "
                "replace it only when vouched by as many, or by more than half of the same devices")
    if run.run_id != stored.run_id:
        return None
    if stored.final:
        return ENDED, (f"run {stored.run_id} has ended (its final state is stored at step {stored.step}): "
                "only a new run, or one vouched by more devices, may replace it")
    if not (run.step > stored.step or (run.step == stored.step and run.final)):
        return BEHIND, (f"step {run.step} of run {run.run_id} is not past the stored step {stored.step}: "
                "a run's stored step only grows")
    return None


def parse_write(query) -> Write | str:
    """The upload's query (run=ID&final=0|1) -> its Write, or why it is malformed."""
    run, final = query.get("run", ""), query.get("final", "0")
    if not (run.isdigit() and len(run) <= 10 and 0 < int(run) <= MAX_RUN_ID):
        return f"run= must be the run's id, a whole number in 1..{MAX_RUN_ID}, got {run[:20]!r}"
    if final not in ("0", "1"):
        return f"final= must be 0 or 1, got {final[:20]!r}"
    return Write(run_id=int(run), final=final == "1")


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


def checked_run(body: bytes, write: Write) -> StoredRun:
    """A state body -> the StoredRun it would be (nobody's vouch counted yet), or StateError
    naming what is wrong. The body must be whole (weights and both Adam moments) and carry its
    weight hash; decode_state recomputes the hash over the weights and refuses a mismatch."""
    state = decode_state(body, need_optim=True, need_hash=True)
    cfg, step = state["config"], state["step"]
    if step > cfg["steps"]:
        raise StateError(f"the state is at step {step}, past the end of its {cfg['steps']}-step run")
    if state["adam_t"] != step:
        raise StateError(f"the state's Adam step count ({state['adam_t']}) differs from its step ({step})")
    return StoredRun(body=bytes(body), step=step, config=cfg, weight_hash=state["weight_hash"],
                     saved_at=int(time.time() * 1000), run_id=write.run_id, final=write.final,
                     vouchers=frozenset(), roster_size=0)


class UploadBusy(Exception):
    """The bodies being uploaded hold the whole byte budget: retry."""


class UploadGate:
    """The uploads being read and checked now: one per group, one per client address, and
    max_bytes of bodies together, counted as they arrive (a header's claim reserves nothing,
    so an upload trickling in holds only what it sent)."""

    def __init__(self, max_bytes: int = DEFAULT_UPLOAD_BYTES):
        self.max_bytes = max_bytes
        self.groups: set[str] = set()
        self.addresses: set[str] = set()
        self.held = 0                                # bytes received by the uploads in progress

    def refusal(self, group: str, address: str) -> JSONResponse | None:
        if group in self.groups:
            return refuse(409, "another upload of this group's run is in progress: retry",
                          {"Retry-After": "2"})
        if address in self.addresses:
            return refuse(429, "another upload from your address is in progress: retry",
                          {"Retry-After": "2"})
        return None

    @contextlib.contextmanager
    def slot(self, group: str, address: str):
        """Holds the group's and the address's slot; yields take(n), which counts n more bytes
        received (UploadBusy over the budget). Everything is given back on exit."""
        taken = 0

        def take(n: int) -> None:
            nonlocal taken
            if self.held + n > self.max_bytes:
                raise UploadBusy("busy, retry: other groups' runs are being stored")
            self.held += n
            taken += n

        self.groups.add(group)
        self.addresses.add(address)
        try:
            yield take
        finally:
            self.held -= taken
            self.groups.discard(group)
            self.addresses.discard(address)


def make_group_run_router(hub: SignalingHub, store: GroupRunStore | None = None, *,
                          gate: UploadGate | None = None, pace: Pace = DEFAULT_PACE,
                          vouch_wait_s: float = VOUCH_WAIT_S) -> APIRouter:
    """The stored-run routes over `hub` (whose seats say who is in which group and what each
    reported) and `store` (from the environment when None); uploads pass `gate`, are read at
    `pace` and wait up to vouch_wait_s for their vouchers' reports."""
    router = APIRouter()
    store = store or GroupRunStore.from_env()
    gate = gate or UploadGate()

    def seat_of(request: Request):
        """The caller's seat, from its signaling token only; or the refusal."""
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
        return seat

    def stored_run(request: Request) -> StoredRun | None | JSONResponse:
        """The caller's group's stored run (None when it has none), or the caller's refusal."""
        seat = seat_of(request)
        return seat if isinstance(seat, JSONResponse) else store.get(seat.group.key)

    async def vouched(key: str, run: StoredRun) -> StoredRun:
        """`run` with the vouchers of its (run, step, hash) counted now; members' reports of the
        step the upload is for may come just after it: wait for a majority up to vouch_wait_s."""
        deadline = time.monotonic() + vouch_wait_s
        while True:
            ids, size = hub.vouchers(key, run.run_id, run.step, run.weight_hash, run.final)
            if 2 * len(ids) > size or time.monotonic() >= deadline:
                return dataclasses.replace(run, vouchers=ids, roster_size=size)
            await asyncio.sleep(VOUCH_POLL_S)

    @router.post("/api/group-run")
    async def upload(request: Request):
        seat = seat_of(request)
        if isinstance(seat, JSONResponse):
            return seat
        key = seat.group.key
        write = parse_write(request.query_params)
        if isinstance(write, str):
            return refuse(400, write)
        address = hub.address_of(request)
        if (no := gate.refusal(key, address)) is not None:
            return no
        with gate.slot(key, address) as take:
            try:
                # the largest settings' state, or less when the whole store is smaller
                body = await read_body(request, min(MAX_STATE_BYTES, store.max_bytes), pace, take)
                run = await run_in_threadpool(checked_run, body, write)      # hashing ~13 MB at most
            except BodyTooLarge as e:
                return refuse(413, str(e))
            except BodyIncomplete as e:
                return incomplete_refusal(e)
            except UploadBusy as e:
                return refuse(503, str(e), {"Retry-After": "5", "Connection": "close"})
            except StateError as e:
                return refuse(400, str(e))
            # who uploads does not matter: what the group's members reported for this state does
            run = await vouched(key, run)
            if (no := store_refusal(store.get(key), run)) is not None:
                kind, why = no
                return JSONResponse({"error": why, "refusal": kind}, status_code=409)
            store.put(key, run)
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
                                 "X-Daisy-Run-Id": str(run.run_id), "X-Daisy-Vouched-By": str(len(run.vouchers)),
                                 "X-Daisy-Roster-Size": str(run.roster_size), "Cache-Control": "no-store"})

    return router
