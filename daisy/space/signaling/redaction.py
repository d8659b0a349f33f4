"""Keeps reconnect tokens (enough to take over an identity, host role included) and room codes
out of the server's logs: uvicorn logs each WebSocket's path with its query string. Installed by
the app builders (daisy.space.server.create_app, routes.make_app), never on import."""
from __future__ import annotations

import logging
import re

_SECRET_PARAM = re.compile(r"\b(token|room)=[^&\s\"']*")


class RedactSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, str) and "=" in a
                                                  for a in record.args):
            record.args = tuple(_SECRET_PARAM.sub(r"\1=(hidden)", a) if isinstance(a, str) else a
                                for a in record.args)
        elif isinstance(record.msg, str) and not record.args and "=" in record.msg:
            record.msg = _SECRET_PARAM.sub(r"\1=(hidden)", record.msg)
        return True


def install_log_redaction() -> None:
    """Add RedactSecrets to uvicorn's loggers (once)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())
