"""WebSocket signaling: groups peers, gates rooms behind host approval, relays WebRTC signals.

The server never interprets what peers exchange: it assigns peer ids, decides who may talk to
whom (same group, nobody pending) and stamps the sender on everything it relays. The wire
protocol (messages, fields, close codes) is specified in docs/PROTOCOL.md.

Use: `app.include_router(make_signaling_router(SignalingHub()))` — one hub per app, holding all
state. The module-level `router` is the same thing over a hub built from the environment at
import time, for apps that want one shared default.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import time
import unicodedata
from dataclasses import dataclass, field

from fastapi import APIRouter, FastAPI, WebSocket

from daisy.space.env import env_number

log = logging.getLogger("daisy.space.signaling")
DEFAULT_ICE_SERVERS = [{"urls": "stun:stun.l.google.com:19302"}]
ROOM_CODE = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOKEN = re.compile(r"[A-Za-z0-9_-]{32}")  # what secrets.token_urlsafe(24) makes: 192 bits
PEER_ID_HEX = 16  # a peer id: the first 16 hex digits (64 bits) of SHA-256(token)
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
CLOSE_TOO_MANY_JOINS = 4429  # join attempts from this address too fast, or just rejected

LOOPBACK_PROXIES = ("127.0.0.0/8", "::1")
SPACE_PROXIES = ("10.0.0.0/8",)  # a Hugging Face Space's proxy reaches the app from here

# Private, loopback and link-local ranges: all of them form one "local network" group.
LOCAL_NETS = [ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "::1/128", "fc00::/7", "fe80::/10")]


def ice_servers_from_env(env=os.environ) -> list[dict]:
    """DAISY_ICE_SERVERS (a JSON list of RTCIceServer objects) or the public STUN default,
    plus a TURN server when DAISY_TURN_URL is set (with DAISY_TURN_USER / DAISY_TURN_PASS)."""
    raw = env.get("DAISY_ICE_SERVERS")
    servers = DEFAULT_ICE_SERVERS
    if raw:
        try:
            servers = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"DAISY_ICE_SERVERS is not valid JSON: {err}") from None
        if not isinstance(servers, list) or not all(
                isinstance(s, dict) and isinstance(s.get("urls"), (str, list)) for s in servers):
            raise ValueError('DAISY_ICE_SERVERS must be a JSON list of objects with "urls"')
    servers = [dict(s) for s in servers]
    if env.get("DAISY_TURN_URL"):
        servers.append({"urls": env["DAISY_TURN_URL"], "username": env.get("DAISY_TURN_USER", ""),
                        "credential": env.get("DAISY_TURN_PASS", "")})
    return servers


@dataclass(frozen=True)
class SignalingConfig:
    ping_s: float = 20.0  # server `ping` period
    idle_pings: int = 3  # close a socket silent for this many ping periods
    grace_s: float = 30.0  # how long a dropped peer's seat (id, role) waits for its token
    rate_per_s: float = 50.0  # token bucket: sustained messages/s per socket
    rate_burst: float = 100.0  # token bucket size; also the overdraft that gets a socket closed
    max_frame: int = 65536  # bytes
    outbox_max_bytes: int = 1 << 20  # queued to one socket beyond this, it counts as stuck
    total_outbox_max_bytes: int = 64 << 20  # queued to all sockets together (hub-wide)
    max_group: int = 32  # peers (seats, pending and in grace included) per group
    hello_min_s: float = 0.5  # one peer-updated per peer per this many seconds (coalesced)
    join_per_min: float = 20.0  # new room identities per address per minute (and burst)
    reject_cooldown_s: float = 30.0  # after a rejection, that address waits before asking again
    ip_salt: bytes = field(default_factory=lambda: secrets.token_bytes(16), repr=False)
    trusted_proxies: tuple = LOOPBACK_PROXIES  # X-Forwarded-For is believed only from these
    ice_servers: list = field(default_factory=lambda: [dict(s) for s in DEFAULT_ICE_SERVERS])

    @classmethod
    def from_env(cls, env=os.environ) -> "SignalingConfig":
        salt = env.get("DAISY_IP_SALT")
        return cls(
            ping_s=env_number(env, "DAISY_PING_S", cls.ping_s),
            grace_s=env_number(env, "DAISY_RECONNECT_GRACE_S", cls.grace_s),
            rate_per_s=env_number(env, "DAISY_RATE_PER_S", cls.rate_per_s),
            rate_burst=env_number(env, "DAISY_RATE_BURST", cls.rate_burst),
            max_group=int(env_number(env, "DAISY_MAX_GROUP", cls.max_group)),
            join_per_min=env_number(env, "DAISY_JOIN_PER_MIN", cls.join_per_min),
            reject_cooldown_s=env_number(env, "DAISY_REJECT_COOLDOWN_S", cls.reject_cooldown_s),
            ip_salt=salt.encode() if salt else secrets.token_bytes(16),
            trusted_proxies=trusted_proxies_from_env(env),
            ice_servers=ice_servers_from_env(env))




def trusted_proxies_from_env(env=os.environ) -> tuple[str, ...]:
    """DAISY_TRUSTED_PROXIES: comma-separated addresses or networks whose X-Forwarded-For is
    believed ("none": nobody). Default: loopback (a tunnel or proxy on this machine), plus
    10.0.0.0/8 on a Hugging Face Space (SPACE_ID set). README "Serving over HTTPS"."""
    raw = env.get("DAISY_TRUSTED_PROXIES")
    if raw is None or raw.strip() == "":
        return LOOPBACK_PROXIES + (SPACE_PROXIES if env.get("SPACE_ID") else ())
    if raw.strip().lower() == "none":
        return ()
    items = tuple(x.strip() for x in raw.split(",") if x.strip())
    for item in items:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise ValueError(f"DAISY_TRUSTED_PROXIES: {item[:60]!r} is not an address or "
                             "network") from None
    return items


def _networks(trusted) -> tuple:
    return tuple(ipaddress.ip_network(t, strict=False) for t in trusted)


def _is_trusted(ip, networks) -> bool:
    return ip is not None and any(ip.version == n.version and ip in n for n in networks)


def client_ip(headers, client_host: str | None, trusted=()):
    """The caller's address. The socket's peer, unless that peer is a trusted proxy (trusted:
    networks): then the rightmost X-Forwarded-For entry that is not itself a trusted proxy
    (each proxy appends the address it was reached from; entries left of that are whatever
    the client claimed). None when nothing parses."""
    peer = _parse_ip(client_host or "")
    if not _is_trusted(peer, trusted):
        return peer
    entries = ",".join(headers.getlist("x-forwarded-for")).split(",")
    found = peer
    for text in reversed(entries):
        ip = _parse_ip(text.strip())
        if ip is None:  # garbage where an address should be: believe nothing further left
            break
        found = ip
        if not _is_trusted(ip, trusted):
            break
    return found


def _parse_ip(text: str):
    if text.startswith("["):  # "[v6]:port"
        text = text[1:text.find("]")]
    elif text.count(":") == 1:  # "v4:port"
        text = text.split(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    return ip.ipv4_mapped or ip if ip.version == 6 else ip


def address_key(ip) -> str:
    """One client's key for per-client limits: its address; an IPv6 /64 counts as one client
    (a device may take any address of its network's prefix)."""
    if ip is None:
        return "unknown"
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)


