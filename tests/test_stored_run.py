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
from daisy.space.group_run import TOKEN_HEADER, GroupRunStore, StoredRun, UploadGate, make_group_run_router, store_refusal
from daisy.hashing import weight_hash
from daisy.model import param_count, param_shapes
from daisy.space.signaling.config import SignalingConfig
from daisy.space.signaling.hub import SignalingHub
from daisy.space.signaling.routes import make_signaling_router
from daisy.files.state_codec import MAX_STATE_BYTES, decode_state, encode_state
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


def hash_of(body: bytes) -> str:
    return decode_state(body, need_optim=False)["weight_hash"]


@contextlib.contextmanager
def stored_run_app(store: GroupRunStore | None = None, gate: UploadGate | None = None, *,
                   config: SignalingConfig | None = None, **options):
    """/signal and the stored-run routes over one hub, served by uvicorn -> (ws base, http base,
    store, gate); options go to make_group_run_router (an upload waits 1 s for its vouchers)."""
    hub = SignalingHub(config or SignalingConfig(grace_s=0.5))
    store, gate = store or GroupRunStore(), gate or UploadGate()
    options = {"vouch_wait_s": 1.0, **options}
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


async def vouch(client, body: bytes, run: int = 1, roster=None, final: bool = False, step: int | None = None) -> None:
    """`client` reports over its seat that its replica of run `run` holds `body`'s weights at
    `body`'s step (roster: the run's peer ids, default `client` alone)."""
    step = decode_state(body, need_optim=False)["step"] if step is None else step
    await client.send({"type": "vouch", "run": run, "step": step, "hash": hash_of(body), "final": final,
                       "roster": [c if isinstance(c, str) else c.id for c in (roster or [client])]})


async def vouched_store(http, client, body, run: int = 1, final: int = 0, xff: str | None = None):
    """A run of one: `client` vouches for `body`, then stores it."""
    await vouch(client, body, run, final=bool(final))
    return await store_run(http, client, body, run, final, xff)


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
        for member in (leader, other):
            await vouch(member, body, run=7, roster=[leader, other])
        r = await store_run(http, leader, body, run=7)
        assert r.status_code == 200, r.text
        info = (await http.get("/api/group-run/info", headers=auth(other))).json()
        assert info["stored"] and info["step"] == 40 and info["steps"] == 100, info
        assert (info["run_id"], info["final"], info["vouched_by"], info["roster_size"]) == (7, False, 2, 2), info
        assert info["config"] == TINY.to_dict() and info["bytes"] == len(body) and info["saved_at"] > 0, info
        got = await http.get("/api/group-run", headers=auth(other))
        assert got.status_code == 200 and got.headers["x-daisy-step"] == "40", got.headers
        assert got.headers["x-daisy-weight-hash"] == info["weight_hash"] == r.json()["weight_hash"]
        assert (got.headers["x-daisy-run-id"], got.headers["x-daisy-vouched-by"], got.headers["x-daisy-roster-size"]) \
            == ("7", "2", "2")
        same_body(got.content, body)

        # the run's next vouched upload replaces it, whoever sends it: the latest state per group
        later = tiny_body(50, seed=2)
        for member in (leader, other):
            await vouch(member, later, run=7, roster=[leader, other])
        assert (await store_run(http, other, later, run=7)).status_code == 200
        same_body((await http.get("/api/group-run", headers=auth(other))).content, later)


@async_test
async def test_an_upload_of_a_state_from_outside_the_group_is_refused(server):
    ws, base, _, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
        member = await c.open(xff=NET_B, name="member")
        mine = tiny_body(30)
        stored = await vouched_store(http, member, mine)
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
        await vouch(guest, outsider)
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
        assert (await vouched_store(http, member, good)).status_code == 200
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
                                 run_id=1, final=False, vouchers=frozenset("a"), roster_size=1)
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
                assert (await vouched_store(http, client, body)).status_code == 200
            assert (await http.get("/api/group-run/info", headers=auth(first))).json() == {"stored": False}
            for client in (second, third):
                assert (await http.get("/api/group-run/info", headers=auth(client))).json()["stored"]
            assert len(store.runs) == 2 and store.bytes == 2 * len(body)
            # a body larger than the whole store is refused unread
            refused(await store_run(http, first, b"\0" * (4 * len(body) + 1)), 413, "over the limit")



