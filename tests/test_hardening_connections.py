"""Raw connections and the server's logs (issue 13, parts 2 and 5), against uvicorn configured
exactly as `python app.py` configures it (app.uvicorn_settings). Loopback only, bounded counts."""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

import app
from daisy.space.signaling.config import SignalingConfig
from daisy.space.signaling.hub import SignalingHub
from daisy.space.signaling.routes import make_app
from signal_client import Clients, SignalClient, compressed_frames_attack
from test_hardening_signaling import serve

ENV = {"DAISY_TRUSTED_PROXIES": "none", "DAISY_HEADER_TIMEOUT_S": "0.5",
       "DAISY_MAX_CONN_PER_ADDR": "30", "DAISY_MAX_CONN": "1000"}


def signaling_app():
    return make_app(SignalingHub(SignalingConfig(ping_s=5, grace_s=0.5)))


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """The server closes `sock` (EOF or reset) within within_s; an answer before the close (a
    400) is read through, and an answer without a close is not a close."""
    deadline = time.monotonic() + within_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if sock.recv(1024) == b"":
                return True
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def get_ok(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        return s.recv(64).startswith(b"HTTP/1.1 404")


def test_idle_and_half_header_connections_are_closed_and_counted_once(caplog):
    """The finding: connections that send nothing or half a header were never closed (20,000
    of them exhausted file descriptors). Here 25 of each kind, header timeout 0.5 s."""
    with serve(signaling_app(), **app.uvicorn_settings(ENV)) as url:
        port = int(url.rsplit(":", 1)[1])
        with caplog.at_level(logging.WARNING, logger="daisy.space.connguard"):
            socks = []
            for n in range(25):
                socks.append(socket.create_connection(("127.0.0.1", port)))
                half = socket.create_connection(("127.0.0.1", port))
                half.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                socks.append(half)
            t0 = time.monotonic()
            assert all(closed_by_server(s, 3.0) for s in socks)
            assert time.monotonic() - t0 < 3.0
            for s in socks:
                s.close()
            assert get_ok(port)
        lines = [r for r in caplog.records if "completed no request" in r.getMessage()]
        assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]


def test_connections_per_address_are_capped(caplog):
    with serve(signaling_app(), **app.uvicorn_settings({**ENV, "DAISY_HEADER_TIMEOUT_S": "5"})) as url:
        port = int(url.rsplit(":", 1)[1])
        with caplog.at_level(logging.WARNING, logger="daisy.space.connguard"):
            socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
            time.sleep(0.3)
            refused = [s for s in socks[30:] if closed_by_server(s, 1.0)]
            assert len(refused) == 10
            for s in socks:
                s.close()
            time.sleep(0.3)
            assert get_ok(port)   # slots come back when the connections go
        lines = [r for r in caplog.records if "one address" in r.getMessage()]
        assert len(lines) == 1


def test_sockets_per_client_count_the_client_behind_a_trusted_proxy():
    """The finding: 2,048 WebSockets from one client behind a trusted proxy filled the global
    cap (the per-address cap counted the proxy, which is exempt). Here the cap is 16 in all and
    5 per client: one client behind the proxy opens 5, its next 15 are closed 4429 at once, and
    10 other clients behind the same proxy still get in."""
    env = {**ENV, "DAISY_TRUSTED_PROXIES": "127.0.0.1", "DAISY_HEADER_TIMEOUT_S": "5",
           "DAISY_MAX_CONN_PER_ADDR": "5", "DAISY_MAX_CONN": "16"}
    hub = SignalingHub(SignalingConfig.from_env({**env, "DAISY_PING_S": "5"}))

    async def run(url):
        async with Clients(url) as c:
            for _ in range(5):
                await c.open(xff="203.0.113.70")
            for _ in range(15):
                over = await SignalClient.open(url, xff="203.0.113.70", expect_welcome=False)
                code, reason = await over.wait_closed()
                assert code == 4429 and "too many connections from your address" in reason, (code, reason)
            others = [await c.open(xff=f"198.51.100.{i}") for i in range(10)]
            assert all(o.welcome["peerId"] for o in others)
            assert dict(hub.sockets.open) == {"203.0.113.70": 5, **{f"198.51.100.{i}": 1 for i in range(10)}}

    with serve(make_app(hub), **app.uvicorn_settings(env)) as url:
        asyncio.run(asyncio.wait_for(run(url), 30))
    assert not hub.sockets.open, "a closed socket kept its count"


def test_websocket_keeps_its_slot_and_gives_it_back():
    """A long-lived signaling socket is not closed by the header timeout."""
    async def run(url):
        async with SignalClient(await connect(f"{url}/signal"), True) as c:
            await c.expect("welcome")
            await asyncio.sleep(1.2)  # past two header-timeout checks
            await c.send({"type": "ping"})
            assert (await c.expect("pong"))["type"] == "pong"

    with serve(signaling_app(), **app.uvicorn_settings(ENV)) as url:
        asyncio.run(asyncio.wait_for(run(url), 10))


def _vm_hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def test_large_compressed_frames_are_refused_before_they_are_inflated():
    """The finding: 20 sockets x 8 compressed 15 MB frames took RSS to 510 MiB. Here 6 sockets
    x 2 frames of 15 MB that compress to ~15 KB: each socket is closed 1009 and the process
    (server and clients) grows by less than 60 MiB."""
    with serve(signaling_app(), **app.uvicorn_settings(ENV)) as url:
        Path("/proc/self/clear_refs").write_text("5")  # reset the RSS high-water mark
        base = _vm_hwm_kib()
        codes = asyncio.run(asyncio.wait_for(compressed_frames_attack(url), 60))
        grown = (_vm_hwm_kib() - base) / 1024
        assert set(codes) == {1009}, codes
        assert grown < 60, f"RSS grew {grown:.0f} MiB"


def test_tokens_and_room_codes_stay_out_of_the_log():
    """The finding: the access log carried reconnect tokens (enough to take over an identity)."""
    async def run(url):
        first = await SignalClient.open(url, room="secret-room-code")
        token = first.welcome["token"]
        await first.close()
        again = await SignalClient.open(url, room="secret-room-code", token=token)
        await again.close()
        return token

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(self.format(record))

    keep = Keep()
    with serve(make_app(SignalingHub(SignalingConfig(ping_s=5, grace_s=2))),
               **{**app.uvicorn_settings(ENV), "log_level": "info"}) as url:
        loggers = [logging.getLogger(n) for n in ("uvicorn.error", "uvicorn.access")]
        for logger in loggers:  # uvicorn's loggers do not propagate: listen on them directly
            logger.addHandler(keep)
        try:
            token = asyncio.run(asyncio.wait_for(run(url), 10))
        finally:
            for logger in loggers:
                logger.removeHandler(keep)
    text = "\n".join(keep.lines)
    assert "/signal" in text, "uvicorn logged no connection: the test proves nothing"
    assert token not in text and "secret-room-code" not in text


def test_the_global_cap_stays_below_the_open_file_limit():
    import resource
    from daisy.space.connguard import ConnectionGuard
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    guard = ConnectionGuard.from_env({"DAISY_MAX_CONN": "100000000"})
    assert guard.total <= soft - 128 or soft == resource.RLIM_INFINITY
    assert ConnectionGuard.from_env({}).total <= 2048
    with pytest.raises(ValueError, match="DAISY_MAX_CONN_PER_ADDR"):
        ConnectionGuard.from_env({"DAISY_MAX_CONN_PER_ADDR": "many"})
