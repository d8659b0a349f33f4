"""The attacks of issues 13 and 19, bounded, against `python app.py` on 127.0.0.1: what each costs the
server (CPU seconds of the server and its child processes, peak RSS) and what honest users see
meanwhile (p99 of a room pair's relay round trip, of GET /js/peer/ui.js and of GET /data/info).

    python bench/bench_attacks.py                  # this tree
    python bench/bench_attacks.py --tree DIR       # another checkout (e.g. the code before)

One server per run, attacks in a fixed order (the checkpoint attack last: before the fix it
leaves the server wedged). Peak RSS is reset before each attack (/proc/PID/clear_refs). Prints
one Markdown table row per attack.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import io
import multiprocessing
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.app_server import app_process  # noqa: E402
from tests.signal_client import compressed_frames_attack  # noqa: E402


def tree_pids(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def cpu_s(root: int) -> float:
    total = 0
    for pid in tree_pids(root):
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in f[11:15])   # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def p99(values) -> str:
    if not values:
        return "no answer"
    v = sorted(values)
    return f"{v[max(0, -(-len(v) * 99 // 100) - 1)] * 1000:.0f}"


class Honest:
    """A room pair relaying every 50 ms, plus GET /js/peer/ui.js and /data/info every 50 ms."""

    def __init__(self, port: int):
        self.port = port
        self.relay, self.js, self.data = [], [], []
        self.failures = 0

    async def start(self):
        base = f"ws://127.0.0.1:{self.port}/signal?room=honest-{os.urandom(4).hex()}"
        self.host = await connect(base)
        json.loads(await self.host.recv())
        self.member = await connect(base)
        mid = json.loads(await self.member.recv())["peerId"]
        while json.loads(await self.host.recv())["type"] != "join-request":
            pass
        await self.host.send(json.dumps({"type": "approve", "peer": mid}))
        while json.loads(await self.member.recv())["type"] != "approved":
            pass
        self.mid = mid
        self.stop = asyncio.Event()
        self.tasks = [asyncio.create_task(self._relay()), asyncio.create_task(self._http())]

    async def _relay(self):
        n = 0
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                await self.host.send(json.dumps({"type": "relay", "to": self.mid, "data": n}))
                while True:
                    m = json.loads(await asyncio.wait_for(self.member.recv(), 5))
                    if m["type"] == "ping":
                        await self.member.send('{"type": "pong"}')
                    elif m["type"] == "relay" and m["data"] == n:
                        break
                self.relay.append(time.perf_counter() - t0)
            except Exception:  # noqa: BLE001  (a timeout or a closed socket: counted)
                self.failures += 1
                await asyncio.sleep(0.5)
            n += 1
            await asyncio.sleep(0.05)

    async def _http(self):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=5) as c:
            while not self.stop.is_set():
                for path, out in (("/js/peer/ui.js", self.js), ("/data/info", self.data)):
                    t0 = time.perf_counter()
                    try:
                        if (await c.get(path)).status_code == 200:
                            out.append(time.perf_counter() - t0)
                        else:
                            self.failures += 1
                    except Exception:  # noqa: BLE001
                        self.failures += 1
                await asyncio.sleep(0.05)

    def reset(self):
        self.relay, self.js, self.data, self.failures = [], [], [], 0

    async def close(self):
        self.stop.set()
        for t in self.tasks:
            t.cancel()
        for ws in (self.host, self.member):
            ws.transport.abort()


# ---- the attacks (each returns a short note) ------------------------------------------------

async def hello_flood(port):
    """10 sockets in one network group, 40 hello/s each for 3 s; frames the server sent out."""
    socks = [await connect(f"ws://127.0.0.1:{port}/signal", max_size=2**22) for _ in range(10)]
    received = [0]

    async def drain(ws):
        try:
            async for _ in ws:
                received[0] += 1
        except Exception:  # noqa: BLE001
            pass

    drains = [asyncio.create_task(drain(ws)) for ws in socks]

    async def flood(ws, i):
        for n in range(120):
            try:
                await ws.send(json.dumps({"type": "hello", "state": f"{i}-{n}"}))
            except Exception:  # noqa: BLE001
                return
            await asyncio.sleep(1 / 40)

    await asyncio.gather(*(flood(ws, i) for i, ws in enumerate(socks)))
    await asyncio.sleep(1)
    for ws in socks:
        ws.transport.abort()
    for d in drains:
        d.cancel()
    return f"1,200 hellos -> {received[0]:,} frames received by the 10"


async def join_probe(port):
    """300 connections to distinct room codes, as fast as they go."""
    roles = {}
    t0 = time.perf_counter()
    for n in range(300):
        try:
            async with connect(f"ws://127.0.0.1:{port}/signal?room=probe-{n}") as ws:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 3))
                roles[msg["role"]] = roles.get(msg["role"], 0) + 1
        except Exception as e:  # noqa: BLE001
            code = getattr(getattr(e, "rcvd", None), "code", type(e).__name__)
            roles[code] = roles.get(code, 0) + 1
    rate = 300 / (time.perf_counter() - t0)
    return f"{rate:.0f} probes/s; answers: " + ", ".join(f"{k}: {v}" for k, v in roles.items())


async def idle_sockets(port):
    """100 silent + 100 half-header raw connections held 15 s; how many the server closed."""
    socks = []
    for n in range(100):
        for half in (False, True):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                continue
            if half:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            s.setblocking(False)
            socks.append(s)
    await asyncio.sleep(15)
    closed = 0
    for s in socks:
        try:
            closed += s.recv(1024) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    return f"{len(socks)} opened, {closed} closed by the server within 15 s"


async def big_frames(port):
    """6 sockets x 2 frames of 15 MB (deflate: ~15 KB on the wire)."""
    codes = await compressed_frames_attack(f"ws://127.0.0.1:{port}")
    return f"close codes {sorted(set(map(str, codes)))}"


def dag_checkpoint() -> bytes:
    import numpy as np
    from daisy.files.checkpoint import param_shapes, save_checkpoint
    cfg = dict(width=16, seq_len=16, batch=2, steps=100, lr_x1000=10, layers=1, heads=4, seed=3)
    z = {n: np.zeros(s) for n, s in param_shapes(cfg).items()}
    blob = save_checkpoint(None, config=cfg, params=z, step=1, adam_m=z, adam_v=z)
    entries = {}
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        for i in zf.infolist():
            entries[i.filename] = zf.read(i)
    put = lambda i: b"r" + struct.pack("<I", i)
    get = lambda i: b"j" + struct.pack("<I", i)
    dag = b"]" + put(0)
    for d in range(48):
        dag += b"0](" + get(d) + get(d) + b"e" + put(d + 1)
    key = b"X" + struct.pack("<I", 5) + b"extra"
    x = b"X" + struct.pack("<I", 1) + b"x"
    pkl = entries["archive/data.pkl"]
    entries["archive/data.pkl"] = pkl[:-2] + key + b"}(" + x + dag + b"u" + b"u."
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


async def checkpoint_dag(port):
    """12 uploads of a checkpoint whose `extra` is a 2**48-leaf list DAG (a few KB)."""
    body = dag_checkpoint()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20) as c:
        async def one():
            try:
                return (await c.post("/api/load", content=body)).status_code
            except Exception:  # noqa: BLE001
                return "no answer in 20 s"
        codes = await asyncio.gather(*(one() for _ in range(12)))
    codes = [str(c) for c in codes]
    return "answers: " + ", ".join(f"{k} x{codes.count(k)}" for k in sorted(set(codes)))


# stored-run bodies of the attacked tree (its own state codec), steps 1..STORE_STEPS: made in
# main() before the attack processes fork
STORE_STEPS = 15
STORE_BODIES: list[bytes] = []


def state_bodies(tree: str) -> list[bytes]:
    """Tiny whole state bodies at steps 1..STORE_STEPS, encoded by `tree`'s own code."""
    code = ("import sys, numpy as np\n"
            "from daisy.config import Config\n"
            "from daisy.hashing import weight_hash\n"
            "from daisy.model import param_shapes\n"
            "from daisy.files.state_codec import encode_state\n"
            "cfg = Config(width=16, seq_len=16, batch=2, layers=1, heads=4, steps=100, seed=3)\n"
            "rng = np.random.default_rng(1)\n"
            "p = {n: rng.standard_normal(s) for n, s in param_shapes(cfg).items()}\n"
            f"for step in range(1, {STORE_STEPS} + 1):\n"
            "    b = encode_state(config=cfg, step=step, params=p, adam_m=p, adam_v=p, adam_t=step,\n"
            "                     weight_hash=weight_hash(p))\n"
            "    sys.stdout.buffer.write(len(b).to_bytes(8, 'little') + b)\n")
    raw = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, check=True).stdout
    bodies, at = [], 0
    while at < len(raw):
        n = int.from_bytes(raw[at:at + 8], "little")
        bodies.append(raw[at + 8:at + 8 + n])
        at += 8 + n
    return bodies