def network_key(ip, salt: bytes) -> str:
    """Group key for a network group. IPv6 groups by /64: one home network shares a prefix
    while each device has its own address. Only a salted hash ever leaves this function."""
    if ip is None or any(ip in net for net in LOCAL_NETS if net.version == ip.version):
        return "net:local"
    where = str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)
    return "net:" + hmac.new(salt, where.encode(), hashlib.sha256).hexdigest()[:24]


def peer_id_of(token: str) -> str:
    """A seat's peer id: a function of its token, so a restarted server gives the same id back."""
    return hashlib.sha256(token.encode()).hexdigest()[:PEER_ID_HEX]


def _clean_text(value, limit: int) -> str:
    if not isinstance(value, str):
        return ""
    text = "".join(c for c in value if unicodedata.category(c)[0] != "C")
    return " ".join(text.split())[:limit]


class LoopClock:
    """Notices event-loop stalls. After a stall, frames that honest peers sent during it
    arrive all at once; the rate limiter must not mistake that backlog for a flood. A tick every
    `interval`; a stall is a tick late by more than STALL_S, and it is visible while its backlog
    drains: before the late tick runs (readers may run first) and for DRAIN_S after."""
    STALL_S = 0.25
    DRAIN_S = 1.0

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.tick = time.monotonic()
        self.recent, self.recent_key, self.recent_at = 0.0, 0.0, float("-inf")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            lag = now - self.tick - self.interval
            if lag > self.STALL_S:
                self.recent, self.recent_key, self.recent_at = lag, self.tick, now
            self.tick = now

    def stall(self, now: float) -> tuple[float, float]:
        """(seconds of the stall whose backlog may be draining now, an id for that stall)."""
        current = now - self.tick - self.interval
        if current > self.STALL_S:
            return current, self.tick
        if now - self.recent_at < self.DRAIN_S:
            return self.recent, self.recent_key
        return 0.0, 0.0


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
    """One WebSocket: its outbox (sends never block the sender's handler), liveness and
    token bucket."""

    def __init__(self, ws: WebSocket, config: SignalingConfig, shared: Shared | None = None):
        self.ws, self.config = ws, config
        self.shared = shared or Shared()
        self.stall_key = 0.0  # the stall whose backlog allowance this socket is using
        self.stall_credit = 0.0
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.queued_bytes = 0
        self.closing: Close | None = None
        self.stuck = asyncio.Event()  # its reader stopped reading: give up on a clean close
        self.last_seen = self.bucket_t = time.monotonic()
        self.tokens = config.rate_burst
        self.overdraft = 0.0  # rejected messages, draining at rate_per_s
        self.limited = False  # inside a run of rejected messages (one error per run)

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
        """Token bucket. An empty bucket drops the message (one `rate-limited` error per run of
        drops: a run ends only once the overdraft has drained, so a sender hovering at the
        limit is not told again for every refilled token); an overdraft beyond a full burst
        closes the socket."""
        now = time.monotonic()
        refill = (now - self.bucket_t) * self.config.rate_per_s
        self.bucket_t = now
        self.tokens = min(self.config.rate_burst, self.tokens + refill)
        self.overdraft = max(0.0, self.overdraft - refill)
        if self.tokens >= 1:
            self.tokens -= 1
            if self.overdraft == 0.0:
                self.limited = False
            return True
        # A backlog from the server's own stall: what the sender could have sent at the full
        # rate while the loop was stalled is admitted (docs/PROTOCOL.md, "Limits").
        stall, key = self.shared.clock.stall(now)
        if stall > 0:
            if key != self.stall_key:
                self.stall_key, self.stall_credit = key, stall * self.config.rate_per_s
            if self.stall_credit >= 1:
                self.stall_credit -= 1
                return True
        self.overdraft += 1
        if self.overdraft > self.config.rate_burst:
            self.close(CLOSE_POLICY, "rate limit exceeded")
        elif not self.limited:
            self.limited = True
            self.send(_error("rate-limited", f"over {self.config.rate_per_s:g} messages/s; "
                                             "messages are being dropped"))
        return False


