"""The signaling wire's vocabulary (docs/PROTOCOL.md "Message format", "Error codes", "Close
codes"): close codes, how a client's text is decoded, the error message, and the rules for the
free text a client may set (names, states)."""
from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass

ROOM_CODE = re.compile(r"[A-Za-z0-9_-]{1,64}")
PEER_ID = re.compile(r"[0-9a-f]{16}")  # groups.peer_id_of's form
WEIGHT_HASH = re.compile(r"[0-9a-f]{64}")  # SHA-256 hex of a state's weights (daisy/hashing.py)
MAX_RUN_ID = 0xFFFFFFFF  # a run id is the mesh's: a u32 other than 0
MAX_STEP = 10**9
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


@dataclass(frozen=True)
class Vouch:
    """A member's word that its replica of run `run` holds weights `hash` after `step` steps
    (`final`: its run ended there), training with the roster whose digest is `roster` and
    which has `size` devices (docs/PROTOCOL.md "The stored run")."""
    run: int
    step: int
    hash: str
    final: bool
    roster: str  # SHA-256 hex of the roster's ids joined by ","
    size: int


def parse_vouch(msg: dict, reporter: str, max_group: int) -> Vouch | str:
    """A `vouch` message from seat `reporter` -> its Vouch, or why it is malformed. The roster is
    1..max_group distinct peer ids that include the reporter (a report for a roster one is not
    in vouches for nobody's run)."""
    run, step, hash_, final, roster = (msg.get(k) for k in ("run", "step", "hash", "final", "roster"))
    if not (isinstance(run, int) and not isinstance(run, bool) and 0 < run <= MAX_RUN_ID):
        return f'vouch: "run" must be the run\'s id, a whole number in 1..{MAX_RUN_ID}'
    if not (isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP):
        return f'vouch: "step" must be a whole number in 0..{MAX_STEP}'
    if not (isinstance(hash_, str) and WEIGHT_HASH.fullmatch(hash_)):
        return 'vouch: "hash" must be the weights\' SHA-256, 64 lowercase hex digits'
    if not isinstance(final, bool):
        return 'vouch: "final" must be true or false'
    if not (isinstance(roster, list) and 0 < len(roster) <= max_group and
            all(isinstance(i, str) and PEER_ID.fullmatch(i) for i in roster) and len(set(roster)) == len(roster)):
        return f'vouch: "roster" must be 1..{max_group} distinct peer ids (16 lowercase hex digits)'
    if reporter not in roster:
        return 'vouch: "roster" must include you: a device vouches only for a run it trains in'
    digest = hashlib.sha256(",".join(roster).encode()).hexdigest()
    return Vouch(run=run, step=step, hash=hash_, final=final, roster=digest, size=len(roster))
