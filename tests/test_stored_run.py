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
from daisy.space.bodies import Pace
from daisy.space.group_run import (TOKEN_HEADER, GroupRunStore, StoredRun, UploadGate, Write, make_group_run_router,
                                   write_refusal)
from daisy.hashing import weight_hash
from daisy.model import param_count, param_shapes
from daisy.space.signaling.config import SignalingConfig
from daisy.space.signaling.hub import SignalingHub
from daisy.space.signaling.routes import make_signaling_router
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
def stored_run_app(store: GroupRunStore | None = None, gate: UploadGate | None = None, **options):
    """/signal and the stored-run routes over one hub, served by uvicorn -> (ws base, http base,
    store, gate); options go to make_group_run_router."""
    hub = SignalingHub(SignalingConfig(grace_s=0.5))
    store, gate = store or GroupRunStore(), gate or UploadGate()
    app = FastAPI()
    app.include_router(make_signaling_router(hub))
    app.include_router(make_group_run_router(hub, store, gate=gate, **options))
    with serve_in_thread(app, proxy_headers=False) as ws_base:
        yield ws_base, ws_base.replace("ws://", "http://"), store, gate


@pytest.fixture(scope="module")
def server():
    with stored_run_app() as s:
        yield s


def auth(client) -> dict:
    return {TOKEN_HEADER: client.welcome["token"]}


def store_run(http, client, body, run: int = 1, final: int = 0, xff: str | None = None):
    """POST /api/group-run as `client`, for run `run` (from address `xff`: the hub believes
    X-Forwarded-For from loopback)."""
    return http.post(f"/api/group-run?run={run}&final={final}", content=body,
                     headers={**auth(client), **({"X-Forwarded-For": xff} if xff else {})})


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
    ws, base, _, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
        leader = await c.open(xff=NET_A, name="leader")
        other = await c.open(xff=NET_A, name="other")
        assert (await http.get("/api/group-run/info", headers=auth(other))).json() == {"stored": False}
        refused(await http.get("/api/group-run", headers=auth(other)), 404, "no stored run for this group")

        body = tiny_body(40)
        r = await store_run(http, leader, body, run=7)
        assert r.status_code == 200, r.text
        info = (await http.get("/api/group-run/info", headers=auth(other))).json()
        assert info["stored"] and info["step"] == 40 and info["steps"] == 100, info
        assert (info["run_id"], info["writer"], info["final"]) == (7, leader.id, False), info
        assert info["config"] == TINY.to_dict() and info["bytes"] == len(body) and info["saved_at"] > 0, info
        got = await http.get("/api/group-run", headers=auth(other))
        assert got.status_code == 200 and got.headers["x-daisy-step"] == "40", got.headers
        assert got.headers["x-daisy-weight-hash"] == info["weight_hash"] == r.json()["weight_hash"]
        assert (got.headers["x-daisy-run-id"], got.headers["x-daisy-writer"]) == ("7", leader.id)
        same_body(got.content, body)

        # the run's next upload replaces it: the latest state per group
        later = tiny_body(50, seed=2)
        assert (await store_run(http, leader, later, run=7)).status_code == 200
        same_body((await http.get("/api/group-run", headers=auth(other))).content, later)


@async_test
async def test_an_upload_of_a_state_from_outside_the_group_is_refused(server):
    ws, base, _, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
        member = await c.open(xff=NET_B, name="member")
        mine = tiny_body(30)
        stored = await store_run(http, member, mine)
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
        named = await http.post("/api/group-run?run=1&final=0&room=&group=net:local", content=outsider,
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
    ws, base, _, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=60) as http:
        member = await c.open(xff="192.0.2.77", name="member")
        good = tiny_body(20)
        assert (await store_run(http, member, good)).status_code == 200
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
            refused(await store_run(http, member, body), 400, words)
        refused(await store_run(http, member, b"\0" * (MAX_STATE_BYTES + 1)), 413, "over the limit")
        same_body((await http.get("/api/group-run", headers=auth(member))).content, good)


