"""One WebSocket of the hub: its outbox (sends never block the sender's handler), liveness and
token bucket, and the hub-wide bytes queued to all sockets."""
from __future__ import annotations

import asyncio
import json
import time

from fastapi import WebSocket

from daisy.space.signaling.config import SignalingConfig
from daisy.space.signaling.limits import ADMIT, CLOSE, WARN, LoopClock, TokenBucket
from daisy.space.signaling.messages import CLOSE_POLICY, CLOSE_SLOW, error


class Shared:
    """Hub-wide counters the connections update."""

    def __init__(self):
        self.queued = 0  # bytes queued to all sockets
        self.clock = LoopClock()


class Close:
    """Outbox sentinel: the writer closes the socket after sending everything queued before."""

    def __init__(self, code: int, reason: str):
        self.code, self.reason = code, reason


class Connection:
    def __init__(self, ws: WebSocket, config: SignalingConfig, shared: Shared):
        self.ws, self.config, self.shared = ws, config, shared
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.queued_bytes = 0
        self.closing: Close | None = None
        self.stuck = asyncio.Event()  # its reader stopped reading: give up on a clean close
        self.last_seen = time.monotonic()
        self.bucket = TokenBucket(config.rate_per_s, config.rate_burst, shared.clock)

    def send(self, message: dict | str) -> None:
        if self.closing:
            return
        text = message if isinstance(message, str) else json.dumps(message)
        if self.queued_bytes + len(text) > self.config.outbox_max_bytes:
            self.close(CLOSE_SLOW, "outbox overflow: reading too slowly")
            self.stuck.set()
            return
        if self.shared.queued + len(text) > self.config.total_outbox_max_bytes:
            # the server's send buffers are full: the receiver that would grow them goes
            self.close(CLOSE_SLOW, "server send buffers full: reading too slowly")
            self.stuck.set()
            return
        self.queued_bytes += len(text)
        self.shared.queued += len(text)
        self.outbox.put_nowait(text)

    def release_queue(self) -> None:
        """The socket is gone: what it had queued no longer counts against the hub."""
        self.shared.queued -= self.queued_bytes
        self.queued_bytes = 0

    def close(self, code: int, reason: str) -> None:
        if not self.closing:
            self.closing = Close(code, reason)
            self.outbox.put_nowait(self.closing)

    def admit(self) -> bool:
        """Whether the message just received may be handled (TokenBucket); a flood past the
        bucket's overdraft closes the socket, the first drop of a run tells the sender."""
        verdict = self.bucket.admit(time.monotonic())
        if verdict == CLOSE:
            self.close(CLOSE_POLICY, "rate limit exceeded")
        elif verdict == WARN:
            self.send(error("rate-limited", f"over {self.config.rate_per_s:g} messages/s; "
                                            "messages are being dropped"))
        return verdict == ADMIT
