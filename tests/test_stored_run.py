"""The stored run's routes (daisy/space/group_run.py) over real uvicorn and real signaling clients:
who may store and read a group's run (decided by the signaling token alone), what bodies are
refused, and the store's bounds. The pages' side (upload while training, resume after every page
closed) is tests/test_stored_run_pages.py."""
from __future__ import annotations

import asyncio
import contextlib

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from daisy.config import Config
from daisy.space.group_run import TOKEN_HEADER, GroupRunStore, StoredRun, make_group_run_router
from daisy.hashing import weight_hash
from daisy.model import param_count, param_shapes
from daisy.space.signaling import SignalingConfig, SignalingHub, make_signaling_router
from daisy.files.state_codec import MAX_STATE_BYTES, encode_state
from tests.bits import assert_same_bits
from tests.signal_client import Clients, async_test, serve_in_thread

TINY = Config(width=16, seq_len=16, batch=2, layers=1, heads=4, steps=100, seed=3)
NET_A, NET_B = "203.0.113.10", "198.51.100.20"        # two public addresses: two network groups


def tiny_body(step: int, seed: int = 1, **overrides) -> bytes:
    """A whole state body of the tiny config at `step` (Adam's t = step), hash included."""
    rng = np.random.default_rng(seed)
    shapes = param_shapes(TINY)
    params, m, v = ({n: rng.standard_normal(s) for n, s in shapes.items()} for _ in range(3))
    fields = dict(config=TINY, step=step, params=params, adam_m=m, adam_v={n: np.abs(a) for n, a in v.items()},
                  adam_t=step, weight_hash=weight_hash(params), extra={"data": "builtin"})
    return encode_state(**{**fields, **overrides})


@contextlib.contextmanager
def stored_run_app(store: GroupRunStore | None = None, **options):
    """/signal and the stored-run routes over one hub, served by uvicorn -> (ws base, http base,
    router); options go to make_group_run_router."""
    hub = SignalingHub(SignalingConfig())
    router = make_group_run_router(hub, store or GroupRunStore(), **options)
    app = FastAPI()
    app.include_router(make_signaling_router(hub))
    app.include_router(router)
    with serve_in_thread(app, proxy_headers=False) as ws_base:
        yield ws_base, ws_base.replace("ws://", "http://"), router


@pytest.fixture(scope="module")
def server():
    with stored_run_app() as s:
        yield s


def auth(client) -> dict:
    return {TOKEN_HEADER: client.welcome["token"]}


async def approved_member(c: Clients, host, room: str, name: str):
    guest = await c.open(room=room, name=name)
    assert (await host.expect("join-request"))["peer"]["id"] == guest.id
    await host.send({"type": "approve", "peer": guest.id})
    await guest.expect("approved")
    await host.expect("peer-joined")
    return guest


