"""Signaling under attack (issue 13, parts 2-5): real uvicorn on 127.0.0.1, real websockets
clients; every attack is bounded in the test (counts, seconds). Limits: docs/PROTOCOL.md."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from daisy.space.addresses import client_ip, networks, trusted_proxies_from_env
from daisy.space.signaling.config import SignalingConfig
from daisy.space.signaling.hub import SignalingHub
from daisy.space.signaling.routes import make_app
from signal_client import Clients, SignalClient, async_test, serve_in_thread as serve


def hub(**kw) -> SignalingHub:
    base = dict(ping_s=5, grace_s=0.5)
    base.update(kw)
    return SignalingHub(SignalingConfig(**base))


# ---- 3. grouping a client cannot choose ----------------------------------------------------

@async_test
async def test_forwarded_for_is_ignored_from_an_untrusted_peer():
    """The finding: a client sending the victim's public address as X-Forwarded-For joined
    the victim's group. Here 127.0.0.1 is not a trusted proxy: the header counts for nothing."""
    with serve(make_app(hub(trusted_proxies=())), proxy_headers=False) as url:
        async with Clients(url) as c:
            victim = await c.open(xff="203.0.113.7")
            spoof = await c.open(xff="203.0.113.7")
            other = await c.open(xff="198.51.100.9")
            plain = await c.open()
            ids = {p.welcome["group"]["id"] for p in (victim, spoof, other, plain)}
            assert len(ids) == 1  # all of them: the socket's loopback address, one local group


@async_test
async def test_from_a_trusted_proxy_the_rightmost_untrusted_entry_counts():
    with serve(make_app(hub(trusted_proxies=("127.0.0.1", "10.0.0.0/8"))),
               proxy_headers=False) as url:
        async with Clients(url) as c:
            victim = await c.open(xff="203.0.113.7")
            # claims the victim's address; the proxy appended the attacker's real one
            spoof = await c.open(xff="203.0.113.7, 198.51.100.9")
            # two trusted hops (10.x) after the client: skipped, the client's address counts
            chained = await c.open(xff="203.0.113.7, 198.51.100.9, 10.1.2.3")
            local = await c.open(xff="192.168.1.1, 198.51.100.9")
            gid = lambda p: p.welcome["group"]["id"]
            assert gid(spoof) != gid(victim)
            assert gid(chained) == gid(spoof) == gid(local)
            assert [p["id"] for p in victim.welcome["peers"]] == [victim.id]


def test_client_ip_rules():
    class H(dict):
        def getlist(self, k):
            return self.get(k, [])
    lo = networks(("127.0.0.1",))
    assert str(client_ip(H({"x-forwarded-for": ["1.2.3.4"]}), "127.0.0.1", ())) == "127.0.0.1"
    assert str(client_ip(H({"x-forwarded-for": ["1.2.3.4, 5.6.7.8"]}), "127.0.0.1", lo)) == "5.6.7.8"
    # several header lines are one list; garbage stops the walk at the last good address
    assert str(client_ip(H({"x-forwarded-for": ["1.2.3.4", "5.6.7.8"]}), "127.0.0.1", lo)) == "5.6.7.8"
    assert str(client_ip(H({"x-forwarded-for": ["1.2.3.4, junk"]}), "127.0.0.1", lo)) == "127.0.0.1"
    assert str(client_ip(H({}), "127.0.0.1", lo)) == "127.0.0.1"


def test_trusted_proxies_from_env_and_app_settings():
    assert trusted_proxies_from_env({}) == ("127.0.0.0/8", "::1")
    assert "10.0.0.0/8" in trusted_proxies_from_env({"SPACE_ID": "user/space"})
    assert trusted_proxies_from_env({"DAISY_TRUSTED_PROXIES": "none"}) == ()
    assert trusted_proxies_from_env({"DAISY_TRUSTED_PROXIES": "10.0.0.1, fd00::/8"}) == \
        ("10.0.0.1", "fd00::/8")
    with pytest.raises(ValueError, match="DAISY_TRUSTED_PROXIES"):
        trusted_proxies_from_env({"DAISY_TRUSTED_PROXIES": "everyone"})
    import app
    settings = app.uvicorn_settings({})
    assert settings["forwarded_allow_ips"] != "*" and settings["proxy_headers"]
    assert app.uvicorn_settings({"DAISY_TRUSTED_PROXIES": "none"})["proxy_headers"] is False


# ---- 2. signaling that survives stalls and floods --------------------------------------------

def stall_app(h: SignalingHub):
    """The signaling app plus GET /stall?s=N, which blocks the server's event loop N seconds
    (what a slow handler or a GC pause does)."""
    app = make_app(h)

    @app.get("/stall")
    async def stall(s: float) -> dict:
        time.sleep(min(s, 5.0))
        return {"stalled": s}

    return app


