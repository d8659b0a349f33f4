"""The /data routes over a DataSource.

Routes (make_data_router):
    GET /data/info     source, reason (why it fell back), summary (what that means, in words),
                       dataset, config, revision (requested), commit (resolved;
                       null for builtin), data_id, shards, shard_files (paths in the repo; the
                       built-in corpus by file name only), cache and prefetch counters
    GET /data/window?shard=&rg=&offset=&length=     -> application/octet-stream
    GET /data/batch?seed=&step=&slot=&batch=&seq_len= -> application/octet-stream
Bad parameters -> 400 {"error": "...", "code": "bad_parameter", "parameter": name}; data unavailable ->
503 {"error", "code": "data_unavailable"} (errors.py ERROR_CODES). Token responses carry
X-Daisy-Source, X-Daisy-Data-Id, X-Daisy-Tokens, X-Daisy-Shard, X-Daisy-Row-Group and, after a
fallback, X-Daisy-Fallback-Reason.
"""
import re

from daisy.space.datastream.errors import ERROR_CODES, DataRequestError, DataUnavailable
from daisy.space.datastream.source import DataSource, Tokens


def _int_params(query, names: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for name in names:
        raw = query.get(name)
        if raw is None or raw == "":
            raise DataRequestError(name, f"missing parameter {name} (an integer)")
        text = raw.strip()
        # one optional minus, then ASCII digits: int() would raise (a 500) on "--5" or "1-2"
        if len(text) > 40 or not re.fullmatch(r"-?[0-9]+", text):
            raise DataRequestError(name, f"{name} must be an integer, got {raw[:40]!r}")
        out[name] = int(text)
    return out


def _header_text(s: str) -> str:
    """Header-safe: printable ASCII, one line, bounded."""
    return "".join(c if " " <= c <= "~" else "?" for c in s)[:200]


def make_data_router(source: DataSource):
    """A FastAPI router with /data/info, /data/window and /data/batch over `source`."""
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse, Response

    router = APIRouter(prefix="/data")

    def tokens_response(t: Tokens) -> Response:
        headers = {"X-Daisy-Source": t.source, "X-Daisy-Data-Id": _header_text(t.data_id),
                   "X-Daisy-Tokens": str(len(t.tokens)), "X-Daisy-Shard": str(t.shard),
                   "X-Daisy-Row-Group": str(t.rg), "Cache-Control": "no-cache"}
        if t.reason:
            headers["X-Daisy-Fallback-Reason"] = _header_text(t.reason)
        return Response(t.tokens.astype("<u2").tobytes(), media_type="application/octet-stream", headers=headers)

    def answer(fn, query, names) -> Response:
        try:
            return tokens_response(fn(**_int_params(query, names)))
        except DataRequestError as exc:
            return JSONResponse({"error": str(exc), "code": ERROR_CODES[DataRequestError], "parameter": exc.parameter},
                                status_code=400)
        except DataUnavailable as exc:
            return JSONResponse({"error": str(exc), "code": ERROR_CODES[DataUnavailable]}, status_code=503)

    @router.get("/info")
    def data_info():
        return source.info()

    @router.get("/window")
    def data_window(request: Request):
        return answer(source.window, request.query_params, ("shard", "rg", "offset", "length"))

    @router.get("/batch")
    def data_batch(request: Request):
        return answer(source.batch, request.query_params, ("seed", "step", "slot", "batch", "seq_len"))

    return router