async def signal_token(port: int, xff: str):
    """A /signal socket whose client is `xff` (loopback is a trusted proxy) -> (socket, token)."""
    ws = await connect(f"ws://127.0.0.1:{port}/signal", additional_headers={"X-Forwarded-For": xff})
    return ws, json.loads(await ws.recv())["token"]


async def slow_uploads(port):
    """Two stored-run uploads from two other groups, each declaring 1 MB and sending 1 byte/s,
    while the victim group's leader stores its run every second for 14 s."""
    victim_ws, victim = await signal_token(port, "203.0.113.60")
    slow = [await signal_token(port, xff) for xff in ("198.51.100.61", "198.51.100.62")]

    async def trickle(token, xff):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"POST /api/group-run?run=9&final=0 HTTP/1.1\r\nHost: x\r\nX-Daisy-Token: {token}\r\n"
                     f"X-Forwarded-For: {xff}\r\nContent-Length: 1000000\r\n\r\n".encode())
        answer = asyncio.create_task(reader.read(200))
        t0 = time.perf_counter()
        for _ in range(15):
            writer.write(b"\0")
            done, _ = await asyncio.wait({answer}, timeout=1.0)
            if done:
                writer.close()
                status = answer.result().split(b"\r\n", 1)[0].decode().removeprefix("HTTP/1.1 ")
                return f"{status} after {time.perf_counter() - t0:.0f} s"
        writer.close()
        answer.cancel()
        return "still held after 15 s"

    async def victim_stores():
        codes = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            await asyncio.sleep(0.5)                    # the slow uploads hold their slots first
            for step, body in enumerate(STORE_BODIES[:14], 1):
                r = await c.post(f"/api/group-run?run=1&final=0", content=body,
                                 headers={"X-Daisy-Token": victim, "X-Forwarded-For": "203.0.113.60"})
                codes.append(str(r.status_code))
                await asyncio.sleep(1)
        return codes

    *held, codes = await asyncio.gather(*(trickle(t, x) for (_, t), x in zip(slow, ("198.51.100.61", "198.51.100.62"))),
                                        victim_stores())
    for ws, _ in [(victim_ws, None), *slow]:
        ws.transport.abort()
    stores = ", ".join(f"{k} x{codes.count(k)}" for k in sorted(set(codes)))
    return f"victim's 14 stores: {stores}; the slow uploads: {'; '.join(held)}"