@async_test
async def test_honest_peers_survive_an_event_loop_stall():
    """The finding: after a 30 s stall, honest peers at a fifth of the rate limit were closed
    1008, their backlog read as a flood. Here: a 3 s stall, 4 peers at 10 messages/s (limit
    50/s, burst 10): every message arrives, nobody is rate-limited or closed."""
    h = hub(rate_per_s=50, rate_burst=10)
    with serve(stall_app(h)) as url:
        async with Clients(url) as c:
            peers = [await c.open(xff="203.0.113.20") for _ in range(4)]
            for i, p in enumerate(peers):  # drain the join news
                for _ in range(len(peers) - 1 - i):
                    await p.expect("peer-joined")
            port = int(url.rsplit(":", 1)[1])

            async def stall():
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /stall?s=3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                await reader.read()
                writer.close()

            async def talk(p, to):
                for n in range(45):  # 4.5 s at 10/s, the stall in the middle
                    await p.send({"type": "relay", "to": to.id, "data": n})
                    await asyncio.sleep(0.1)

            staller = asyncio.create_task(asyncio.sleep(1))
            staller.add_done_callback(lambda _: asyncio.create_task(stall()))
            await asyncio.gather(*(talk(p, peers[(i + 1) % 4]) for i, p in enumerate(peers)))
            for i, p in enumerate(peers):
                got = [await p.next(timeout=8) for _ in range(45)]
                assert [m.get("data") for m in got] == list(range(45)), got[:3]
                assert p.close_code is None


@async_test
async def test_non_finite_numbers_are_refused_not_relayed():
    with serve(make_app(hub())) as url:
        async with Clients(url) as c:
            a = await c.open(xff="203.0.113.21")
            b = await c.open(xff="203.0.113.21")
            await a.expect("peer-joined")
            for bad in ("NaN", "Infinity", "-Infinity"):
                await a.send(f'{{"type": "relay", "to": "{b.id}", "data": {bad}}}')
                err = await a.expect("error")
                assert err["code"] == "bad-json" and "NaN" in err["message"]
            await b.silent(0.3)
            await a.send({"type": "relay", "to": b.id, "data": 1.5})
            assert (await b.expect("relay"))["data"] == 1.5


@async_test
async def test_group_size_is_capped_with_a_clear_close_code():
    from daisy.space.signaling.messages import CLOSE_GROUP_FULL
    with serve(make_app(hub(max_group=4))) as url:
        async with Clients(url) as c:
            four = [await c.open(xff="203.0.113.22") for _ in range(4)]
            over = await SignalClient.open(url, xff="203.0.113.22", expect_welcome=False)
            code, reason = await over.wait_closed()
            assert code == CLOSE_GROUP_FULL and "group full" in reason and "4" in reason
            await four[3].close()  # its seat is held for the grace period: still full ...
            back = await c.open(xff="203.0.113.22", token=four[3].welcome["token"])
            assert back.welcome["resumed"]  # ... but its own token resumes it


@async_test
async def test_hello_floods_are_coalesced():
    """The finding: 10 sockets sending hello under the rate limit made the server send 675,000
    frames and slowed an unrelated room to seconds. Here: 10 sockets x 40 hellos/s for 1.5 s
    (600 hellos; uncoalesced, 6,000 frames). An observer gets at most one update per sender per
    0.5 s, each sender's last state arrives, and a room elsewhere keeps p99 < 250 ms."""
    with serve(make_app(hub(rate_per_s=50, rate_burst=100, hello_min_s=0.5, max_group=64))) as url:
        async with Clients(url) as c:
            observer = await c.open(xff="203.0.113.23")
            senders = [await c.open(xff="203.0.113.23") for _ in range(10)]
            h1 = await c.open(room="quiet-room-1")
            m1 = await c.open(room="quiet-room-1")
            await h1.expect("join-request")
            await h1.send({"type": "approve", "peer": m1.id})
            await m1.expect("approved")
            await h1.expect("peer-joined")
            for _ in senders:
                await observer.expect("peer-joined")

            async def flood(p, i):
                for n in range(60):
                    await p.send({"type": "hello", "state": f"s{i}-{n}"})
                    await asyncio.sleep(1 / 40)

            async def ping_pong():
                lat = []
                for n in range(30):
                    t0 = time.perf_counter()
                    await h1.send({"type": "relay", "to": m1.id, "data": n})
                    while (await m1.next())["type"] != "relay":
                        pass
                    lat.append(time.perf_counter() - t0)
                    await asyncio.sleep(0.05)
                return lat

            t0 = time.monotonic()
            *_, lat = await asyncio.gather(*(flood(p, i) for i, p in enumerate(senders)),
                                           ping_pong())
            await asyncio.sleep(0.7)  # the last coalesced updates
            elapsed = time.monotonic() - t0
            updates = []
            while not observer.inbox.empty():
                m = observer.inbox.get_nowait()
                if m["type"] == "peer-updated":
                    updates.append(m)
            assert len(updates) <= 10 * (elapsed / 0.5 + 2), len(updates)
            last = {m["peer"]["id"]: m["peer"]["state"] for m in updates}
            assert last == {p.id: f"s{i}-59" for i, p in enumerate(senders)}
            assert sorted(lat)[int(len(lat) * 0.99)] < 0.25, sorted(lat)[-3:]