def test_the_store_keeps_the_latest_runs_within_its_count_and_bytes():
    body = tiny_body(10)
    run = lambda step: StoredRun(body=body, step=step, config=TINY.to_dict(), weight_hash="h", saved_at=0,  # noqa: E731
                                 run_id=1, writer="w", final=False)
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
    with stored_run_app(GroupRunStore(max_runs=2, max_bytes=4 * len(body))) as (ws, base, store, _):
        async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
            first, second, third = [await c.open(xff=f"203.0.113.{i}") for i in (1, 2, 3)]
            for client in (first, second, third):
                assert (await store_run(http, client, body)).status_code == 200
            assert (await http.get("/api/group-run/info", headers=auth(first))).json() == {"stored": False}
            for client in (second, third):
                assert (await http.get("/api/group-run/info", headers=auth(client))).json()["stored"]
            assert len(store.runs) == 2 and store.bytes == 2 * len(body)
            # a body larger than the whole store is refused unread
            refused(await store_run(http, first, b"\0" * (4 * len(body) + 1)), 413, "over the limit")



def test_the_write_rules_as_a_table():
    """write_refusal, every case of docs/PROTOCOL.md "The stored run (HTTP)"."""
    run = StoredRun(body=b"", step=20, config={"steps": 100}, weight_hash="h", saved_at=0,
                    run_id=7, writer="A", final=False)
    ended = StoredRun(**{**run.__dict__, "final": True})
    cases = [  # stored, (run id, writer, final), step, writer present -> refusal words (None: accepted)
        (None, (7, "B", False), 1, True, None),
        (run, (7, "A", False), 21, True, None),
        (run, (7, "A", False), 20, True, "only grows"),
        (run, (7, "A", False), 19, True, "only grows"),
        (run, (7, "A", True), 20, True, None),                  # the same step, now final
        (run, (7, "A", False), None, True, None),               # before the body: the step is not known
        (run, (7, "B", False), 21, True, "still in the group"),
        (run, (7, "B", False), 21, False, None),                # its writer left
        (run, (7, "B", False), 20, False, "only grows"),
        (run, (8, "B", False), 1, True, "has not ended"),
        (run, (8, "B", False), 1, False, None),
        (run, (8, "A", False), 1, True, None),                  # its own writer's next run
        (ended, (7, "A", False), 30, True, "has ended"),
        (ended, (7, "A", True), 20, True, "has ended"),         # final is set once
        (ended, (8, "B", False), 1, True, None),
    ]
    for stored, (run_id, writer, final), step, present, words in cases:
        why = write_refusal(stored, Write(run_id, writer, final), step, present)
        assert (why is None) if words is None else (why is not None and words in why), \
            (stored and (stored.run_id, stored.writer, stored.final), run_id, writer, final, step, present, why)


@async_test
async def test_only_the_runs_writer_stores_it_until_it_ends_or_its_writer_leaves(server):
    ws, base, _, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
        a, b, third = [await c.open(xff="203.0.113.40", name=n) for n in ("a", "b", "c")]
        info = lambda: http.get("/api/group-run/info", headers=auth(b))  # noqa: E731
        assert (await store_run(http, a, tiny_body(10), run=7)).status_code == 200
        refused(await store_run(http, b, tiny_body(20), run=7), 409, f"stored by {a.id}, which is still in the group")
        refused(await store_run(http, b, tiny_body(5), run=8), 409, "has not ended")
        refused(await store_run(http, a, tiny_body(10), run=7), 409, "only grows")
        for query in ("", "?run=0", "?run=abc", "?run=4294967296", "?run=7&final=2"):
            refused(await http.post(f"/api/group-run{query}", content=tiny_body(30), headers=auth(a)), 400, "=")
        assert (await store_run(http, a, tiny_body(20), run=7, final=1)).status_code == 200
        assert (await info()).json()["final"] is True
        refused(await store_run(http, a, tiny_body(30), run=7), 409, "has ended")
        # a new run replaces an ended one; then its writer leaves and another member carries it on
        assert (await store_run(http, b, tiny_body(5), run=8)).status_code == 200
        refused(await store_run(http, third, tiny_body(6), run=8), 409, "still in the group")
        await b.close()
        await third.expect("peer-left")
        assert (await store_run(http, third, tiny_body(6), run=8)).status_code == 200
        got = (await http.get("/api/group-run/info", headers=auth(a))).json()
        assert (got["run_id"], got["writer"], got["step"], got["final"]) == (8, third.id, 6, False), got


