"""Request bodies and refusals shared by the app's HTTP routes (daisy/space/model_routes.py,
daisy/space/group_run.py): a body is read under a byte limit, and a refusal is JSON
{"error": message naming the problem}."""
from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse


def refuse(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (before reading it when Content-Length says so) over limit."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the request body is {int(declared):,} bytes, over the limit of {limit:,} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"the request body is over the limit of {limit:,} bytes")
    return bytes(body)
