"""Test helpers for signaling: serve an ASGI app with real uvicorn on a free loopback port in a
background thread, and a small real-websockets client that answers the server's pings."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import threading
import time
from urllib.parse import urlencode

import uvicorn
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

WAIT_S = 3.0  # bound on every wait for a message that must come


def async_test(fn, timeout_s: float = 30):
    """Run an async test function to completion, bounded by timeout_s."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), timeout_s))
    return run


class Clients(contextlib.AsyncExitStack):
    """Opens clients on one base URL and closes them all at the end of the test."""

    def __init__(self, base: str):
        super().__init__()
        self.base = base

    async def open(self, **kw) -> "SignalClient":
        return await self.enter_async_context(await SignalClient.open(self.base, **kw))


@contextlib.contextmanager
def serve_in_thread(app, **options):
    """Yield the ws:// base URL of `app` served by uvicorn on 127.0.0.1 (port picked by the OS);
    `options` go to uvicorn.Config (e.g. proxy_headers=False: only the hub decides whom to believe)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options = {"log_level": "warning", **options}
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", timeout_graceful_shutdown=2, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.01)
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class SignalClient:
    """One signaling connection. Messages other than `ping` queue up for next()/expect();
    with auto_pong (the default) pings are answered and never queued."""

    def __init__(self, ws, auto_pong: bool):
        self.ws, self.auto_pong = ws, auto_pong
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.close_code: int | None = None
        self.close_reason = ""
        self.closed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())
        self.welcome: dict = {}

    @classmethod
    async def open(cls, base: str, *, room=None, token=None, name=None, xff=None,
                   auto_pong=True, expect_welcome=True) -> "SignalClient":
        params = {k: v for k, v in (("room", room), ("token", token), ("name", name)) if v is not None}
        url = f"{base}/signal" + (f"?{urlencode(params)}" if params else "")
        headers = {"X-Forwarded-For": xff} if xff else None
        ws = await connect(url, additional_headers=headers, open_timeout=WAIT_S, max_size=2**22)
        client = cls(ws, auto_pong)
        if expect_welcome:
            client.welcome = await client.expect("welcome")
        return client

    @property
    def id(self) -> str:
        return self.welcome["peerId"]

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                msg = json.loads(raw)
                if msg.get("type") == "ping" and self.auto_pong:
                    await self.ws.send(json.dumps({"type": "pong"}))
                else:
                    self.inbox.put_nowait(msg)
        except ConnectionClosed:
            pass
        finally:
            if self.ws.close_code is not None:
                self.close_code, self.close_reason = self.ws.close_code, self.ws.close_reason
            self.closed.set()

    async def send(self, message) -> None:
        await self.ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))

    async def next(self, timeout: float = WAIT_S) -> dict:
        try:
            return await asyncio.wait_for(self.inbox.get(), timeout)
        except TimeoutError:
            raise AssertionError(f"no message within {timeout} s (close code {self.close_code})")

    async def expect(self, kind: str, timeout: float = WAIT_S) -> dict:
        msg = await self.next(timeout)
        assert msg.get("type") == kind, f"expected {kind!r}, got {msg}"
        return msg

    async def silent(self, duration: float = 0.3) -> None:
        """Assert that nothing (pings aside) arrives for `duration` seconds."""
        try:
            msg = await asyncio.wait_for(self.inbox.get(), duration)
        except TimeoutError:
            return
        raise AssertionError(f"expected silence, got {msg}")

    async def wait_closed(self, timeout: float = WAIT_S) -> tuple[int | None, str]:
        try:
            await asyncio.wait_for(self.closed.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"socket still open after {timeout} s")
        return self.close_code, self.close_reason

    async def close(self) -> None:
        """Drop the socket without `leave` (the server keeps the seat for the grace period)."""
        await self.ws.close()
        await self.closed.wait()
        self._reader.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


async def compressed_frames_attack(url: str, sockets: int = 6, frames: int = 2) -> list:
    """The finding of issue 13: `sockets` WebSockets to URL/signal (ws://...) each send `frames`
    relay frames of 15 MB that deflate to ~15 KB -> each socket's close code, or the name of
    what ended it otherwise (a server that inflates them all may never close)."""
    frame = '{"type": "relay", "to": "x", "data": "' + "x" * (15 << 20) + '"}'

    async def one():
        try:
            async with connect(f"{url}/signal", max_size=2**22) as ws:
                await ws.recv()
                for _ in range(frames):
                    await ws.send(frame)
                await asyncio.wait_for(ws.wait_closed(), 15)
                return ws.close_code
        except Exception as e:  # noqa: BLE001  (ConnectionClosed carries the code it got)
            return getattr(getattr(e, "rcvd", None), "code", type(e).__name__)
    return await asyncio.gather(*(one() for _ in range(sockets)))
