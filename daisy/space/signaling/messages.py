"""The signaling wire's vocabulary (docs/PROTOCOL.md "Message format", "Error codes", "Close
codes"): close codes, how a client's text is decoded, the error message, and the rules for the
free text a client may set (names, states)."""
from __future__ import annotations

import json
import re
import unicodedata

ROOM_CODE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_NAME = 40
MAX_STATE = 64

# Close codes (1xxx: RFC 6455 meanings; 4xxx: ours, echoing the HTTP status they resemble).
CLOSE_LEFT = 1000  # the client sent `leave`
CLOSE_POLICY = 1008  # kept flooding after `rate-limited`
CLOSE_TOO_BIG = 1009  # frame over max_frame bytes
CLOSE_SLOW = 1013  # the client reads too slowly: its outbox overflowed
CLOSE_BAD_ROOM = 4400  # room code not 1-64 chars of [A-Za-z0-9_-]
CLOSE_REJECTED = 4403  # the room host rejected this connection
CLOSE_IDLE = 4408  # nothing received for idle_pings ping intervals
CLOSE_REPLACED = 4409  # a newer connection resumed this peer with its token
CLOSE_ROOM_CLOSED = 4410  # no approved member is left in the room (pending peers are told)
CLOSE_GROUP_FULL = 4413  # the group already has max_group peers
CLOSE_TOO_MANY_JOINS = 4429  # join attempts from this address too fast, or just rejected, or
#                              too many sockets open from this client


class NonFinite(Exception):
    pass


def _no_constant(name: str):
    """json.loads accepts NaN / Infinity; a browser's JSON.parse does not: relaying them would
    hand the receiver a frame it cannot read."""
    raise NonFinite(name)


# one decoder (json.loads with keyword arguments would build a new one per message)
DECODER = json.JSONDecoder(parse_constant=_no_constant)


def error(code: str, message: str, ref=None) -> dict:
    err = {"type": "error", "code": code, "message": message}
    if isinstance(ref, (str, int)) and not isinstance(ref, bool) and len(str(ref)) <= 64:
        err["ref"] = ref
    return err


def clean_text(value, limit: int) -> str:
    """A client's free text: no control characters, whitespace runs as one space, at most `limit`."""
    if not isinstance(value, str):
        return ""
    text = "".join(c for c in value if unicodedata.category(c)[0] != "C")
    return " ".join(text.split())[:limit]
