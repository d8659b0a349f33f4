"""Signaling load benchmark: N concurrent clients on loopback, grouped into rooms (host approves
everyone) and network groups (X-Forwarded-For), all relaying to their group-mates.

Per run: a fresh server subprocess (uvicorn, daisy.space.signaling.routes.make_app), clients in this process.
Reports relay latency p50/p99 (send -> receive, one clock), delivered messages/s, server RSS
(/proc/PID/status), and counts of dropped, duplicated and misrouted messages. Median of --runs.

    python bench/bench_signaling.py              # print the table
    python bench/bench_signaling.py --write      # also update "Signaling load" in TEST_RESULTS.md
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Signaling load"
COMPRESSION = "deflate"  # what browsers offer; --no-deflate turns it off


APPS = {"daisy": ["daisy.space.signaling.routes:make_app"],  # the real server
        "bare": ["--app-dir", "bench", "bench_signaling:make_bare_app"]}  # the baseline


def make_bare_app():
    """Baseline: the same uvicorn + FastAPI stack with the least relay that works (no groups,
    checks, outboxes or keep-alive): what the harness and this machine cost on their own."""
    app, sockets = FastAPI(), {}

    @app.websocket("/signal")
    async def bare(ws: WebSocket) -> None:
        await ws.accept()
        peer_id = os.urandom(4).hex()
        sockets[peer_id] = ws
        await ws.send_text(json.dumps({"type": "welcome", "peerId": peer_id, "role": "member"}))
        try:
            while True:
                msg = json.loads(await ws.receive_text())
                target = sockets.get(msg.get("to"))
                if target is not None:
                    await target.send_text(json.dumps({"type": "relay", "from": peer_id,
                                                       "data": msg["data"]}))
        except WebSocketDisconnect:
            pass
        finally:
            del sockets[peer_id]
    return app


def start_server(app: str) -> tuple[subprocess.Popen, int]:
    """uvicorn on a socket bound here (no port race), handed over by file descriptor."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    # every bench client connects from 127.0.0.1: lift the per-address room-join limit
    # (docs/PROTOCOL.md), which would otherwise refuse all but the first 20 room joins
    env = {**os.environ, "DAISY_JOIN_PER_MIN": os.environ.get("DAISY_JOIN_PER_MIN", "1000000")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", *APPS[app], "--factory",
         "--fd", str(sock.fileno()), "--log-level", "warning", "--backlog", "1024"],
        cwd=ROOT, pass_fds=[sock.fileno()], env=env)
    sock.close()
    return proc, port


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


class BenchClient:
    def __init__(self, group: str, room: str | None, xff: str | None):
        self.group, self.room, self.xff = group, room, xff
        self.ready = asyncio.Event()
        self.latencies: list[float] = []
        self.seen: set[tuple[str, int]] = set()
        self.duplicates = self.misrouted = self.errors = 0
        self.sent = 0
        self.id = ""

    async def open(self, port: int) -> None:
        query = urlencode({"room": self.room}) if self.room else ""
        headers = {"X-Forwarded-For": self.xff} if self.xff else None
        self.ws = await connect(f"ws://127.0.0.1:{port}/signal?{query}", additional_headers=headers,
                                open_timeout=30, max_size=2**22,
                                compression=COMPRESSION)
        welcome = json.loads(await self.ws.recv())
        self.id, self.role = welcome["peerId"], welcome["role"]
        if self.role != "pending":
            self.ready.set()
        self.reader = asyncio.create_task(self.read())

    async def read(self) -> None:
        async for raw in self.ws:
            msg = json.loads(raw)
            kind = msg["type"]
            if kind == "relay":
                now = time.perf_counter()
                data = msg["data"]
                if msg["from"] != data["s"] or data["t"] != self.id:
                    self.misrouted += 1
                elif (data["s"], data["q"]) in self.seen:
                    self.duplicates += 1
                else:
                    self.seen.add((data["s"], data["q"]))
                    self.latencies.append(now - data["ts"])
            elif kind == "ping":
                await self.ws.send('{"type":"pong"}')
            elif kind == "join-request":
                await self.ws.send(json.dumps({"type": "approve", "peer": msg["peer"]["id"]}))
            elif kind == "approved":
                self.ready.set()
            elif kind == "error":
                self.errors += 1

    async def relay(self, mates: list[str], count: int, rate: float) -> None:
        await asyncio.sleep(hash(self.id) % 1000 / 1000 / rate)  # spread the send phases
        for q in range(count):
            to = mates[q % len(mates)]
            await self.ws.send(json.dumps({"type": "relay", "to": to, "data": {
                "s": self.id, "t": to, "q": q, "ts": time.perf_counter()}}))
            self.sent += 1
            if rate != float("inf"):
                await asyncio.sleep(1 / rate)


