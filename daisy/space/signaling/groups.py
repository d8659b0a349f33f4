"""The group and room model (docs/PROTOCOL.md "Identity", "Groups"): a group is a network
group (same public address) or a room (same code); a seat is a peer's identity in a group, which
outlives its socket by the reconnect grace. Peer ids come from tokens. Who sees whom is a
function of the model: the hub asks these functions and does the sending."""
from __future__ import annotations

import asyncio
import hashlib
import re
import time

from daisy.space.signaling.connection import Connection

TOKEN = re.compile(r"[A-Za-z0-9_-]{32}")  # what secrets.token_urlsafe(24) makes: 192 bits
PEER_ID_HEX = 16  # a peer id: the first 16 hex digits (64 bits) of SHA-256(token)


def peer_id_of(token: str) -> str:
    """A seat's peer id: a function of its token, so a restarted server gives the same id back."""
    return hashlib.sha256(token.encode()).hexdigest()[:PEER_ID_HEX]


class Group:
    def __init__(self, key: str, public_id: str):
        self.key, self.public_id = key, public_id
        self.kind = "room" if key.startswith("room:") else "network"
        self.seats: dict[str, Seat] = {}  # peer id -> seat, in join order


class Seat:
    """A peer's identity in a group; outlives its connection by grace_s so a token resumes it."""

    def __init__(self, peer_id: str, token: str, group: Group, name: str, role: str, addr: str):
        self.id, self.token, self.group, self.role = peer_id, token, group, role
        self.name = name or f"peer-{peer_id[:4]}"
        self.path: str | None = None
        self.state = ""
        self.joined_at = int(time.time() * 1000)
        self.conn: Connection | None = None
        self.expiry: asyncio.TimerHandle | None = None
        self.released = False
        self.update_due: asyncio.TimerHandle | None = None  # a coalesced peer-updated
        self.updated_at = float("-inf")
        self.addr = addr  # its network key (salted), for the rejection cool-down

    @property
    def admitted(self) -> bool:
        return self.role != "pending"

    def info(self) -> dict:
        return {"id": self.id, "name": self.name, "joinedAt": self.joined_at, "role": self.role,
                "path": self.path, "state": self.state}

    def send(self, message: dict | str) -> None:
        if self.conn:
            self.conn.send(message)


# ---- who sees whom ------------------------------------------------------------------------

def members(group: Group) -> list[Seat]:
    """The group's connected, admitted seats."""
    return [s for s in group.seats.values() if s.admitted and s.conn]


def roster(viewer: Seat) -> list[dict]:
    """The peers `viewer` may know of, itself included; a pending peer sees only itself."""
    if not viewer.admitted:
        return [viewer.info()]
    return [s.info() for s in members(viewer.group)]


def viewers(seat: Seat) -> list[Seat]:
    """Who is told about `seat` coming and going: members, or for a pending seat the host."""
    if seat.admitted:
        return [s for s in members(seat.group) if s is not seat]
    return [s for s in members(seat.group) if s.role == "host"]


def join_request(seat: Seat) -> dict:
    return {"type": "join-request", "peer": {"id": seat.id, "name": seat.name}}