class Group:
    def __init__(self, key: str, public_id: str):
        self.key, self.public_id = key, public_id
        self.kind = "room" if key.startswith("room:") else "network"
        self.seats: dict[str, Seat] = {}  # peer id -> seat, in join order


class Seat:
    """A peer's identity in a group; outlives its connection by grace_s so a token resumes it."""

    def __init__(self, peer_id: str, token: str, group: Group, name: str, role: str):
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
        self.addr = ""  # its address key (salted), for the rejection cool-down

    @property
    def admitted(self) -> bool:
        return self.role != "pending"

    def info(self) -> dict:
        return {"id": self.id, "name": self.name, "joinedAt": self.joined_at, "role": self.role,
                "path": self.path, "state": self.state}

    def send(self, message: dict | str) -> None:
        if self.conn:
            self.conn.send(message)


class _NonFinite(Exception):
    pass


def _no_constant(name: str):
    """json.loads accepts NaN / Infinity; a browser's JSON.parse does not: relaying them would
    hand the receiver a frame it cannot read."""
    raise _NonFinite(name)


# one decoder (json.loads with keyword arguments would build a new one per message)
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _error(code: str, message: str, ref=None) -> dict:
    err = {"type": "error", "code": code, "message": message}
    if isinstance(ref, (str, int)) and not isinstance(ref, bool) and len(str(ref)) <= 64:
        err["ref"] = ref
    return err


