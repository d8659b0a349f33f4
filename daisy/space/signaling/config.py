"""SignalingConfig: every setting of the signaling server (limits: docs/PROTOCOL.md "Limits and
configuration"). Built explicitly, or from the environment with from_env: nothing here reads it
on import."""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field

from daisy.space.addresses import LOOPBACK_PROXIES, trusted_proxies_from_env
from daisy.space.env import env_number

DEFAULT_ICE_SERVERS = [{"urls": "stun:stun.l.google.com:19302"}]


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
    max_conn_per_addr: int = 64  # open sockets per client (behind a trusted proxy: the client's address)
    vouch_per_s: float = 10.0  # `vouch` reports per seat per second (sustained)
    vouch_burst: float = 20.0  # ... and at once
    vouch_keep: int = 64  # each seat's latest reports the server keeps (older ones are dropped)
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
            max_conn_per_addr=env_number(env, "DAISY_MAX_CONN_PER_ADDR", cls.max_conn_per_addr, int),
            ip_salt=salt.encode() if salt else secrets.token_bytes(16),
            trusted_proxies=trusted_proxies_from_env(env),
            ice_servers=ice_servers_from_env(env))
