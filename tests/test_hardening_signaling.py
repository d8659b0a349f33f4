"""Signaling under attack (issue 13, parts 2-5): real uvicorn on 127.0.0.1, real websockets
clients; every attack is bounded in the test (counts, seconds). Limits: docs/PROTOCOL.md."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
import time

import pytest
import uvicorn

from daisy.signaling import (SignalingConfig, SignalingHub, client_ip, make_app,
                             trusted_proxies_from_env, _networks)
from signal_client import SignalClient


@contextlib.contextmanager
def serve(app, **options):
    """Like signal_client.serve_in_thread, with uvicorn options (e.g. proxy_headers=False, so
    only the hub decides whom to believe)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=2, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def async_test(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 30))
    return run


class Clients(contextlib.AsyncExitStack):
    def __init__(self, base: str):
        super().__init__()
        self.base = base

    async def open(self, **kw) -> SignalClient:
        return await self.enter_async_context(await SignalClient.open(self.base, **kw))


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
    lo = _networks(("127.0.0.1",))
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
