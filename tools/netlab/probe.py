"""Measure a lab path with plain sockets (the harness's own test, tests/test_netlab.py, and a
sanity line in the bench): UDP round trips and a TCP transfer's rate.

    python -m tools.netlab.probe echo ADDR PORT            UDP echo server (until killed)
    python -m tools.netlab.probe rtt ADDR PORT COUNT       -> JSON {"rtt_ms": [...], "lost": n}
    python -m tools.netlab.probe sink ADDR PORT            TCP: one connection read to EOF
                                                           -> JSON {"bytes": n, "seconds": s}
    python -m tools.netlab.probe source ADDR PORT BYTES    TCP: send BYTES and close
"""
from __future__ import annotations

import json
import select
import socket
import sys
import time

PROBE_TIMEOUT_S = 2.0


def echo(addr: str, port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    print("ready", flush=True)
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(data, peer)


def rtt(addr: str, port: int, count: int, gap_s: float = 0.005) -> dict:
    """count probes, one every gap_s (small, so they never queue), each timed by its answer; one
    with no answer PROBE_TIMEOUT_S after the last was sent counts as lost."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    sent_at, out = {}, {}

    def drain(until: float, stop_when_all: bool = False) -> None:
        while not (stop_when_all and len(out) == len(sent_at)):
            left = until - time.monotonic()
            if left <= 0 or not select.select([s], [], [], left)[0]:
                return
            data, _ = s.recvfrom(2048)
            k = int.from_bytes(data[:4], "big")
            if k in sent_at and k not in out:
                out[k] = (time.monotonic() - sent_at[k]) * 1000

    for k in range(count):
        sent_at[k] = time.monotonic()
        s.sendto(k.to_bytes(4, "big") + b"x" * 60, (addr, port))
        drain(time.monotonic() + gap_s)
    drain(time.monotonic() + PROBE_TIMEOUT_S, stop_when_all=True)
    return {"rtt_ms": [out[k] for k in sorted(out)], "lost": count - len(out)}


def sink(addr: str, port: int) -> dict:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    n, t0 = 0, None
    while chunk := conn.recv(1 << 16):
        if t0 is None:
            t0 = time.monotonic()
        n += len(chunk)
    return {"bytes": n, "seconds": time.monotonic() - (t0 or time.monotonic())}


def source(addr: str, port: int, total: int) -> None:
    with socket.create_connection((addr, port), timeout=30) as s:
        block = b"\0" * (1 << 16)
        left = total
        while left > 0:
            s.sendall(block[:min(left, len(block))])
            left -= min(left, len(block))


def main(argv: list[str]) -> None:
    cmd, addr, port, *rest = argv
    if cmd == "echo":
        echo(addr, int(port))
    elif cmd == "rtt":
        print(json.dumps(rtt(addr, int(port), int(rest[0]))))
    elif cmd == "sink":
        print(json.dumps(sink(addr, int(port))), flush=True)
    elif cmd == "source":
        source(addr, int(port), int(rest[0]))
    else:
        raise SystemExit(f"unknown probe command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
