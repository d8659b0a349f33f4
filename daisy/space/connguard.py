"""Raw TCP connections for uvicorn: a header timeout and connection caps.

uvicorn closes idle keep-alive connections, but not one that never completes a request: a
connection that sends nothing, or half a header, stays open for ever, and a few thousand of them
exhaust file descriptors. `guarded_protocol(base, guard)` wraps uvicorn's HTTP protocol class:

- a connection that has not completed a request within `header_timeout_s`, or that sits between
  requests with a partial one for a whole further interval, is closed;
- at most `per_addr` open connections per peer address (peers that are trusted proxies are
  exempt here: everyone behind them shares their address; the signaling hub counts each client
  behind a proxy, daisy/space/signaling/limits.py ClientSockets) and `total` in all; one over is
  closed at once;
- each condition logs one line per minute (with how many it suppressed), not one per event.

Over HTTPS (`python app.py --https`), `guarded_tls_protocol` does the TLS handshake in front of
the guarded HTTP protocol, so that a connection holds its slot from its accept and its handshake
is bounded by the same header timeout.

A WebSocket keeps its slot until it closes (its own idle rules are the hub's: docs/PROTOCOL.md).
Settings: DAISY_HEADER_TIMEOUT_S, DAISY_MAX_CONN_PER_ADDR, DAISY_MAX_CONN (docs/TROUBLESHOOTING.md);
the global cap never exceeds the open-file limit less 128 (app.py raises the soft limit to the
hard one first).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import resource
import time

from daisy.space.addresses import is_trusted, networks, parse_ip
from daisy.space.env import env_number

log = logging.getLogger("daisy.space.connguard")


class ConnectionGuard:
    def __init__(self, *, per_addr: int = 64, total: int = 2048, header_timeout_s: float = 10.0,
                 trusted=(), log_every_s: float = 60.0):
        self.per_addr, self.total, self.header_timeout_s = per_addr, total, header_timeout_s
        self.trusted = networks(trusted)
        self.log_every_s = log_every_s
        self.open = 0
        self.by_addr: collections.Counter = collections.Counter()
        self.slots: dict = {}  # transport -> its peer address, while it holds a slot
        self._logged: dict[str, tuple[float, int]] = {}  # condition -> (last logged, suppressed)

    @classmethod
    def from_env(cls, env=os.environ, trusted=()) -> "ConnectionGuard":
        # the cap must bite before file descriptors run out (the finding: ~20,000 idle
        # connections exhausted them): keep 128 for files, logs and the sandbox
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        total = env_number(env, "DAISY_MAX_CONN", 2048, int)
        if soft != resource.RLIM_INFINITY:
            total = max(16, min(total, soft - 128))
        return cls(per_addr=env_number(env, "DAISY_MAX_CONN_PER_ADDR", 64, int), total=total,
                   header_timeout_s=env_number(env, "DAISY_HEADER_TIMEOUT_S", 10.0, float), trusted=trusted)

    def admit(self, transport, host: str) -> bool:
        if self.open >= self.total:
            self.note("total", f"connection cap: {self.total} open connections; refusing new ones "
                               "(DAISY_MAX_CONN)")
            return False
        if not is_trusted(parse_ip(host), self.trusted) and self.by_addr[host] >= self.per_addr:
            self.note("per-addr", f"connection cap: {self.per_addr} open connections from one "
                                  "address; refusing more from it (DAISY_MAX_CONN_PER_ADDR)")
            return False
        self.open += 1
        self.by_addr[host] += 1
        self.slots[transport] = host
        return True

    def release(self, transport) -> None:
        """The connection on `transport` closed: its slot comes back (once, whichever protocol,
        HTTP or the WebSocket it was upgraded to, sees the close first)."""
        host = self.slots.pop(transport, None)
        if host is None:
            return
        self.open -= 1
        self.by_addr[host] -= 1
        if self.by_addr[host] <= 0:
            del self.by_addr[host]

    def note(self, condition: str, message: str) -> None:
        """One log line per condition per log_every_s; the rest are counted."""
        now = time.monotonic()
        last, suppressed = self._logged.get(condition, (float("-inf"), 0))
        if now - last >= self.log_every_s:
            extra = f" ({suppressed} more since the last line)" if suppressed else ""
            log.warning("%s%s", message, extra)
            self._logged[condition] = (now, 0)
        else:
            self._logged[condition] = (last, suppressed + 1)


def guarded_protocol(base, guard: ConnectionGuard):
    """A subclass of uvicorn's HTTP protocol class `base` enforcing `guard`."""

    class GuardedHTTPProtocol(base):
        _guard_timer = None
        _guard_seen = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            if not guard.admit(transport, str(peer[0]) if peer else ""):
                transport.abort()
                return
            self._guard_seen = None  # scope None: no request yet
            self._guard_timer = self.loop.call_later(guard.header_timeout_s, self._guard_check)

        def _guard_check(self) -> None:
            self._guard_timer = None
            if self.transport.is_closing():     # closed (an upgraded socket may end here too)
                guard.release(self.transport)
                return
            upgraded = self.transport.get_protocol() is not self
            if upgraded:                        # its WebSocket protocol gives the slot back
                return
            idle = self.cycle is None or self.cycle.response_complete
            if idle and self.scope is self._guard_seen:
                guard.note("header-timeout", f"closed connection(s) that completed no request in "
                                             f"{guard.header_timeout_s:g} s (DAISY_HEADER_TIMEOUT_S)")
                self.transport.close()
                guard.release(self.transport)
                return
            self._guard_seen = self.scope
            self._guard_timer = self.loop.call_later(guard.header_timeout_s, self._guard_check)

        def connection_lost(self, exc) -> None:
            super().connection_lost(exc)
            if self._guard_timer is not None:
                self._guard_timer.cancel()
                self._guard_timer = None
            guard.release(self.transport)

    return GuardedHTTPProtocol


