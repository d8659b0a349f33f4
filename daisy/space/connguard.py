"""Raw TCP connections for uvicorn: a header timeout and connection caps.

uvicorn closes idle keep-alive connections, but not one that never completes a request: a
connection that sends nothing, or half a header, stays open for ever, and a few thousand of them
exhaust file descriptors. `guarded_protocol(base, guard)` wraps uvicorn's HTTP protocol class:

- a connection that has not completed a request within `header_timeout_s`, or that sits between
  requests with a partial one for a whole further interval, is closed;
- at most `per_addr` open connections per peer address (peers that are trusted proxies are
  exempt: everyone behind them shares their address) and `total` in all; one over is closed at
  once;
- each condition logs one line per minute (with how many it suppressed), not one per event.

A WebSocket keeps its slot until it closes (its own idle rules are the hub's: docs/PROTOCOL.md).
Settings: DAISY_HEADER_TIMEOUT_S, DAISY_MAX_CONN_PER_ADDR, DAISY_MAX_CONN (docs/TROUBLESHOOTING.md);
the global cap never exceeds the open-file limit less 128 (app.py raises the soft limit to the
hard one first).
"""
from __future__ import annotations

import collections
import ipaddress
import logging
import os
import resource
import time

from daisy.space.env import env_number

log = logging.getLogger("daisy.space.connguard")


class ConnectionGuard:
    def __init__(self, *, per_addr: int = 64, total: int = 2048, header_timeout_s: float = 10.0,
                 trusted=(), log_every_s: float = 60.0):
        self.per_addr, self.total, self.header_timeout_s = per_addr, total, header_timeout_s
        self.trusted = tuple(ipaddress.ip_network(t, strict=False) for t in trusted)
        self.log_every_s = log_every_s
        self.open = 0
        self.by_addr: collections.Counter = collections.Counter()
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

    def _is_proxy(self, host: str) -> bool:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(ip.version == n.version and ip in n for n in self.trusted)

    def admit(self, host: str) -> bool:
        if self.open >= self.total:
            self.note("total", f"connection cap: {self.total} open connections; refusing new ones "
                               "(DAISY_MAX_CONN)")
            return False
        if not self._is_proxy(host) and self.by_addr[host] >= self.per_addr:
            self.note("per-addr", f"connection cap: {self.per_addr} open connections from one "
                                  "address; refusing more from it (DAISY_MAX_CONN_PER_ADDR)")
            return False
        self.open += 1
        self.by_addr[host] += 1
        return True

    def release(self, host: str) -> None:
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
        _guard_host = None
        _guard_timer = None
        _guard_seen = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            host = str(peer[0]) if peer else ""
            if not guard.admit(host):
                transport.abort()
                return
            self._guard_host = host
            self._guard_seen = None  # scope None: no request yet
            self._guard_timer = self.loop.call_later(guard.header_timeout_s, self._guard_check)

        def _guard_check(self) -> None:
            self._guard_timer = None
            if self.transport.is_closing():     # closed (an upgraded socket ends here too)
                self._guard_release()
                return
            upgraded = self.transport.get_protocol() is not self
            idle = self.cycle is None or self.cycle.response_complete
            if not upgraded and idle and self.scope is self._guard_seen:
                guard.note("header-timeout", f"closed connection(s) that completed no request in "
                                             f"{guard.header_timeout_s:g} s (DAISY_HEADER_TIMEOUT_S)")
                self.transport.close()
                self._guard_release()
                return
            self._guard_seen = self.scope
            self._guard_timer = self.loop.call_later(guard.header_timeout_s, self._guard_check)

        def _guard_release(self) -> None:
            if self._guard_timer is not None:
                self._guard_timer.cancel()
                self._guard_timer = None
            if self._guard_host is not None:
                guard.release(self._guard_host)
                self._guard_host = None

        def connection_lost(self, exc) -> None:
            super().connection_lost(exc)
            self._guard_release()

    return GuardedHTTPProtocol
