"""Rate limits of the signaling server (docs/PROTOCOL.md "Limits and configuration"): the loop
clock that tells a stall's backlog from a flood, each socket's token bucket, room joins per
address (with the cool-down after a rejection), and open sockets per client. Accounting only:
the hub decides what a verdict does to a socket."""
from __future__ import annotations

import asyncio
import collections
import time


class LoopClock:
    """Notices event-loop stalls. After a stall, frames that honest peers sent during it
    arrive all at once; the rate limiter must not mistake that backlog for a flood. A tick every
    `interval`; a stall is a tick late by more than STALL_S, and it is visible while its backlog
    drains: before the late tick runs (readers may run first) and for DRAIN_S after."""
    STALL_S = 0.25
    DRAIN_S = 1.0

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.tick = time.monotonic()
        self.recent, self.recent_key, self.recent_at = 0.0, 0.0, float("-inf")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            lag = now - self.tick - self.interval
            if lag > self.STALL_S:
                self.recent, self.recent_key, self.recent_at = lag, self.tick, now
            self.tick = now

    def stall(self, now: float) -> tuple[float, float]:
        """(seconds of the stall whose backlog may be draining now, an id for that stall)."""
        current = now - self.tick - self.interval
        if current > self.STALL_S:
            return current, self.tick
        if now - self.recent_at < self.DRAIN_S:
            return self.recent, self.recent_key
        return 0.0, 0.0


# TokenBucket verdicts
ADMIT = "admit"
DROP = "drop"        # dropped; the sender was already told in this run of drops
WARN = "warn"        # dropped, the first of a run: tell the sender (`rate-limited`)
CLOSE = "close"      # the overdraft passed a full burst: close the socket


class TokenBucket:
    """One socket's message budget. An empty bucket drops the message (one WARN per run of
    drops: a run ends only once the overdraft has drained, so a sender hovering at the limit
    is not told again for every refilled token); an overdraft beyond a full burst is CLOSE.
    A backlog from the server's own stall is admitted: what the sender could have sent at the
    full rate while the loop was stalled (docs/PROTOCOL.md "Limits")."""

    def __init__(self, rate_per_s: float, burst: float, clock: LoopClock):
        self.rate_per_s, self.burst, self.clock = rate_per_s, burst, clock
        self.tokens = burst
        self.t = time.monotonic()
        self.overdraft = 0.0  # rejected messages, draining at rate_per_s
        self.limited = False  # inside a run of rejected messages (one WARN per run)
        self.stall_key = 0.0  # the stall whose backlog allowance this socket is using
        self.stall_credit = 0.0

    def admit(self, now: float) -> str:
        refill = (now - self.t) * self.rate_per_s
        self.t = now
        self.tokens = min(self.burst, self.tokens + refill)
        self.overdraft = max(0.0, self.overdraft - refill)
        if self.tokens >= 1:
            self.tokens -= 1
            if self.overdraft == 0.0:
                self.limited = False
            return ADMIT
        stall, key = self.clock.stall(now)
        if stall > 0:
            if key != self.stall_key:
                self.stall_key, self.stall_credit = key, stall * self.rate_per_s
            if self.stall_credit >= 1:
                self.stall_credit -= 1
                return ADMIT
        self.overdraft += 1
        if self.overdraft > self.burst:
            return CLOSE
        if not self.limited:
            self.limited = True
            return WARN
        return DROP


class ReportRate:
    """One seat's `vouch` reports: `rate_per_s` sustained, `burst` at once; a report over it is
    refused (the sender is told; nothing is kept). Pages report every ?storeEvery steps (25 by
    default) and at a run's end: a few a second at the fastest settings."""

    def __init__(self, rate_per_s: float, burst: float):
        self.rate_per_s, self.burst = rate_per_s, burst
        self.tokens, self.t = burst, time.monotonic()

    def admit(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate_per_s)
        self.t = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class JoinLimiter:
    """New room identities per address: a token bucket of join_per_min a minute (a minute's
    worth of burst, so a classroom behind one address can join at once), and a cool-down per
    (address, room) after the room's host rejected that address."""
    MAX_ENTRIES = 10000  # beyond it, forget what no longer limits anyone

    def __init__(self, join_per_min: float, reject_cooldown_s: float):
        self.join_per_min, self.reject_cooldown_s = join_per_min, reject_cooldown_s
        self.buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, time)
        self.cooldowns: dict[tuple[str, str], float] = {}  # (address, room) -> until

    def refusal(self, addr: str, room_key: str, now: float) -> str | None:
        """None, or why a new room identity from this address is refused now. The same answer
        whether or not the room exists: the hub asks before it looks the room up."""
        until = self.cooldowns.get((addr, room_key))
        if until is not None:
            if now < until:
                return f"rejected here recently: wait {until - now:.0f} s before asking again"
            del self.cooldowns[(addr, room_key)]
        rate, burst = self.join_per_min / 60, max(1.0, self.join_per_min)
        tokens, then = self.buckets.get(addr, (burst, now))
        tokens = min(burst, tokens + (now - then) * rate)
        if tokens < 1:
            self.buckets[addr] = (tokens, now)
            return (f"too many room join attempts from your address "
                    f"(over {self.join_per_min:g} a minute): wait and retry")
        self.buckets[addr] = (tokens - 1, now)
        if len(self.buckets) > self.MAX_ENTRIES:  # forget addresses whose bucket is full
            for k in [k for k, (t, at) in self.buckets.items() if t + (now - at) * rate >= burst]:
                del self.buckets[k]
        return None

    def rejected(self, addr: str, room_key: str, now: float) -> None:
        """The room's host rejected `addr`: no reconnect-and-ask loop from it for a while."""
        self.cooldowns[(addr, room_key)] = now + self.reject_cooldown_s
        if len(self.cooldowns) > self.MAX_ENTRIES:
            self.cooldowns = {k: t for k, t in self.cooldowns.items() if t > now}


class ClientSockets:
    """Open sockets per client address (address_key). Behind a trusted proxy each client counts
    on its own: the raw connection guard (daisy/space/connguard.py) sees only the proxy."""

    def __init__(self, per_client: int):
        self.per_client = per_client
        self.open: collections.Counter = collections.Counter()

    def admit(self, client: str) -> bool:
        if self.open[client] >= self.per_client:
            return False
        self.open[client] += 1
        return True

    def release(self, client: str) -> None:
        self.open[client] -= 1
        if self.open[client] <= 0:
            del self.open[client]