def test_the_store_rules_as_a_table():
    """store_refusal, every case of docs/PROTOCOL.md "The stored run (HTTP)": vouched by a
    majority of its roster; more vouchers replace any; as many, or more than half of the same
    devices, replace another run or a later step of the same unended run."""
    def run(run_id, step, vouchers, size, final=False):
        return StoredRun(body=b"", step=step, config={"steps": 100}, weight_hash="ab" * 32, saved_at=0,
                         run_id=run_id, final=final, vouchers=frozenset(vouchers), roster_size=size)
    stored = run(7, 20, "ABC", 3)
    ended = run(7, 20, "ABC", 3, final=True)
    kinds = {"vouched by 1 of": "unvouched", "vouched by 0 of": "unvouched", "vouched by 3 devices": "outvouched",
             "only grows": "behind", "has ended": "ended"}
    cases = [  # stored, the upload -> refusal words (None: accepted)
        (None, run(7, 1, "A", 1), None),                         # a run of one, vouched by one
        (None, run(7, 1, "A", 2), "vouched by 1 of 2"),          # half is not more than half
        (None, run(7, 1, "", 0), "vouched by 0 of 0"),           # nobody reported that hash
        (None, run(7, 1, "AB", 3), None),
        (stored, run(7, 21, "ABC", 3), None),
        (stored, run(7, 21, "AB", 2), None),                     # C left: 2 of the 3 carry on
        (stored, run(7, 21, "AB", 3), None),
        (stored, run(7, 21, "A", 1), "vouched by 3 devices"),    # one member alone: never
        (stored, run(8, 1, "D", 1), "vouched by 3 devices"),     # nor its own run
        (stored, run(8, 1, "DE", 2), "vouched by 3 devices"),
        (stored, run(8, 1, "DEF", 3), None),                     # another run vouched by as many
        (stored, run(8, 1, "AB", 2), None),                      # the group's own later run, fewer
        (stored, run(7, 20, "ABC", 3), "only grows"),
        (stored, run(7, 19, "ABC", 3), "only grows"),
        (stored, run(7, 20, "ABC", 3, final=True), None),        # the same step, now final
        (stored, run(7, 5, "ABCD", 4), None),                    # vouched by more: replaces any
        (ended, run(7, 30, "ABC", 3), "has ended"),
        (ended, run(7, 20, "ABC", 3, final=True), "has ended"),  # final is set once
        (ended, run(8, 1, "ABC", 3), None),
        (run(7, 90, "L", 1, final=True), run(7, 25, "AB", 3), None),   # a lone liar's "end" is outvoted
    ]
    for old, new, words in cases:
        no = store_refusal(old, new)
        why = no and no[1]
        assert (why is None) if words is None else (why is not None and words in why), \
            (old and (old.run_id, old.step, sorted(old.vouchers), old.final), new.run_id, new.step,
             sorted(new.vouchers), new.roster_size, new.final, why)
        assert no is None or no[0] == next(k for w, k in kinds.items() if w in why), no


@async_test
async def test_a_member_can_neither_pre_empt_nor_block_nor_end_the_groups_stored_run(server):
    """Issue 27's finding 2, over real uvicorn: a member of a three-device run stores a poisoned
    state under the run's id before the leader's first store, then "ends" it. Refused as the
    run's (vouched by 1 of 3); as a run of its own (roster: itself) it is stored, vouched by 1,
    and the group's majority-vouched state replaces it and is never replaced by it again."""
    ws, base, _, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
        p0, p1, liar = [await c.open(xff="203.0.113.41", name=n) for n in ("p0", "p1", "liar")]
        group = [p0, p1, liar]
        info = lambda: http.get("/api/group-run/info", headers=auth(p1))  # noqa: E731
        poison = tiny_body(10, seed=66)
        await vouch(liar, poison, run=7, roster=group)
        refused(await store_run(http, liar, poison, run=7), 409, "vouched by 1 of 3 devices")
        assert (await info()).json() == {"stored": False}
        # its own run of one, under the group's run id: stored, and says so
        await vouch(liar, poison, run=7, roster=[liar])
        assert (await store_run(http, liar, poison, run=7)).status_code == 200
        assert (await info()).json()["vouched_by"] == 1
        # the group's state at step 25, vouched by the two honest members: stored, uploaded by anyone
        good = tiny_body(25, seed=1)
        for member in (p0, p1):
            await vouch(member, good, run=7, roster=group)
        assert (await store_run(http, liar, good, run=7)).status_code == 200
        got = (await info()).json()
        assert (got["step"], got["weight_hash"], got["vouched_by"], got["roster_size"]) == (25, hash_of(good), 2, 3), got
        # the liar can no longer replace it, end it, nor start a run of its own over it
        for run_id, final, step in ((7, 0, 30), (7, 1, 30), (8, 0, 1), (8, 1, 1)):
            body = tiny_body(step, seed=66)
            await vouch(liar, body, run=run_id, roster=[liar], final=bool(final))
            r = await store_run(http, liar, body, run=run_id, final=final)
            refused(r, 409, "vouched by 2 devices")
            assert r.json()["refusal"] == "outvouched", r.json()
        # nor make it unvouched by saying another hash: its own word alone changes
        await vouch(liar, tiny_body(50, seed=66), run=7, roster=group)
        later = tiny_body(50, seed=2)
        for member in (p0, p1):
            await vouch(member, later, run=7, roster=group)
        assert (await store_run(http, p1, later, run=7)).status_code == 200
        # the group ends its run; the next run of the group (fewer devices, the same ones) replaces it
        end = tiny_body(60, seed=2)
        for member in (p0, p1):
            await vouch(member, end, run=7, roster=group, final=True)
        assert (await store_run(http, p0, end, run=7, final=1)).status_code == 200
        refused(await store_run(http, p0, end, run=7), 409, "has ended")
        next_run = tiny_body(5, seed=4)
        for member in (p0, p1):
            await vouch(member, next_run, run=8, roster=[p0, p1])
        assert (await store_run(http, p0, next_run, run=8)).status_code == 200
        got = (await info()).json()
        assert (got["run_id"], got["step"], got["vouched_by"], got["roster_size"], got["final"]) == (8, 5, 2, 2, False), got


