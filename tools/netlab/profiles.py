"""Emulated links, pure: what a page's link is (`Link`), the named profiles of the bench and the
tests, and the one rule that decides when a packet leaves a link direction (`LinkDirection.admit`).
The router (router.py) applies the rule; nothing here touches the system.

A page's link has two directions: `up` (page -> the rest) and `down` (the rest -> page). A packet
from page A to page B crosses A's up direction and then B's down direction; a packet between a
page and the app crosses only that page's link (the app's side is unlimited). So a profile's RTT
is the page <-> app round trip, and two pages behind `home` see 2 x 40 ms between them, as two
homes on the internet would.
"""
from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class Direction:
    """One direction of a link: rate (bit/s, 0 = unlimited), one-way delay and jitter (s), loss
    probability per packet, and the queue a packet may wait in before it is dropped (s of
    sending time at the rate; the bottleneck's buffer)."""
    rate_bps: float = 0.0
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    queue_s: float = 0.1

    def __post_init__(self):
        if self.rate_bps < 0 or self.delay_s < 0 or self.jitter_s < 0 or self.queue_s <= 0:
            raise ValueError(f"a link direction needs rate, delay, jitter >= 0 and queue > 0: {self}")
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss is a probability in [0, 1): {self.loss}")


@dataclasses.dataclass(frozen=True)
class Link:
    """A page's access link: upload and download directions."""
    up: Direction
    down: Direction

    @staticmethod
    def symmetric_delay(up_mbps: float, down_mbps: float, rtt_ms: float, loss: float = 0.0,
                        jitter_ms: float = 0.0) -> "Link":
        """A link by its profile numbers: rates in Mbit/s, the page <-> app round trip in ms
        (half of it each way), the loss per packet in each direction."""
        d = dict(delay_s=rtt_ms / 2000, jitter_s=jitter_ms / 1000, loss=loss)
        return Link(up=Direction(rate_bps=up_mbps * 1e6, **d), down=Direction(rate_bps=down_mbps * 1e6, **d))


# The profiles of issue 21 (docs/ARCHITECTURE.md "Network lab"): lan 1 Gbit/s, 1 ms round
# trip; home 20 up / 100 down, 40 ms, 0.5 % loss; far 10 up / 50 down, 120 ms, 1 % loss.
PROFILES = {
    "lan": Link.symmetric_delay(1000, 1000, 1.0),
    "home": Link.symmetric_delay(20, 100, 40.0, loss=0.005),
    "far": Link.symmetric_delay(10, 50, 120.0, loss=0.01),
}


def profile(name: str) -> Link:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown network profile {name!r}; known: {', '.join(PROFILES)}") from None


class LinkDirection:
    """The state of one direction as packets cross it: a FIFO at `rate` (a packet leaves when
    the ones before it have been sent), tail drop when the wait would exceed the queue, a loss
    draw, then the delay plus jitter. Jitter never reorders: a packet is delivered no earlier
    than the one before it (reordering would be a different impairment, and one that real
    access links rarely add)."""

    def __init__(self, spec: Direction, rng: random.Random):
        self.spec = spec
        self.rng = rng
        self.free_at = 0.0            # when the line finishes sending what is queued
        self.last_delivery = 0.0
        self.sent = self.queue_drops = self.lost = 0

    def admit(self, now: float, size: int) -> float | None:
        """A packet of `size` bytes arrives at `now` -> when it reaches the far end, or None
        when it is dropped (queue full or lost)."""
        s = self.spec
        start = max(now, self.free_at)
        if s.rate_bps:
            if start - now > s.queue_s:
                self.queue_drops += 1
                return None
            self.free_at = start + size * 8 / s.rate_bps
        else:
            self.free_at = start
        if s.loss and self.rng.random() < s.loss:
            self.lost += 1
            return None
        jitter = self.rng.uniform(-s.jitter_s, s.jitter_s) if s.jitter_s else 0.0
        at = max(self.free_at + s.delay_s + jitter, self.last_delivery, self.free_at)
        self.last_delivery = at
        self.sent += 1
        return at