async def trickle(port: int, token: str, xff: str, total: int, every_s: float):
    """A raw upload that declares `total` bytes and sends one byte every every_s until the server
    answers -> (the status line of its answer, whether it then closed the connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /api/group-run?run=1&final=0 HTTP/1.1\r\nHost: x\r\n{TOKEN_HEADER}: {token}\r\n"
                 f"X-Forwarded-For: {xff}\r\nContent-Length: {total}\r\n\r\n".encode())
    answer = asyncio.create_task(reader.read(1 << 16))
    try:
        for _ in range(total):
            writer.write(b"\0")
            done, _ = await asyncio.wait({answer}, timeout=every_s)
            if done:
                break
        head = await asyncio.wait_for(answer, 10)
        try:
            await asyncio.wait_for(reader.read(), 10)     # the rest of the answer, up to the close
            closed = True
        except ConnectionResetError:          # a byte of ours crossed the close: closed too
            closed = True
        except TimeoutError:
            closed = False
        return head.split(b"\r\n", 1)[0].decode(), closed
    finally:
        writer.close()


@async_test
async def test_slow_uploads_from_other_groups_do_not_keep_a_group_from_storing():
    """The finding: two uploads at 1 byte/s from two other groups held both upload slots, and
    the victim group's leader got "busy" at every store. Here the two trickle (declaring a
    whole body's size) while the victim stores; each is closed 408 once it falls behind the
    pace, and a second upload from a trickler's address is refused (429)."""
    body = tiny_body(10)
    pace = Pace(grace_s=1.0, min_bytes_per_s=1000)
    with stored_run_app(gate=UploadGate(max_bytes=3 * len(body)), pace=pace) as (ws, base, store, gate):
        port = int(base.rsplit(":", 1)[1])
        async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
            addresses = ["198.51.100.61", "198.51.100.62"]
            slow = [await c.open(xff=a) for a in addresses]
            victim, neighbour = await c.open(xff="203.0.113.60"), await c.open(xff=addresses[0], room="r61")
            trickles = [asyncio.create_task(trickle(port, s.welcome["token"], a, len(body), 0.4))
                        for s, a in zip(slow, addresses)]
            for _ in range(300):                  # until the server is reading both
                if len(gate.groups) == 2:
                    break
                await asyncio.sleep(0.01)
            assert len(gate.groups) == 2 and gate.held < 100, (gate.groups, gate.held)
            assert (await store_run(http, victim, body, xff="203.0.113.60")).status_code == 200
            refused(await store_run(http, neighbour, body, xff=addresses[0]), 429, "another upload from your address")
            for status, closed in await asyncio.gather(*trickles):
                assert status.startswith("HTTP/1.1 408") and closed, (status, closed)
            assert gate.held == 0 and not gate.groups and not gate.addresses
            assert (await store_run(http, neighbour, body, xff=addresses[0])).status_code == 200


@async_test
async def test_uploads_hold_slots_and_bytes_received_not_bytes_declared():
    """One upload per group and per address; the bodies in progress together hold at most the
    gate's bytes, counted as they arrive: over it, 503 "busy, retry"."""
    body = tiny_body(10)
    with stored_run_app(gate=UploadGate(max_bytes=len(body) + 50)) as (ws, base, store, gate):
        async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
            first, same_group = await c.open(xff=NET_A), await c.open(xff=NET_A)
            other_group = await c.open(xff=NET_B)
            release = asyncio.Event()

            async def held_body():
                yield body[:100]
                await release.wait()
                yield body[100:]
            held = asyncio.create_task(http.post("/api/group-run?run=1", content=held_body(), headers={
                **auth(first), "Content-Length": str(len(body)), "X-Forwarded-For": NET_A}))
            for _ in range(300):                  # until the server holds the first 100 bytes
                if gate.held == 100:
                    break
                await asyncio.sleep(0.01)
            assert gate.held == 100, gate.held
            refused(await store_run(http, same_group, body, xff=NET_A), 409,
                    "another upload of this group's run is in progress")
            busy = await store_run(http, other_group, body, xff=NET_B)
            refused(busy, 503, "busy, retry")
            assert busy.headers["retry-after"] == "5"
            release.set()
            assert (await held).status_code == 200
            assert (await store_run(http, other_group, body, xff=NET_B)).status_code == 200
            assert gate.held == 0 and not gate.groups