async def proxied_sockets(port):
    """One client behind the trusted proxy (loopback) opens /signal sockets as fast as 8
    workers go for 8 s, keeping those admitted; then 5 other clients try to connect."""
    kept, closes = [], {}
    stop = time.perf_counter() + 8

    async def worker():
        while time.perf_counter() < stop:
            try:
                ws = await connect(f"ws://127.0.0.1:{port}/signal", open_timeout=3,
                                   additional_headers={"X-Forwarded-For": "203.0.113.80"})
                json.loads(await asyncio.wait_for(ws.recv(), 3))
                kept.append(ws)
            except Exception as e:  # noqa: BLE001
                code = getattr(getattr(e, "rcvd", None), "code", type(e).__name__)
                closes[code] = closes.get(code, 0) + 1
    await asyncio.gather(*(worker() for _ in range(8)))
    others = 0
    for i in range(5):
        try:
            ws = await connect(f"ws://127.0.0.1:{port}/signal", open_timeout=3,
                               additional_headers={"X-Forwarded-For": f"198.51.100.{90 + i}"})
            others += json.loads(await asyncio.wait_for(ws.recv(), 3))["type"] == "welcome"
            ws.transport.abort()
        except Exception:  # noqa: BLE001
            pass
    for ws in kept:
        ws.transport.abort()
    refused = ", ".join(f"{k}: {v:,}" for k, v in sorted(closes.items(), key=lambda kv: str(kv[0])))
    return f"the client: {len(kept)} admitted, refused {refused}; then 5 other clients: {others} admitted"