@async_test
async def test_only_seats_of_the_group_vouch_each_once_over_its_own_seat(server):
    """A report counts for its own seat only, within its own group, and for the roster it
    names: another group's members, a report naming another roster, or the same member saying
    it twice add nothing; ids in a roster that never report only raise the bar."""
    ws, base, _, _ = server
    async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
        a, b = [await c.open(xff="203.0.113.42", name=n) for n in ("a", "b")]
        elsewhere = await c.open(xff="203.0.113.43", name="elsewhere")
        body = tiny_body(10, seed=8)
        ghosts = ["0123456789abcdef", "fedcba9876543210"]
        await vouch(a, body, roster=[a, *ghosts])               # a roster of seats nobody holds
        await vouch(a, body, roster=[a, *ghosts])               # twice: still a's one word
        await vouch(elsewhere, body, roster=[a, elsewhere])     # not in a's group
        refused(await store_run(http, a, body), 409, "vouched by 1 of 3 devices")
        await vouch(b, body, roster=[a, b])                     # another roster: counts apart
        refused(await store_run(http, b, body), 409, "vouched by 1 of 2 devices")
        await vouch(b, body, roster=[a, ghosts[0], b])          # a named another roster
        refused(await store_run(http, b, body), 409, "of 3 devices")
        await vouch(a, body, roster=[a, b])                     # each one's latest word counts
        await vouch(b, body, roster=[a, b])
        assert (await store_run(http, b, body)).status_code == 200
        got = (await http.get("/api/group-run/info", headers=auth(a))).json()
        assert (got["vouched_by"], got["roster_size"]) == (2, 2), got


@async_test
async def test_vouch_reports_are_checked_bounded_and_rate_limited():
    config = SignalingConfig(grace_s=0.5, vouch_per_s=5, vouch_burst=3, vouch_keep=4)
    with stored_run_app(config=config) as (ws, base, _, _):
        async with Clients(ws) as c, httpx.AsyncClient(base_url=base, timeout=30) as http:
            host = await c.open(room="vouch-a", name="host")
            pending = await c.open(room="vouch-a", name="pending")
            await host.expect("join-request")
            good = {"type": "vouch", "run": 1, "step": 3, "hash": "ab" * 32, "final": False, "roster": [host.id]}
            await pending.send({**good, "roster": [pending.id], "ref": 1})
            assert (await pending.expect("error"))["code"] == "not-admitted"
            bad = {"run": 0, "step": -1, "hash": "AB" * 32, "final": 1, "roster": [],
                   "extra": None}
            for field, value in bad.items():
                if field == "extra":
                    value = [host.id, host.id]
                    field = "roster"
                await host.send({**good, field: value, "ref": field})
                err = await host.expect("error")
                assert err["code"] == "bad-message" and f'"{field}"' in err["message"], err
            await host.send({**good, "roster": ["0123456789abcdef"]})
            assert "must include you" in (await host.expect("error"))["message"]
            # 3 at once, then 5 a second: the 4th at once is refused and not kept
            for step in range(4):
                await host.send({**good, "step": step, "ref": step})
            err = await host.expect("error")
            assert (err["code"], err["ref"]) == ("rate-limited", 3), err
            await host.silent(0.2)
            # each seat keeps its latest vouch_keep reports: the oldest goes
            await asyncio.sleep(0.7)
            body = tiny_body(1, seed=5)
            await vouch(host, body)
            for step in range(2, 6):
                await asyncio.sleep(0.25)
                await host.send({**good, "step": step})
            refused(await store_run(http, host, body), 409, "vouched by 0 of 0")
            await vouch(host, body)
            assert (await store_run(http, host, body)).status_code == 200


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
            assert (await vouched_store(http, victim, body, xff="203.0.113.60")).status_code == 200
            refused(await store_run(http, neighbour, body, xff=addresses[0]), 429, "another upload from your address")
            for status, closed in await asyncio.gather(*trickles):
                assert status.startswith("HTTP/1.1 408") and closed, (status, closed)
            assert gate.held == 0 and not gate.groups and not gate.addresses
            assert (await vouched_store(http, neighbour, body, xff=addresses[0])).status_code == 200


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
            await vouch(first, body)
            release.set()
            assert (await held).status_code == 200
            assert (await vouched_store(http, other_group, body, xff=NET_B)).status_code == 200
            assert gate.held == 0 and not gate.groups