@async_test
async def test_a_pending_peer_has_one_outstanding_request():
    """The finding: a pending peer sent 232 join requests in 5 s (one per hello)."""
    with serve(make_app(hub())) as url:
        async with Clients(url) as c:
            host = await c.open(room="one-request")
            pending = await c.open(room="one-request", name="asker")
            assert (await host.expect("join-request"))["peer"]["name"] == "asker"
            for n in range(50):
                await pending.send({"type": "hello", "name": f"asker-{n}"})
            await host.silent(0.5)
            await host.send({"type": "approve", "peer": pending.id})
            assert (await host.expect("peer-joined"))["peer"]["name"] == "asker-49"


@async_test
async def test_room_join_attempts_are_rate_limited_the_same_whether_or_not_the_room_exists():
    """The finding: 300 codes/s could be probed. Here: 10 joins a minute per address (burst
    10); the 11th attempt is refused 4429 with the same reason for an existing room and for a
    code nobody uses."""
    from daisy.space.signaling.messages import CLOSE_TOO_MANY_JOINS
    with serve(make_app(hub(join_per_min=10))) as url:
        async with Clients(url) as c:
            await c.open(room="real-room")  # 1 of the burst of 10
            for n in range(9):
                await c.open(room=f"probe-{n}")
            answers = []
            for room in ("real-room", "no-such-room-x"):
                probe = await SignalClient.open(url, room=room, expect_welcome=False)
                answers.append(await probe.wait_closed())
                assert probe.inbox.empty()
            assert answers[0] == answers[1] and answers[0][0] == CLOSE_TOO_MANY_JOINS
            assert "too many room join attempts" in answers[0][1]
            net = await c.open()  # network groups are not room joins
            assert net.welcome["role"] == "member"


@async_test
async def test_create_a_room_gives_an_unguessable_code():
    import httpx
    from daisy.space.signaling.messages import ROOM_CODE
    from daisy.space.signaling.routes import make_room_router
    app = make_app(hub())
    app.include_router(make_room_router())
    with serve(app) as url:
        async with httpx.AsyncClient(base_url=url.replace("ws://", "http://")) as client:
            codes = [(await client.post("/api/room")).json()["room"] for _ in range(20)]
        assert len(set(codes)) == 20
        for code in codes:
            assert ROOM_CODE.fullmatch(code) and len(code) == 24  # 24 base32 chars: 120 bits
        async with Clients(url) as c:
            assert (await c.open(room=codes[0])).welcome["role"] == "host"


# ---- 2. buffered bytes -------------------------------------------------------------------------

@async_test
async def test_total_queued_bytes_are_bounded_and_released():
    """Two peers that stop reading, one sender: the hub never holds more than its total bound,
    the reader that would pass it is dropped (1013), and nothing stays counted afterwards."""
    from websockets.asyncio.client import connect
    h = hub(rate_burst=2000, rate_per_s=2000, outbox_max_bytes=4 << 20,
            total_outbox_max_bytes=1 << 20)
    with serve(make_app(h)) as url:
        async with Clients(url) as c:
            sender = await c.open(xff="203.0.113.24")
            stuck = []
            for _ in range(2):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
                ws = await connect(f"{url}/signal", sock=sock, max_queue=1, compression=None,
                                   additional_headers={"X-Forwarded-For": "203.0.113.24"})
                stuck.append((ws, json.loads(await ws.recv())["peerId"]))
                await sender.expect("peer-joined")
            peak = 0
            blob = "x" * 60000
            for n in range(200):  # 12 MB offered
                await sender.send({"type": "relay", "to": stuck[n % 2][1], "data": blob})
                peak = max(peak, h.shared.queued)
                if n % 10 == 0:
                    await asyncio.sleep(0.01)
            left = await sender.expect("peer-left", timeout=5)
            assert left["peer"] in {sid for _, sid in stuck}
            assert peak <= h.config.total_outbox_max_bytes
            for ws, _ in stuck:
                ws.transport.abort()
            await asyncio.sleep(0.5)
            assert h.shared.queued == 0
            await sender.send({"type": "ping"})
            while (await sender.next())["type"] != "pong":
                pass
