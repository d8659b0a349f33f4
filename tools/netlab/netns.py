"""The network lab: each page in a network namespace of its own behind an emulated link, the app
in the root namespace (docs/ARCHITECTURE.md "Network lab").

    with Netlab([profile("home"), profile("far")]) as lab:
        lab.host_addr                  # "198.18.N.1": the app listens here (root namespace)
        lab.page_addr(0)               # "198.18.N.10": page 0's address inside its namespace
        lab.run(0, ["python3", ...])   # a command inside page 0's namespace
        lab.chromium(0, cpu=0)         # a Chromium wrapper for Playwright's executable_path

Addresses: one /24 of 198.18.0.0/15 (the benchmarking range) per lab, 198.18.N.0/24 with N
taken under a lock file, so labs of several processes never share one; only inside namespaces
this lab creates. Each page's namespace holds `lo` and the router's TUN device with the page's
address and the /24 as its only route: nothing outside the lab is reachable from a page. The
root namespace gets the app's side TUN (198.18.N.1/24) and an `unreachable` route for the /24
behind it, so if the router dies no packet for the lab's addresses leaves the machine.

Clean-up on any exit: the context manager's exit (exceptions), SIGTERM and SIGHUP turned into
SystemExit while a lab is open, and at any lab's start whatever a killed lab left behind (every
/24 whose lock is free again): namespaces, the route. The TUN devices live only
as long as the router process, which ends when its parent does.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from tools.netlab.profiles import Link

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCK_DIR = "/run/daisy-netlab"
CHROMIUM = "/usr/bin/chromium"
MAX_PAGES = 200


class NetlabUnavailable(RuntimeError):
    """This machine cannot host the lab (not root, no iproute2, no TUN, no namespaces)."""


def preflight() -> None:
    """Refuse, with the reason, where namespaces and TUN devices cannot be made."""
    need = ("the network lab needs Linux network namespaces and TUN devices: run as root, with "
            "iproute2's `ip` installed and /dev/net/tun present")
    if sys.platform != "linux":
        raise NetlabUnavailable(f"{need}; this is {sys.platform}")
    if os.geteuid() != 0:
        raise NetlabUnavailable(f"{need}; this process runs as uid {os.geteuid()}, not root")
    if shutil.which("ip") is None:
        raise NetlabUnavailable(f"{need}; `ip` is not on PATH (Debian: apt-get install iproute2)")
    if not os.path.exists("/dev/net/tun"):
        raise NetlabUnavailable(f"{need}; /dev/net/tun is missing")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise NetlabUnavailable(f"`ip {' '.join(args)}` failed: {out.stderr.strip() or out.returncode}")
    return out


def direction_spec(d) -> dict:
    return {"rate_bps": d.rate_bps, "delay_s": d.delay_s, "jitter_s": d.jitter_s, "loss": d.loss, "queue_s": d.queue_s}


def prefix_of(n: int) -> str:
    return f"198.{18 + n // 256}.{n % 256}"


def lock_net(n: int):
    """The lock of 198.18.N.0/24 -> its open file when this process got it, else None."""
    f = open(os.path.join(LOCK_DIR, f"{n}.lock"), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def sweep_leftovers(own: int) -> None:
    """What killed labs left (SIGKILL gives no chance to clean): the namespaces and route of
    every /24 whose lock nobody holds, besides our own (`own`, locked by us)."""
    names = [line.split(" ", 1)[0] for line in ip("netns", "list", check=False).stdout.splitlines()]
    nets = {}
    for name in names:
        head = name.split("-", 1)[0]
        if name.startswith("dnl") and head[3:].isdigit():
            nets.setdefault(int(head[3:]), []).append(name)
    for n in sorted(set(nets) | {own}):
        f = None if n == own else lock_net(n)
        if n != own and f is None:
            continue                              # a live lab's
        for name in nets.get(n, []):
            ip("netns", "del", name, check=False)
        ip("route", "del", "unreachable", f"{prefix_of(n)}.0/24", check=False)
        if f is not None:
            f.close()


class Netlab:
    def __init__(self, links: list[Link], seed: int = 0):
        if not 1 <= len(links) <= MAX_PAGES:
            raise ValueError(f"a lab holds 1..{MAX_PAGES} pages, not {len(links)}")
        self.links = list(links)
        self.seed = seed
        self.net = None               # N: 198.18.N.0/24 for N < 256, 198.19.(N-256).0/24 above; locked
        self.lock = None
        self.router = None
        self.tmp = None
        self.made_ns: list[str] = []
        self.saved_signals = {}
        self.io = threading.Lock()    # one command to the router at a time

    # ---- names --------------------------------------------------------------------------------
    def prefix(self) -> str:
        return prefix_of(self.net)

    @property
    def host_addr(self) -> str:
        return f"{self.prefix()}.1"

    def page_addr(self, i: int) -> str:
        return f"{self.prefix()}.{10 + i}"

    def ns(self, i: int) -> str:
        return f"dnl{self.net}-{i}"

    def tun(self, i: int | None) -> str:
        return f"dnl{self.net}h" if i is None else f"dnl{self.net}p{i}"

    # ---- up -----------------------------------------------------------------------------------
    def __enter__(self) -> "Netlab":
        preflight()
        self.trap_signals()
        try:
            self.take_subnet()
            self.start_router()
            self.configure()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def trap_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self.saved_signals[sig] = signal.signal(sig, self.on_signal)

    @staticmethod
    def on_signal(signum, _frame):
        raise SystemExit(f"network lab: signal {signum}, cleaning up")

    def take_subnet(self) -> None:
        os.makedirs(LOCK_DIR, exist_ok=True)
        for n in range(1, 511):
            if n % 256 in (0, 255):
                continue
            f = lock_net(n)
            if f is not None:
                self.lock, self.net = f, n
                sweep_leftovers(n)
                return
        raise NetlabUnavailable(f"every /24 of 198.18.0.0/15 is held by another lab (locks in {LOCK_DIR})")

    def start_router(self) -> None:
        spec = {"seed": self.seed, "host": {"tun": self.tun(None), "addr": self.host_addr},
                "pages": [{"tun": self.tun(i), "addr": self.page_addr(i), "up": direction_spec(l.up),
                           "down": direction_spec(l.down)} for i, l in enumerate(self.links)]}
        self.router = subprocess.Popen([sys.executable, "-m", "tools.netlab.router"], cwd=ROOT, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.router.stdin.write(json.dumps(spec) + "\n")
        self.router.stdin.flush()
        line = self.router.stdout.readline().strip()
        if line != "ready":
            raise NetlabUnavailable(f"the lab's router did not start (exit {self.router.poll()}): {line!r}")

    def configure(self) -> None:
        prefix = f"{self.prefix()}.0/24"
        ip("route", "add", "unreachable", prefix, "metric", "4000")
        ip("addr", "add", f"{self.host_addr}/24", "dev", self.tun(None))
        with contextlib.suppress(OSError):          # IPv4 only on the app's side as well
            with open(f"/proc/sys/net/ipv6/conf/{self.tun(None)}/disable_ipv6", "w") as f:
                f.write("1")
        ip("link", "set", self.tun(None), "up")
        for i in range(len(self.links)):
            ns = self.ns(i)
            ip("netns", "add", ns)
            self.made_ns.append(ns)
            ip("link", "set", self.tun(i), "netns", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", f"{self.page_addr(i)}/24", "dev", self.tun(i))
            ip("-n", ns, "link", "set", self.tun(i), "up")
            # IPv4 only: no IPv6 link-local chatter or candidates through the lab
            self.run(i, ["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"], check=False)

    # ---- use ----------------------------------------------------------------------------------
    def argv(self, i: int, argv: list[str], cpu: int | None = None) -> list[str]:
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
        return ["ip", "netns", "exec", self.ns(i), *pin, *argv]

    def run(self, i: int, argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.argv(i, argv), check=check, **kw)

    def popen(self, i: int, argv: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(i, argv), **kw)

    def chromium(self, i: int, cpu: int | None = None) -> str:
        """A wrapper script that starts /usr/bin/chromium inside page i's namespace (pinned to
        `cpu` when given): Playwright's executable_path. Its pipe to the browser survives."""
        if self.tmp is None:
            self.tmp = tempfile.mkdtemp(prefix=f"daisy-netlab-{self.net}-")
        path = os.path.join(self.tmp, f"chromium-{i}-{cpu}")
        pin = f"taskset -c {int(cpu)} " if cpu is not None else ""
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\nexec ip netns exec {self.ns(i)} {pin}{CHROMIUM} "$@"\n')
        os.chmod(path, 0o755)
        return path

    def stats(self) -> dict:
        """The router's counters: per page, up and down: sent, queue_drops, lost."""
        with self.io:
            self.router.stdin.write("stats\n")
            self.router.stdin.flush()
            return json.loads(self.router.stdout.readline())

    # ---- down ---------------------------------------------------------------------------------
    def close(self) -> None:
        if self.router is not None:
            with contextlib.suppress(OSError):
                self.router.stdin.close()            # the router's signal to end
            try:
                self.router.wait(5)
            except subprocess.TimeoutExpired:
                self.router.kill()
                self.router.wait()
            with contextlib.suppress(OSError):
                self.router.stdout.close()
            self.router = None
        for ns in self.made_ns:
            ip("netns", "del", ns, check=False)
        self.made_ns.clear()
        if self.net is not None:
            ip("route", "del", "unreachable", f"{self.prefix()}.0/24", check=False)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        if self.lock is not None:
            self.lock.close()
            self.lock = None
        for sig, handler in self.saved_signals.items():
            signal.signal(sig, handler)
        self.saved_signals.clear()