def refused(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status and words in r.json()["error"], (r.status_code, r.text[:300])


def same_body(got: bytes, want: bytes) -> None:
    assert_same_bits(np.frombuffer(got, np.uint8), np.frombuffer(want, np.uint8), "stored body")


@async_test
async def test_a_member_stores_the_run_and_every_member_of_the_group_reads_it(server):
    ws, base, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
        leader = await c.open(xff=NET_A, name="leader")
        other = await c.open(xff=NET_A, name="other")
        assert (await http.get("/api/group-run/info", headers=auth(other))).json() == {"stored": False}
        refused(await http.get("/api/group-run", headers=auth(other)), 404, "no stored run for this group")

        body = tiny_body(40)
        r = await http.post("/api/group-run", content=body, headers=auth(leader))
        assert r.status_code == 200, r.text
        info = (await http.get("/api/group-run/info", headers=auth(other))).json()
        assert info["stored"] and info["step"] == 40 and info["steps"] == 100, info
        assert info["config"] == TINY.to_dict() and info["bytes"] == len(body) and info["saved_at"] > 0, info
        got = await http.get("/api/group-run", headers=auth(other))
        assert got.status_code == 200 and got.headers["x-daisy-step"] == "40", got.headers
        assert got.headers["x-daisy-weight-hash"] == info["weight_hash"] == r.json()["weight_hash"]
        same_body(got.content, body)

        # the next upload replaces it: the latest state per group
        later = tiny_body(50, seed=2)
        assert (await http.post("/api/group-run", content=later, headers=auth(other))).status_code == 200
        same_body((await http.get("/api/group-run", headers=auth(leader))).content, later)


@async_test
async def test_an_upload_of_a_state_from_outside_the_group_is_refused(server):
    ws, base, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
        member = await c.open(xff=NET_B, name="member")
        mine = tiny_body(30)
        stored = await http.post("/api/group-run", content=mine, headers=auth(member))
        assert stored.status_code == 200, stored.text
        host = await c.open(room="stored-a", xff=NET_B, name="host")
        guest = await approved_member(c, host, "stored-a", "guest")
        pending = await c.open(room="stored-a", xff=NET_B, name="pending")
        await host.expect("join-request")
        outsider = tiny_body(60, seed=9)

        # no token, a made-up token, a pending room member: refused, before the body is read
        refused(await http.post("/api/group-run", content=outsider), 401, "no signaling token")
        refused(await http.get("/api/group-run/info"), 401, "no signaling token")
        refused(await http.post("/api/group-run", content=outsider, headers={TOKEN_HEADER: "x" * 32}),
                401, "unknown or expired signaling token")
        for method, route in (("POST", "/api/group-run"), ("GET", "/api/group-run/info"), ("GET", "/api/group-run")):
            refused(await http.request(method, route, content=outsider if method == "POST" else None,
                                       headers=auth(pending)), 403, "waits for the room host's approval")
        # a rejected device's token is dead at once
        await host.send({"type": "reject", "peer": pending.id})
        await pending.expect("rejected")
        refused(await http.post("/api/group-run", content=outsider, headers=auth(pending)),
                401, "unknown or expired signaling token")

        # a room member stores into its room, whatever group the request names; the network
        # group's run is untouched, and each group reads only its own
        named = await http.post("/api/group-run?room=&group=net:local", content=outsider,
                                headers={**auth(guest), "X-Daisy-Group": "network"})
        assert named.status_code == 200, named.text
        net = (await http.get("/api/group-run/info", headers=auth(member))).json()
        assert net["step"] == 30 and net["weight_hash"] == stored.json()["weight_hash"], net
        same_body((await http.get("/api/group-run", headers=auth(member))).content, mine)
        same_body((await http.get("/api/group-run", headers=auth(host))).content, outsider)
        elsewhere = await c.open(room="stored-b", xff=NET_B, name="elsewhere")
        assert (await http.get("/api/group-run/info", headers=auth(elsewhere))).json() == {"stored": False}
        other_net = await c.open(xff="192.0.2.55", name="other-network")
        assert (await http.get("/api/group-run/info", headers=auth(other_net))).json() == {"stored": False}


@async_test
async def test_bad_bodies_are_refused_by_name_and_the_stored_run_stays(server):
    ws, base, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=60) as http:
        member = await c.open(xff="192.0.2.77", name="member")
        good = tiny_body(20)
        assert (await http.post("/api/group-run", content=good, headers=auth(member))).status_code == 200
        tampered = bytearray(good)
        tampered[-8 * 3 * param_count(TINY) + 3] ^= 1   # a weight's bit
        rng = np.random.default_rng(1)
        bad = {
            "weight hash mismatch": bytes(tampered),
            "carries no weight_hash": tiny_body(20, weight_hash=None),
            "needs the optimizer state": encode_state(config=TINY, step=20, params={
                n: rng.standard_normal(s) for n, s in param_shapes(TINY).items()}),
            "past the end of its 100-step run": tiny_body(101, adam_t=101),
            "Adam step count (7) differs from its step (20)": tiny_body(20, adam_t=7),
            "the state body holds": good[:-8],
            "shorter than its 8-byte header length": b"\x01\x02",
        }
        for words, body in bad.items():
            refused(await http.post("/api/group-run", content=body, headers=auth(member)), 400, words)
        refused(await http.post("/api/group-run", content=b"\0" * (MAX_STATE_BYTES + 1), headers=auth(member)),
                413, "over the limit")
        same_body((await http.get("/api/group-run", headers=auth(member))).content, good)