class SignalingHub:
    """All signaling state of one app: groups[key].seats[peer_id] (rooms[key][peer_id])."""

    def __init__(self, config: SignalingConfig | None = None):
        self.config = config or SignalingConfig.from_env()
        self._trusted = _networks(self.config.trusted_proxies)
        self.groups: dict[str, Group] = {}
        self.by_token: dict[str, Seat] = {}
        self.peer_ids: set[str] = set()
        self.shared = Shared()
        self._clock_task: asyncio.Task | None = None
        self._join_buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, time)
        self._cooldowns: dict[tuple[str, str], float] = {}  # (address, room) -> until

    def _join_allowed(self, addr: str, room_key: str) -> str | None:
        """None, or why a new room identity from this address is refused now. The same answer
        whether or not the room exists: this check comes before the room is looked up."""
        now = time.monotonic()
        until = self._cooldowns.get((addr, room_key))
        if until is not None:
            if now < until:
                return f"rejected here recently: wait {until - now:.0f} s before asking again"
            del self._cooldowns[(addr, room_key)]
        # burst: a minute's worth, so a classroom behind one address can join at once
        rate, burst = self.config.join_per_min / 60, max(1.0, self.config.join_per_min)
        tokens, then = self._join_buckets.get(addr, (burst, now))
        tokens = min(burst, tokens + (now - then) * rate)
        if tokens < 1:
            self._join_buckets[addr] = (tokens, now)
            return (f"too many room join attempts from your address "
                    f"(over {self.config.join_per_min:g} a minute): wait and retry")
        self._join_buckets[addr] = (tokens - 1, now)
        if len(self._join_buckets) > 10000:  # bounded: forget addresses whose bucket is full
            for k in [k for k, (t, at) in self._join_buckets.items()
                      if t + (now - at) * rate >= burst]:
                del self._join_buckets[k]
        return None

    # ---- what the app's HTTP routes ask ---------------------------------------------------

    def present(self, key: str, peer_id: str) -> bool:
        """Whether `peer_id` holds a connected seat in group `key` (one that left, or whose
        socket dropped, is gone: its group was told `peer-left`)."""
        group = self.groups.get(key)
        seat = group.seats.get(peer_id) if group else None
        return seat is not None and seat.conn is not None and not seat.released

    def address_of(self, request) -> str:
        """The client address of an HTTP request (behind a trusted proxy: the client's), as a key."""
        return address_key(client_ip(request.headers, request.client.host if request.client else None,
                                     self._trusted))

    # ---- connection lifecycle -------------------------------------------------------------

    async def serve(self, ws: WebSocket) -> None:
        await ws.accept()  # accept first: a close before accept reaches the client as HTTP 403
        room = ws.query_params.get("room")
        if room is not None and not ROOM_CODE.fullmatch(room):
            await ws.close(CLOSE_BAD_ROOM, "room code must be 1-64 characters of A-Z a-z 0-9 _ -")
            return
        if self._clock_task is None or self._clock_task.done():
            self._clock_task = asyncio.create_task(self.shared.clock.run())
        addr = network_key(client_ip(ws.headers, ws.client.host if ws.client else None,
                                     self._trusted), self.config.ip_salt)
        key = "room:" + room.lower() if room is not None else addr  # codes: case-insensitive
        token = ws.query_params.get("token")
        resuming = (seat := self.by_token.get(token or "")) is not None and seat.group.key == key
        refusal = None
        if room is not None and not resuming:
            why = self._join_allowed(addr, key)
            if why:
                refusal = (CLOSE_TOO_MANY_JOINS, why)
        group = self.groups.get(key)
        if refusal is None and not resuming and group and len(group.seats) >= self.config.max_group:
            refusal = (CLOSE_GROUP_FULL, f"group full: {self.config.max_group} peers at most")
        if refusal:
            await ws.close(*refusal)
            return
        conn = Connection(ws, self.config, self.shared)
        seat = self._attach(conn, key, token, ws.query_params.get("name"))
        seat.addr = addr
        reader = asyncio.create_task(self._read(seat, conn))
        writer = asyncio.create_task(self._write(conn))
        keepalive = asyncio.create_task(self._keepalive(conn))
        stuck = asyncio.create_task(conn.stuck.wait())
        try:
            await asyncio.wait({reader, writer, stuck}, return_when=asyncio.FIRST_COMPLETED)
            if conn.closing and not writer.done() and not stuck.done():
                await asyncio.wait({writer, stuck}, timeout=5)  # flush, then send the close
        finally:
            for task in (reader, writer, keepalive, stuck):
                task.cancel()
            if reader.done() and not reader.cancelled() and reader.exception():
                log.error("signaling: peer %s dropped by a server error", seat.id,
                          exc_info=reader.exception())
            conn.release_queue()
            self._detach(seat, conn)

    def _attach(self, conn: Connection, key: str, token: str | None, name: str | None) -> Seat:
        seat = self.by_token.get(token or "")
        resumed = seat is not None and seat.group.key == key
        if resumed:
            if seat.expiry:
                seat.expiry.cancel()
                seat.expiry = None
            if seat.conn:  # the old socket is half-open or a second tab: the newest wins
                seat.conn.close(CLOSE_REPLACED, "resumed by a newer connection")
            if name:
                seat.name = _clean_text(name, MAX_NAME) or seat.name
        else:
            group = self.groups.get(key)
            if group is None:
                public_id = hmac.new(self.config.ip_salt, key.encode(), hashlib.sha256)
                group = self.groups[key] = Group(key, public_id.hexdigest()[:12])
            if group.kind == "network":
                role = "member"
            else:
                role = "pending" if any(s.role == "host" for s in group.seats.values()) else "host"
            token, peer_id = self._identity(token)
            seat = Seat(peer_id, token, group, _clean_text(name, MAX_NAME), role)
            group.seats[seat.id] = seat
            self.by_token[seat.token] = seat
        seat.conn = conn
        conn.send({"type": "welcome", "peerId": seat.id, "token": seat.token, "name": seat.name,
                   "group": {"kind": seat.group.kind, "id": seat.group.public_id},
                   "role": seat.role, "resumed": resumed, "iceServers": self.config.ice_servers,
                   "peers": self._roster(seat), "pingIntervalS": self.config.ping_s,
                   "maxFrame": self.config.max_frame})
        self._announce_arrival(seat)
        return seat

    def _identity(self, token: str | None) -> tuple[str, str]:
        """(token, peer id) of a new seat. A well-formed token this hub does not know (minted
        by an earlier run of the server, or expired here) keeps its id, so a run's roster
        survives a restart; a malformed one, or one whose id a live seat holds (the same token
        in another group, or a preimage attempt), is ignored: a fresh identity. Why accepting
        client tokens gives nobody new power: docs/PROTOCOL.md "Identity"."""
        if token and TOKEN.fullmatch(token) and (peer_id := peer_id_of(token)) not in self.peer_ids:
            self.peer_ids.add(peer_id)
            return token, peer_id
        while (peer_id := peer_id_of(token := secrets.token_urlsafe(24))) in self.peer_ids:
            pass
        self.peer_ids.add(peer_id)
        return token, peer_id

    def _detach(self, seat: Seat, conn: Connection) -> None:
        if seat.conn is not conn:  # already replaced by a resumed connection
            return
        seat.conn = None
        if seat.released:
            return
        self._broadcast(self._viewers(seat), {"type": "peer-left", "peer": seat.id,
                                               "reason": "disconnected"})
        seat.expiry = asyncio.get_running_loop().call_later(
            self.config.grace_s, self._release, seat)

    def _release(self, seat: Seat) -> None:
        """Drop a seat for good (left, rejected, or its grace ran out); hand over the host role."""
        if seat.released:
            return
        seat.released = True
        for timer in (seat.expiry, seat.update_due):
            if timer:
                timer.cancel()
        group = seat.group
        del group.seats[seat.id]
        del self.by_token[seat.token]
        self.peer_ids.discard(seat.id)
        if group.kind == "room" and group.seats and \
                not any(s.admitted for s in group.seats.values()):
            self._close_room(group)
        elif not group.seats:
            del self.groups[group.key]
        elif seat.role == "host":
            self._hand_over(group)

    def _close_room(self, group: Group) -> None:
        """No approved member is left: only an approved member may ever become host, so the
        room ends; the peers still waiting are told, then closed (4410)."""
        for seat in list(group.seats.values()):
            seat.send({"type": "room-closed", "reason": "no approved member is left in the room"})
            if seat.conn:
                seat.conn.close(CLOSE_ROOM_CLOSED, "room closed: no approved member is left")
            seat.released = True
            for timer in (seat.expiry, seat.update_due):
                if timer:
                    timer.cancel()
            del self.by_token[seat.token]
            self.peer_ids.discard(seat.id)
        group.seats.clear()
        del self.groups[group.key]

    def _hand_over(self, group: Group) -> None:
        """New host: the longest-present approved member (connected ones first). Never a
        pending peer: with no approved member left the room closes (_close_room)."""
        seats = list(group.seats.values())
        ranked = [s for s in seats if s.admitted and s.conn] + [s for s in seats if s.admitted]
        host = ranked[0]
        host.role = "host"
        self._broadcast(self._members(group), {"type": "role", "peer": host.id, "role": "host"})
        self._broadcast(self._members(group), {"type": "peers", "peers": self._roster(host)})
        for seat in seats:
            if not seat.admitted and seat.conn:
                host.send(self._join_request(seat))

    # ---- socket tasks ---------------------------------------------------------------------

    async def _read(self, seat: Seat, conn: Connection) -> None:
        max_frame = self.config.max_frame
        while not conn.closing:
            frame = await conn.ws.receive()
            if frame["type"] == "websocket.disconnect":
                return
            conn.last_seen = time.monotonic()
            text, data = frame.get("text"), frame.get("bytes")
            size = len(data) if text is None else len(text)
            if size > max_frame or (text is not None and len(text.encode()) > max_frame):
                conn.close(CLOSE_TOO_BIG, f"frame over {max_frame} bytes")
                return
            if conn.admit():
                if text is None:
                    conn.send(_error("bad-json", "binary frames are not accepted: send JSON text"))
                else:
                    self._handle(seat, conn, text)

    async def _write(self, conn: Connection) -> None:
        try:
            while True:
                item = await conn.outbox.get()
                if isinstance(item, Close):
                    await conn.ws.close(item.code, item.reason)
                    return
                conn.queued_bytes -= len(item)
                conn.shared.queued -= len(item)
                await conn.ws.send_text(item)
        except Exception:  # the client went away mid-send: the reader sees the disconnect
            return

    async def _keepalive(self, conn: Connection) -> None:
        ping = json.dumps({"type": "ping"})
        while not conn.closing:
            await asyncio.sleep(self.config.ping_s)
            silent = time.monotonic() - conn.last_seen
            if silent > self.config.idle_pings * self.config.ping_s:
                conn.close(CLOSE_IDLE, f"nothing received for {silent:.1f} s")
                return
            conn.send(ping)

    # ---- messages -------------------------------------------------------------------------

    def _handle(self, seat: Seat, conn: Connection, text: str) -> None:
        try:
            msg = _DECODER.decode(text)
        except (json.JSONDecodeError, RecursionError) as err:
            conn.send(_error("bad-json", f"not valid JSON: {err}"[:200]))
            return
        except _NonFinite:
            conn.send(_error("bad-json", "NaN, Infinity and -Infinity are not JSON; send numbers "
                                         "or strings"))
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            conn.send(_error("bad-message", 'a message is a JSON object with a string "type"'))
            return
        kind, ref = msg["type"], msg.get("ref")
        if kind in ("signal", "relay"):
            self._forward(seat, msg, ref)
        elif kind in ("approve", "reject"):
            self._decide(seat, msg, ref)
        elif kind == "hello":
            self._hello(seat, msg, ref)
        elif kind == "ping":
            conn.send({"type": "pong"})
        elif kind == "pong":
            pass  # liveness is any frame; last_seen is already updated
        elif kind == "leave":
            self._broadcast(self._viewers(seat), {"type": "peer-left", "peer": seat.id,
                                                   "reason": "left"})
            self._release(seat)
            conn.close(CLOSE_LEFT, "left")
        else:
            conn.send(_error("unknown-type", f"unknown message type {kind[:40]!r}", ref))

    def _forward(self, seat: Seat, msg: dict, ref) -> None:
        to = msg.get("to")
        if not isinstance(to, str) or "data" not in msg:
            seat.send(_error("bad-message", f'{msg["type"]} needs "to" (a peer id) and "data"', ref))
            return
        target = seat.group.seats.get(to)
        # One answer for "elsewhere", "nowhere", "pending" and "offline": ids can't be probed.
        if target is None or target is seat or not target.conn or not (
                target.admitted and seat.admitted):
            seat.send(_error("no-such-peer", f"no peer {to[:40]!r} you can reach", ref))
            return
        target.send({"type": msg["type"], "from": seat.id, "data": msg["data"]})

    def _decide(self, seat: Seat, msg: dict, ref) -> None:
        if seat.role != "host":
            seat.send(_error("not-host", f"only the room host can {msg['type']}", ref))
            return
        target = seat.group.seats.get(msg.get("peer") if isinstance(msg.get("peer"), str) else "")
        if target is None or target.admitted or not target.conn:
            seat.send(_error("no-such-peer", "no pending peer with that id", ref))
            return
        if msg["type"] == "approve":
            target.role = "member"
            target.send({"type": "approved", "role": "member", "peers": self._roster(target)})
            self._announce_arrival(target)
        else:
            target.send({"type": "rejected", "reason": "the host declined the request to join"})
            target.conn.close(CLOSE_REJECTED, "rejected by the host")
            if target.addr:  # no reconnect-and-ask loop from that address
                self._cooldowns[(target.addr, seat.group.key)] = \
                    time.monotonic() + self.config.reject_cooldown_s
                if len(self._cooldowns) > 10000:
                    now = time.monotonic()
                    self._cooldowns = {k: t for k, t in self._cooldowns.items() if t > now}
            self._release(target)

    def _hello(self, seat: Seat, msg: dict, ref) -> None:
        path = msg.get("path")
        if path not in (None, "gpu", "cpu") or not isinstance(msg.get("name", ""), str) or \
                not isinstance(msg.get("state", ""), str):
            seat.send(_error("bad-message", 'hello: "name" and "state" are strings, "path" is '
                                            '"gpu" or "cpu"', ref))
            return
        if "name" in msg:
            seat.name = _clean_text(msg["name"], MAX_NAME) or seat.name
        if path:
            seat.path = path
        if "state" in msg:
            seat.state = _clean_text(msg["state"], MAX_STATE)
        # A pending peer's request stays the one outstanding request: its new name shows when
        # it is approved. An admitted peer's update goes out at most once per hello_min_s,
        # carrying the latest entry (a flood of hellos costs the group nothing more).
        if seat.admitted and seat.update_due is None:
            loop = asyncio.get_running_loop()
            wait = seat.updated_at + self.config.hello_min_s - loop.time()
            if wait <= 0:
                self._send_update(seat)
            else:
                seat.update_due = loop.call_later(wait, self._send_update, seat)

    def _send_update(self, seat: Seat) -> None:
        seat.update_due = None
        seat.updated_at = asyncio.get_running_loop().time()
        if seat.admitted and seat.conn and not seat.released:  # a delta, not the roster
            self._broadcast(self._members(seat.group), {"type": "peer-updated",
                                                        "peer": seat.info()})

    # ---- who sees whom --------------------------------------------------------------------

    @staticmethod
    def _members(group: Group) -> list[Seat]:
        return [s for s in group.seats.values() if s.admitted and s.conn]

    def _roster(self, viewer: Seat) -> list[dict]:
        """The peers `viewer` may know of, itself included; a pending peer sees only itself."""
        if not viewer.admitted:
            return [viewer.info()]
        return [s.info() for s in self._members(viewer.group)]

    def _viewers(self, seat: Seat) -> list[Seat]:
        """Who is told about `seat` coming and going: members, or for a pending seat the host."""
        if seat.admitted:
            return [s for s in self._members(seat.group) if s is not seat]
        return [s for s in self._members(seat.group) if s.role == "host"]

    @staticmethod
    def _join_request(seat: Seat) -> dict:
        return {"type": "join-request", "peer": {"id": seat.id, "name": seat.name}}

    def _announce_arrival(self, seat: Seat) -> None:
        if seat.admitted:
            message = {"type": "peer-joined", "peer": seat.info()}
        else:
            message = self._join_request(seat)
        self._broadcast(self._viewers(seat), message)
        if seat.role == "host":  # a host that (re)connects is owed the open requests
            for other in seat.group.seats.values():
                if not other.admitted and other.conn:
                    seat.send(self._join_request(other))

    @staticmethod
    def _broadcast(seats: list[Seat], message: dict) -> None:
        text = json.dumps(message)
        for seat in seats:
            seat.send(text)