def guarded_ws_protocol(base, guard: ConnectionGuard):
    """A subclass of uvicorn's WebSocket protocol class `base` that gives the connection's slot
    back as soon as the socket closes (once upgraded, the HTTP protocol hears nothing more)."""

    class GuardedWebSocketProtocol(base):
        def connection_lost(self, exc) -> None:
            super().connection_lost(exc)
            guard.release(self.transport)

    return GuardedWebSocketProtocol


def guarded_tls_protocol(http_class, guard: ConnectionGuard, context):
    """TLS (the ssl.SSLContext `context`) in front of `http_class` (a guarded_protocol class),
    done here rather than by uvicorn's own TLS: that one hands a connection to the HTTP protocol
    only once its handshake is done, so a connection that never completes one held no slot
    (100 silent sockets from one address stayed open against a cap of 30, each for asyncio's
    60 s handshake bound). Here a connection takes its slot when accepted, its handshake must
    finish within header_timeout_s, and then the HTTP protocol takes the slot over."""

    class GuardedTLSHandshake(asyncio.Protocol):
        """The connection until the HTTP protocol has it. States: "tcp" (accepted, holding the
        slot), "tls" (start_tls running: once the handshake is done, what the TLS layer delivers
        before the HTTP protocol is connected is held here and handed on), "handed"."""

        def __init__(self, *args, **kwargs):
            self.app = http_class(*args, **kwargs)
            self.state = "tcp"
            self.raw = None           # the TCP transport, while it holds the slot
            self.handshake = None     # the task (a reference, so that it is not collected)
            self.held: list = []      # ("data", bytes) | ("eof", None) | ("lost", exc)

        def connection_made(self, transport) -> None:
            transport.pause_reading()               # not a byte before start_tls takes the socket
            peer = transport.get_extra_info("peername")
            if not guard.admit(transport, str(peer[0]) if peer else ""):
                transport.abort()
                return
            self.raw = transport
            self.handshake = asyncio.get_running_loop().create_task(self._handshake())

        async def _handshake(self) -> None:
            self.state = "tls"
            try:
                tls = await asyncio.get_running_loop().start_tls(
                    self.raw, self, context, server_side=True, ssl_handshake_timeout=guard.header_timeout_s)
            except Exception:                        # too slow, reset, not TLS, a refused certificate
                guard.note("tls-handshake", f"closed connection(s) that completed no TLS handshake in "
                                            f"{guard.header_timeout_s:g} s (DAISY_HEADER_TIMEOUT_S), or "
                                            "whose client refused the certificate")
                self.raw.abort()
                guard.release(self.raw)
                return
            self.state = "handed"
            guard.release(self.raw)                  # the HTTP protocol takes the slot over
            tls.set_protocol(self.app)
            self.app.connection_made(tls)
            for event, value in self.held:           # to the protocol of now: an upgrade may have come
                protocol = tls.get_protocol()
                if event == "data":
                    protocol.data_received(value)
                elif event == "eof":
                    protocol.eof_received()
                else:
                    protocol.connection_lost(value)
            self.held.clear()

        def data_received(self, data) -> None:      # "tls": after the handshake, before the hand-over
            self.held.append(("data", data))

        def eof_received(self) -> None:
            self.held.append(("eof", None))

        def connection_lost(self, exc) -> None:
            if self.state == "tls":                  # lost after the handshake, before the hand-over
                self.held.append(("lost", exc))
            elif self.state == "tcp" and self.raw is not None:
                guard.release(self.raw)              # closed before start_tls took the socket

    return GuardedTLSHandshake