def plan_clients(n: int, room_size: int, net_size: int) -> list[BenchClient]:
    """Half the clients in rooms, half in network groups (one of them the loopback group)."""
    clients, i = [], 0
    while len(clients) < n // 2:
        clients += [BenchClient(f"room{i}", f"bench-room-{i}", None) for _ in range(room_size)]
        i += 1
    j = 0
    while len(clients) < n:
        xff = None if j == 0 else f"203.0.113.{j}"  # j == 0: no header, the loopback group
        clients += [BenchClient(f"net{j}", None, xff) for _ in range(net_size)]
        j += 1
    return clients[:n]


async def one_run(app: str, n: int, count: int, rate: float, room_size: int,
                  net_size: int) -> dict:
    from tests.app_server import stop_process   # here: uvicorn imports this file for the bare app
    proc, port = start_server(app)
    clients = plan_clients(n, room_size, net_size)
    try:
        for _ in range(200):  # wait for the server to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        hosts = [c for k, c in enumerate(clients) if c.room and (k == 0 or clients[k - 1].group != c.group)]
        await asyncio.gather(*(c.open(port) for c in hosts))  # hosts first: they own their rooms
        await asyncio.gather(*(c.open(port) for c in clients if c not in hosts))
        await asyncio.wait_for(asyncio.gather(*(c.ready.wait() for c in clients)), 30)
        groups: dict[str, list[str]] = {}
        for c in clients:
            groups.setdefault(c.group, []).append(c.id)
        start = time.perf_counter()
        server_cpu0, client_cpu0 = cpu_s(proc.pid), time.process_time()
        await asyncio.gather(*(c.relay([m for m in groups[c.group] if m != c.id], count, rate)
                               for c in clients))
        expected = sum(c.sent for c in clients)
        deadline = time.monotonic() + 10
        while sum(len(c.latencies) for c in clients) < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - start
        server_cpu = (cpu_s(proc.pid) - server_cpu0) / elapsed
        client_cpu = (time.process_time() - client_cpu0) / elapsed
        memory = rss_kib(proc.pid)
        for c in clients:
            await c.ws.close()
        latencies = sorted(x for c in clients for x in c.latencies)
        delivered = len(latencies)
        return {"clients": n, "sent": expected, "delivered": delivered,
                "dropped": expected - delivered, "duplicates": sum(c.duplicates for c in clients),
                "misrouted": sum(c.misrouted for c in clients),
                "errors": sum(c.errors for c in clients),
                "p50_ms": 1000 * latencies[len(latencies) // 2],
                "p99_ms": 1000 * latencies[min(delivered - 1, int(delivered * 0.99))],
                "msgs_per_s": delivered / elapsed, "rss_mib": memory["VmRSS"] / 1024,
                "peak_rss_mib": memory["VmHWM"] / 1024,
                "server_cpu": server_cpu, "client_cpu": client_cpu}
    finally:
        stop_process(proc)


def median_row(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def write_section(text: str) -> None:
    """Replace this benchmark's section of TEST_RESULTS.md, or append it; other sections stay."""
    path = ROOT / "TEST_RESULTS.md"
    old = path.read_text() if path.exists() else "# Test results\n"
    start = old.find(SECTION)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = old.find("\n## ", start + len(SECTION))
        new = old[:start] + text + ("\n" + old[nxt + 1:] if nxt >= 0 else "")
    path.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rates", default="5,20", help="paced loads: relays/s per client")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of a paced load")
    ap.add_argument("--no-deflate", action="store_true", help="clients offer no compression")
    ap.add_argument("--room-size", type=int, default=5)
    ap.add_argument("--net-size", type=int, default=10)
    ap.add_argument("--write", action="store_true", help="update TEST_RESULTS.md")
    args = ap.parse_args()
    global COMPRESSION
    COMPRESSION = None if args.no_deflate else "deflate"
    rates = [float(r) for r in args.rates.split(",")]
    loads = [(f"paced {r:g}/s", round(r * args.seconds), r) for r in rates]
    loads.append(("burst 50", 50, float("inf")))
    rows, load_avg = [], [os.getloadavg()[0]]
    for name, count, rate in loads:
        runs = {"daisy": [], "bare": []}
        for _ in range(args.runs):  # alternate server and baseline so drift hits both alike
            for app in runs:
                runs[app].append(asyncio.run(one_run(app, args.clients, count, rate,
                                                     args.room_size, args.net_size)))
                load_avg.append(os.getloadavg()[0])
                print(name, app, {k: round(v, 2) for k, v in runs[app][-1].items()}, flush=True)
        rows += [(name, app, median_row(r), r) for app, r in runs.items()]
    header = ("| load | server | relays sent | dropped | dup | misrouted | errors | p50 ms | p99 ms "
              "| msgs/s | server CPU | server RSS MiB (peak) |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    table = header + "".join(
        f"| {name} | {app} | {m['sent']:.0f} | {max(r['dropped'] for r in runs)} "
        f"| {max(r['duplicates'] for r in runs)} | {max(r['misrouted'] for r in runs)} "
        f"| {max(r['errors'] for r in runs)} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} "
        f"| {m['msgs_per_s']:.0f} | {m['server_cpu']:.2f} | {m['rss_mib']:.1f} ({m['peak_rss_mib']:.1f}) |\n"
        for name, app, m, runs in rows)
    ratios = "\n".join(
        f"- {name}: p50 {m['p50_ms'] / b['p50_ms']:.2f}x, p99 {m['p99_ms'] / b['p99_ms']:.2f}x, "
        f"msgs/s {m['msgs_per_s'] / b['msgs_per_s']:.2f}x of the baseline"
        for (name, _, m, _), (_, _, b, _) in zip(rows[::2], rows[1::2]))
    daisy_rows = [(name, m, runs) for name, app, m, runs in rows if app == "daisy"]
    def verdict_line(name: str, m: dict, runs: list[dict]) -> str:
        clean = not any(r["dropped"] or r["misrouted"] or r["duplicates"] for r in runs)
        if name.startswith("paced"):
            offered = m["clients"] * float(name.split()[1].rstrip("/s"))
            latency = (f"p99 {m['p99_ms']:.1f} ms ({'met' if m['p99_ms'] < 50 else 'NOT met'}; "
                       f"{offered:.0f} msgs/s offered nominally, {m['msgs_per_s']:.0f} delivered)")
        else:
            latency = "p99 is queueing here (capacity test, no target)"
        memory = f"peak RSS {m['peak_rss_mib']:.0f} MiB ({'met' if m['peak_rss_mib'] < 300 else 'NOT met'})"
        return f"- {name}: dropped/misrouted {'0' if clean else 'NOT 0'}, {latency}, {memory}"
    verdict = "\n".join(verdict_line(*row) for row in daisy_rows)
    print(table + "\n" + ratios + "\n" + verdict)
    load_text = f"{min(load_avg):.1f}-{max(load_avg):.1f}"
    print("1-min load average during the runs:", load_text)
    section = f"""{SECTION}

Method (`python bench/bench_signaling.py --write`):
- Machine: {os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, uvicorn with
  websockets-sansio, loopback; shared with other jobs (1-minute load average {load_text} during
  these runs). Client compression: {COMPRESSION or "none"} (browsers offer permessage-deflate).
- {args.clients} clients in one Python process: half in rooms of {args.room_size} (the host approves
  everyone), half in network groups of {args.net_size} told apart by `X-Forwarded-For` (one group
  without the header: loopback). Each client relays to its group-mates round-robin.
- Each relay carries sender, addressee, sequence number and send time, checked on arrival: the
  `from` stamp is the sender, the addressee is the receiver, each relay arrives exactly once.
  Latency: send -> receive on one clock, through the server (so it includes the clients' own
  event loop).
- Loads: "paced R/s": every client sends R relays/s for {args.seconds:g} s (the default rate limit is
  50/s). "burst 50": every client sends 50 relays back to back ({args.clients * 50} at once: latency
  there is queueing; msgs/s is the capacity).
- Baseline "bare": the same uvicorn + FastAPI stack with a minimal relay (no groups, checks,
  outbox or keep-alive), run alternately with the real server ("daisy"). {args.runs} runs of each per
  load, a fresh server subprocess per run; cells are medians, except dropped/dup/misrouted/errors
  (worst run). Server CPU: cores used by the server process during the load. RSS from
  `/proc/PID/status` (VmRSS after the load; VmHWM peak).
- Targets: zero dropped/misrouted, p99 < 50 ms, memory < 300 MB.

{table}
daisy vs. the baseline (same run, medians):
{ratios}

Where daisy is about 1.0x of bare, the time goes to the stack (uvicorn, websockets, deflate,
loopback syscalls) and to the one client process on a shared 2-core machine, not to the
signaling logic; a load the clients cannot offer in full shows as delivered < offered below.

Against the targets:
{verdict}
"""
    if args.write:
        write_section(section)
        print("updated", ROOT / "TEST_RESULTS.md")


if __name__ == "__main__":
    main()
