"""Request bodies and refusals shared by the app's HTTP routes (daisy/space/model_routes.py,
daisy/space/group_run.py): a body is read under a byte limit and a deadline, and a refusal is
JSON {"error": message naming the problem}.

The deadline is a pace, not a fixed time: after a grace period the body must keep arriving at
least at `min_bytes_per_s` on average, so an honest slow uplink gets the time its size needs
while an upload trickling one byte a second is closed after the grace (docs/PROTOCOL.md
"The stored run (HTTP)"). Without it a few such uploads held every upload slot for minutes.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect


def refuse(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class BodyTooLarge(Exception):
    pass


class BodyIncomplete(Exception):
    """The body did not arrive whole: too slowly, or the client went away."""


@dataclass(frozen=True)
class Pace:
    grace_s: float = 10.0                  # the first seconds: no pace asked (connection set-up, a slow start)
    min_bytes_per_s: float = 64 * 1024     # then at least this average: 0.5 Mbit/s

    def deadline(self, started: float, received: int) -> float:
        """When a body that has `received` bytes since `started` becomes too slow."""
        return started + self.grace_s + received / self.min_bytes_per_s


DEFAULT_PACE = Pace()


def incomplete_refusal(err: BodyIncomplete) -> JSONResponse:
    """408, and the connection closes: its unread rest must not keep a slot or a socket."""
    return refuse(408, str(err), {"Connection": "close"})


async def read_body(request: Request, limit: int, pace: Pace = DEFAULT_PACE, on_chunk=None) -> bytes:
    """The request body, refused over `limit` (before reading it when Content-Length says so)
    or when it arrives slower than `pace` or not at all (BodyIncomplete). on_chunk(n) is called
    with each chunk's size before it is kept; it may raise to refuse the body."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the request body is {int(declared):,} bytes, over the limit of {limit:,} bytes")
    body = bytearray()
    started = time.monotonic()
    chunks = request.stream().__aiter__()
    while True:
        wait = pace.deadline(started, len(body)) - time.monotonic()
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), max(wait, 0.0))
        except StopAsyncIteration:
            return bytes(body)
        except ClientDisconnect:
            raise BodyIncomplete(f"the client went away after {len(body):,} bytes of its body") from None
        except TimeoutError:
            raise BodyIncomplete(f"the request body arrived too slowly: {len(body):,} bytes in "
                                 f"{time.monotonic() - started:.0f} s (at least "
                                 f"{pace.min_bytes_per_s / 1024:g} KiB/s after the first "
                                 f"{pace.grace_s:g} s)") from None
        if on_chunk is not None:
            on_chunk(len(chunk))
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"the request body is over the limit of {limit:,} bytes")