_SECRET_PARAM = re.compile(r"\b(token|room)=[^&\s\"']*")


class RedactSecrets(logging.Filter):
    """Keeps reconnect tokens (enough to take over an identity, host role included) and room
    codes out of the server's logs: uvicorn logs each WebSocket's path with its query string."""

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


def make_room_router() -> APIRouter:
    """POST /api/room: a new room code made by the server, 24 characters of base32 (120 bits):
    unguessable, unlike a chosen word (README "Rooms"). Nothing is stored: the first to
    connect with it is its host, and only its creator has it."""
    room_router = APIRouter()

    @room_router.post("/api/room")
    async def new_room() -> dict:
        return {"room": base64.b32encode(secrets.token_bytes(15)).decode().lower()}

    return room_router


def make_signaling_router(hub: SignalingHub | None = None) -> APIRouter:
    """The APIRouter with the WebSocket route /signal over `hub` (a new one from the
    environment when None). Its only route: nothing lists rooms, codes or peers."""
    hub = hub or SignalingHub()
    install_log_redaction()
    signal_router = APIRouter()

    @signal_router.websocket("/signal")
    async def signal(websocket: WebSocket) -> None:
        await hub.serve(websocket)

    signal_router.hub = hub  # for tests and the app's status readouts
    return signal_router


def make_app(hub: SignalingHub | None = None) -> FastAPI:
    """A FastAPI app serving only /signal (tests, the load benchmark)."""
    app = FastAPI()
    app.include_router(make_signaling_router(hub))
    return app


router = make_signaling_router()