def test_the_store_keeps_the_latest_runs_within_its_count_and_bytes():
    body = tiny_body(10)
    run = lambda step: StoredRun(body=body, step=step, config=TINY.to_dict(), weight_hash="h", saved_at=0)  # noqa: E731
    store = GroupRunStore(max_runs=2, max_bytes=10 * len(body))
    assert store.put("a", run(1)) == [] and store.put("b", run(1)) == []
    assert store.put("a", run(2)) == []                     # a replacement is not a new group
    assert store.put("c", run(1)) == ["b"]                  # the least recently saved goes
    assert sorted(store.runs) == ["a", "c"] and store.bytes == 2 * len(body) and store.get("a").step == 2
    by_bytes = GroupRunStore(max_runs=100, max_bytes=2 * len(body) + 10)
    by_bytes.put("a", run(1))
    by_bytes.put("b", run(1))
    assert by_bytes.put("c", run(1)) == ["a"] and by_bytes.bytes == 2 * len(body)
    with pytest.raises(ValueError, match="cannot fit"):
        GroupRunStore(max_runs=1, max_bytes=len(body) - 1).put("a", run(1))
    env = GroupRunStore.from_env({"DAISY_STORED_RUNS": "3", "DAISY_STORED_RUN_MB": "5"})
    assert (env.max_runs, env.max_bytes) == (3, 5 << 20)
    for name, raw in (("DAISY_STORED_RUNS", "0"), ("DAISY_STORED_RUN_MB", "lots")):
        with pytest.raises(ValueError, match=name):
            GroupRunStore.from_env({name: raw})


@async_test
async def test_over_the_stores_bounds_the_oldest_group_is_evicted():
    body = tiny_body(10)
    with stored_run_app(GroupRunStore(max_runs=2, max_bytes=4 * len(body))) as (ws, base, router):
        store = router.store
        async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
            first, second, third = [await c.open(xff=f"203.0.113.{i}") for i in (1, 2, 3)]
            for client in (first, second, third):
                assert (await http.post("/api/group-run", content=body, headers=auth(client))).status_code == 200
            assert (await http.get("/api/group-run/info", headers=auth(first))).json() == {"stored": False}
            for client in (second, third):
                assert (await http.get("/api/group-run/info", headers=auth(client))).json()["stored"]
            assert len(store.runs) == 2 and store.bytes == 2 * len(body)
            # a body larger than the whole store is refused unread
            refused(await http.post("/api/group-run", content=b"\0" * (4 * len(body) + 1), headers=auth(first)),
                    413, "over the limit")


@async_test
async def test_uploads_take_a_slot_before_their_body_is_read():
    """One upload per group and max_uploads in all: the next is refused at once (409 / 503),
    so a crowd of slow uploads cannot hold more than that many bodies in memory."""
    body = tiny_body(10)
    with stored_run_app(max_uploads=1) as (ws, base, router):
        async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
            first, same_group = await c.open(xff=NET_A), await c.open(xff=NET_A)
            other_group = await c.open(xff=NET_B)
            release = asyncio.Event()

            async def slow_body():
                yield body[:100]
                await release.wait()
                yield body[100:]
            held = asyncio.create_task(http.post("/api/group-run", content=slow_body(), headers=auth(first)))
            for _ in range(300):                  # until the server is reading the held upload
                if router.uploading:
                    break
                await asyncio.sleep(0.01)
            assert router.uploading, "the first upload never started"
            refused(await http.post("/api/group-run", content=body, headers=auth(same_group)),
                    409, "another upload of this group's run is in progress")
            busy = await http.post("/api/group-run", content=body, headers=auth(other_group))
            refused(busy, 503, "busy, retry")
            assert busy.headers["retry-after"] == "5"
            release.set()
            assert (await held).status_code == 200
            assert (await http.post("/api/group-run", content=body, headers=auth(other_group))).status_code == 200
            assert not router.uploading