def _attack_in_child(name: str, port: int) -> str:
    """Runs in a separate process: the attacker's own CPU (compressing 15 MB frames, opening
    sockets) must not stall the honest probes' event loop and pass for server latency."""
    return asyncio.run(asyncio.wait_for(dict(ATTACKS)[name](port), 60))


ATTACKS = [("hello flood", hello_flood), ("room-code probing", join_probe),
           ("idle / half-header TCP", idle_sockets), ("compressed 15 MB frames", big_frames),
           ("slow stored-run uploads", slow_uploads), ("sockets behind the proxy", proxied_sockets),
           ("checkpoint DAG upload", checkpoint_dag)]


async def main_async(args):
    STORE_BODIES[:] = state_bodies(args.tree)
    with tempfile.TemporaryDirectory(prefix="daisy-attacks-") as tmp, \
            app_process(tmp, "attacks", {"HF_HUB_OFFLINE": "1"}, tree=args.tree) as (proc, base):
        await attack_all(args, proc, int(base.rsplit(":", 1)[1]))


async def attack_all(args, proc, port):
    """The honest probes alone for 5 s, then each attack: one table row each."""
    honest = Honest(port)
    await honest.start()
    await asyncio.sleep(1)
    honest.reset()
    Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
    c0 = cpu_s(proc.pid)
    await asyncio.sleep(5)
    print("| attack | what happened | server CPU s | peak RSS MiB | relay p99 ms | /js/ p99 ms "
          "| /data/info p99 ms | honest failures |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| none (5 s of the honest probes alone) | | {cpu_s(proc.pid) - c0:.2f} | "
          f"{hwm_mib(proc.pid):.0f} | {p99(honest.relay)} | {p99(honest.js)} | "
          f"{p99(honest.data)} | {honest.failures} |")
    pool = concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("fork"))
    for name, attack in ATTACKS:
        if name not in args.only:
            continue
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
        c0 = cpu_s(proc.pid)
        honest.reset()
        try:
            note = await asyncio.get_running_loop().run_in_executor(
                pool, _attack_in_child, name, port)
        except Exception as e:  # noqa: BLE001  (the attack's own timeout)
            note = f"attack did not finish in 60 s ({type(e).__name__})"
        await asyncio.sleep(0.5)
        print(f"| {name} | {note} | {cpu_s(proc.pid) - c0:.2f} | {hwm_mib(proc.pid):.0f} | "
              f"{p99(honest.relay)} | {p99(honest.js)} | {p99(honest.data)} | "
              f"{honest.failures} |", flush=True)
    await honest.close()
    pool.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tree", default=str(ROOT), help="checkout whose app.py to attack")
    ap.add_argument("--only", default=",".join(n for n, _ in ATTACKS),
                    help="comma-separated attack names")
    args = ap.parse_args()
    args.only = set(args.only.split(","))
    print(f"tree: {args.tree}; {os.cpu_count()} CPUs, 1-min load {os.getloadavg()[0]:.1f}")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
