"""The group and room model (docs/PROTOCOL.md "Identity", "Groups"): a group is a network
group (same public address) or a room (same code); a seat is a peer's identity in a group, which
outlives its socket by the reconnect grace. Peer ids come from tokens. Who sees whom is a
function of the model: the hub asks these functions and does the sending."""
from __future__ import annotations

import asyncio
import collections
import hashlib
import re
import time

from daisy.space.signaling.connection import Connection
from daisy.space.signaling.limits import ReportRate
from daisy.space.signaling.messages import Vouch

TOKEN = re.compile(r"[A-Za-z0-9_-]{32}")  # what secrets.token_urlsafe(24) makes: 192 bits
PEER_ID_HEX = 16  # a peer id: the first 16 hex digits (64 bits) of SHA-256(token)


def peer_id_of(token: str) -> str:
    """A seat's peer id: a function of its token, so a restarted server gives the same id back."""
    return hashlib.sha256(token.encode()).hexdigest()[:PEER_ID_HEX]


class RemovedIds:
    """The peer ids a room's host removed, the latest MAX of them (a bound: each removal is of a
    seat, and seats are bounded by the group's size and the join rate)."""
    MAX = 256

    def __init__(self):
        self.ids: dict[str, None] = {}

    def add(self, peer_id: str) -> None:
        self.ids.pop(peer_id, None)
        self.ids[peer_id] = None
        while len(self.ids) > self.MAX:
            del self.ids[next(iter(self.ids))]

    def __contains__(self, peer_id: str) -> bool:
        return peer_id in self.ids


class Group:
    def __init__(self, key: str, public_id: str):
        self.key, self.public_id = key, public_id
        self.kind = "room" if key.startswith("room:") else "network"
        self.seats: dict[str, Seat] = {}  # peer id -> seat, in join order
        self.removed = RemovedIds()  # ids the room's host removed: they never take a seat here again


class Seat:
    """A peer's identity in a group; outlives its connection by grace_s so a token resumes it."""

    def __init__(self, peer_id: str, token: str, group: Group, name: str, role: str, addr: str,
                 reports: collections.deque, report_rate: ReportRate):
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
        self.reports = reports  # its latest `vouch` reports (a bounded deque of Vouch), oldest first
        self.report_rate = report_rate

    def keep_report(self, vouch: Vouch) -> None:
        """Its word for (run, step) replaces its earlier word for the same; the oldest go first."""
        for old in [r for r in self.reports if (r.run, r.step) == (vouch.run, vouch.step)]:
            self.reports.remove(old)
        self.reports.append(vouch)

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


def vouchers(group: Group, run: int, step: int, weight_hash: str, final: bool) -> tuple[frozenset, int]:
    """Who vouches that run `run` holds weights `weight_hash` after `step` steps (and, when
    `final`, that it ended there) -> (their peer ids, the size of the roster they named). Only
    the group's seats count (admitted, connected or within the reconnect grace), each once, and
    only reporters naming the same roster digest count together: of the rosters named, the one
    with the most such reporters (docs/PROTOCOL.md "The stored run"). (frozenset(), 0): nobody."""
    by_roster: dict[tuple[str, int], set] = {}
    for seat in group.seats.values():
        if not seat.admitted:
            continue
        for r in seat.reports:
            if (r.run, r.step, r.hash) == (run, step, weight_hash) and (r.final or not final):
                by_roster.setdefault((r.roster, r.size), set()).add(seat.id)
    if not by_roster:
        return frozenset(), 0
    (_, size), ids = max(by_roster.items(), key=lambda kv: (2 * len(kv[1]) > kv[0][1], len(kv[1]), -kv[0][1]))
    return frozenset(ids), size


def join_request(seat: Seat) -> dict:
    return {"type": "join-request", "peer": {"id": seat.id, "name": seat.name}}
