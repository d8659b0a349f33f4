"""Proxy trust and client addresses, for every part of the app that limits or groups by client
(signaling's network groups and per-client caps, the stored run's upload slots, the raw
connection guard).

    trusted = trusted_proxies_from_env()          # DAISY_TRUSTED_PROXIES
    nets = networks(trusted)
    ip = client_ip(headers, peer_host, nets)      # behind a trusted proxy: the client it names
    address_key(ip)                               # one client, for per-client limits
    network_key(ip, salt)                         # its network group (a salted hash)

X-Forwarded-For is believed only from a trusted proxy, and then only its rightmost entry that
is not itself a trusted proxy (README "Serving over HTTPS"; docs/PROTOCOL.md "Groups").
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os

LOOPBACK_PROXIES = ("127.0.0.0/8", "::1")
SPACE_PROXIES = ("10.0.0.0/8",)  # a Hugging Face Space's proxy reaches the app from here

# Private, loopback and link-local ranges: all of them form one "local network" group.
LOCAL_NETS = [ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "::1/128", "fc00::/7", "fe80::/10")]


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


def networks(trusted) -> tuple:
    """Addresses or networks as text -> ip_network objects, for is_trusted / client_ip."""
    return tuple(ipaddress.ip_network(t, strict=False) for t in trusted)


def is_trusted(ip, nets) -> bool:
    return ip is not None and any(ip.version == n.version and ip in n for n in nets)


def parse_ip(text: str):
    """"v4", "v4:port", "v6", "[v6]:port" -> an ip_address (IPv4-mapped IPv6 as IPv4), or None."""
    if text.startswith("["):  # "[v6]:port"
        text = text[1:text.find("]")]
    elif text.count(":") == 1:  # "v4:port"
        text = text.split(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    return ip.ipv4_mapped or ip if ip.version == 6 else ip


def client_ip(headers, client_host: str | None, trusted=()):
    """The caller's address. The socket's peer, unless that peer is a trusted proxy (trusted:
    networks): then the rightmost X-Forwarded-For entry that is not itself a trusted proxy
    (each proxy appends the address it was reached from; entries left of that are whatever
    the client claimed). None when nothing parses."""
    peer = parse_ip(client_host or "")
    if not is_trusted(peer, trusted):
        return peer
    entries = ",".join(headers.getlist("x-forwarded-for")).split(",")
    found = peer
    for text in reversed(entries):
        ip = parse_ip(text.strip())
        if ip is None:  # garbage where an address should be: believe nothing further left
            break
        found = ip
        if not is_trusted(ip, trusted):
            break
    return found


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
