"""The network lab's router: one process that owns a TUN device per page (moved into the page's
namespace by netns.py) and one for the app's side (the root namespace), and forwards IPv4
packets between them through the pages' emulated links (profiles.py `LinkDirection`: rate,
queue, loss, delay, jitter). This kernel has no `netem`, so delay and loss need a userspace
path (docs/ARCHITECTURE.md "Network lab").

    python -m tools.netlab.router            spec (JSON, one line) on stdin, then commands

Spec: {"seed": int, "host": {"tun": name, "addr": "198.18.N.1"},
       "pages": [{"tun": name, "addr": "198.18.N.11", "up": {Direction}, "down": {Direction}}]}
It creates the TUN devices, prints "ready", then forwards until stdin closes (its parent is
gone: the devices vanish with this process). A line "stats" on stdin prints one JSON line of
counters. Only packets between the lab's own addresses are forwarded; anything else is dropped.
"""
from __future__ import annotations

import ctypes
import fcntl
import heapq
import itertools
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time

from tools.netlab.profiles import Direction, LinkDirection

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
PR_SET_PDEATHSIG = 1
READ_BURST = 256                  # packets read from one device before looking at the others


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass                      # stdin's EOF still ends us


class Router:
    def __init__(self, spec: dict):
        rng = random.Random(spec.get("seed", 0))
        self.host_fd = open_tun(spec["host"]["tun"])
        self.fds = [self.host_fd]
        self.addr = {socket.inet_aton(spec["host"]["addr"]): 0}
        self.up, self.down = [None], [None]          # index 0: the app's side, unlimited
        for i, page in enumerate(spec["pages"], start=1):
            self.fds.append(open_tun(page["tun"]))
            self.addr[socket.inet_aton(page["addr"])] = i
            self.up.append(LinkDirection(Direction(**page["up"]), random.Random(rng.random())))
            self.down.append(LinkDirection(Direction(**page["down"]), random.Random(rng.random())))
        self.heap: list = []
        self.seq = itertools.count()
        self.foreign = self.write_errors = 0

    def path(self, src: int, dst: int) -> tuple:
        if src == 0:
            return (self.down[dst],)
        if dst == 0:
            return (self.up[src],)
        return (self.up[src], self.down[dst])

    def take(self, src: int, now: float) -> None:
        fd = self.fds[src]
        for _ in range(READ_BURST):
            try:
                pkt = os.read(fd, 65536)
            except BlockingIOError:
                return
            if len(pkt) < 20 or pkt[0] >> 4 != 4:
                continue                            # IPv6 and junk: the lab is IPv4 only
            dst = self.addr.get(pkt[16:20])
            if dst is None or dst == src or self.addr.get(pkt[12:16]) != src:
                self.foreign += 1                   # not between the lab's own addresses
                continue
            self.forward(self.path(src, dst), 0, now, dst, pkt)

    def forward(self, stages: tuple, k: int, at: float, dst: int, pkt: bytes) -> None:
        if k == len(stages):
            heapq.heappush(self.heap, (at, next(self.seq), None, 0, dst, pkt))
            return
        out = stages[k].admit(at, len(pkt))
        if out is not None:
            heapq.heappush(self.heap, (out, next(self.seq), stages, k + 1, dst, pkt))

    def due(self, now: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= now:
            at, _, stages, k, dst, pkt = heapq.heappop(heap)
            if stages is not None and k < len(stages):
                self.forward(stages, k, at, dst, pkt)
                continue
            try:
                os.write(self.fds[dst], pkt)
            except OSError:
                self.write_errors += 1

    def stats(self) -> dict:
        dirs = lambda ds: [{"sent": d.sent, "queue_drops": d.queue_drops, "lost": d.lost} for d in ds[1:]]
        return {"up": dirs(self.up), "down": dirs(self.down), "foreign": self.foreign,
                "write_errors": self.write_errors, "queued": len(self.heap)}

    def serve(self, control) -> None:
        ep = select.epoll()
        for i, fd in enumerate(self.fds):
            ep.register(fd, select.EPOLLIN)
        ep.register(control.fileno(), select.EPOLLIN)
        index = {fd: i for i, fd in enumerate(self.fds)}
        while True:
            timeout = max(0.0, self.heap[0][0] - time.monotonic()) if self.heap else 1.0
            for fd, _ in ep.poll(timeout):
                if fd in index:
                    self.take(index[fd], time.monotonic())
                    continue
                line = control.readline()
                if not line:
                    return                          # the harness is gone
                if line.strip() == "stats":
                    print(json.dumps(self.stats()), flush=True)
            self.due(time.monotonic())


def main() -> None:
    die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    spec = json.loads(sys.stdin.readline())
    router = Router(spec)
    print("ready", flush=True)
    router.serve(sys.stdin)


if __name__ == "__main__":
    main()
