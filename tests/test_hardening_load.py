"""POST /api/load under attack (issue 13, part 1): the parse runs in a limited child process, a
bounded number at once, and the other routes keep answering. Real uvicorn on 127.0.0.1, real
HTTP; the hostile files come from tests/test_hardening_checkpoint.py."""
from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from daisy.files.checkpoint import param_shapes, save_checkpoint
from daisy.space.sandbox import ParseSandbox, SandboxLimits
from daisy.space.model_routes import decode_state, make_model_router
from daisy.space.page import JS_DIR
from signal_client import serve_in_thread
from test_hardening_checkpoint import CFG, extend_top, list_dag, s

LARGE = dict(width=128, seq_len=128, batch=2, steps=100, lr_x1000=10, layers=8, heads=8, seed=1)


def make_file(cfg, step=7) -> bytes:
    rng = np.random.default_rng(step)
    p, m, v = ({n: rng.standard_normal(sh) for n, sh in param_shapes(cfg).items()} for _ in range(3))
    return save_checkpoint(None, config=cfg, params=p, step=step, adam_m=m, adam_v=v)


@pytest.fixture(scope="module")
def honest():
    return make_file(CFG)


def serve(limits: SandboxLimits):
    app = FastAPI()
    app.include_router(make_model_router(ParseSandbox(limits)))
    app.mount("/js", StaticFiles(directory=JS_DIR))       # stands in for the page's other routes
    return serve_in_thread(app)


def http(url: str) -> str:
    return url.replace("ws://", "http://")


def test_honest_upload_round_trips_through_the_sandbox(honest):
    with serve(SandboxLimits()) as url:
        r = httpx.post(http(url) + "/api/load", content=honest, timeout=30)
        assert r.status_code == 200, r.text
        st = decode_state(r.content, need_optim=True)
        assert st["step"] == 7 and st["config"]["width"] == CFG["width"]
        assert r.headers["x-daisy-weight-hash"] == st["weight_hash"]


def test_hostile_uploads_are_refused_and_other_routes_keep_answering(honest):
    """12 uploads of the 2**30-leaf DAG at once (the finding: 41 of them stopped every route),
    while /js/ is fetched every 20 ms: p99 under 500 ms (a starved server takes seconds; the
    bench's 250 ms target is met on a quiet box, but the attack's first burst has cost a 2-core CI
    box up to ~0.4 s once), and an honest load still works."""
    hostile = extend_top(honest, s("extra") + b"}(" + s("x") + list_dag(30) + b"u")

    async def attack(base):
        async with httpx.AsyncClient(base_url=base, timeout=20) as client:
            async def upload():
                return await client.post("/api/load", content=hostile)

            async def probe(stop):
                lat = []
                while not stop.is_set():
                    t0 = time.perf_counter()
                    r = await client.get("/js/peer/ui.js")
                    assert r.status_code == 200
                    lat.append(time.perf_counter() - t0)
                    await asyncio.sleep(0.01)
                return lat

            assert (await client.get("/js/peer/ui.js")).status_code == 200  # a warm connection
            stop = asyncio.Event()
            prober = asyncio.create_task(probe(stop))
            answers = await asyncio.gather(*(upload() for _ in range(12)))
            await asyncio.sleep(1.0)  # enough probes for a p99 to mean something
            stop.set()
            return answers, await prober

    with serve(SandboxLimits(workers=2, queue=4)) as url:
        # steady state: the fork server is up (its first start imports numpy once)
        assert httpx.post(http(url) + "/api/load", content=honest, timeout=30).status_code == 200
        answers, lat = asyncio.run(asyncio.wait_for(attack(http(url)), 60))
        codes = sorted(r.status_code for r in answers)
        assert set(codes) <= {400, 503} and 400 in codes, codes
        for r in answers:
            msg = r.json()["error"]
            assert ("extra is too large" in msg) if r.status_code == 400 else ("busy, retry" in msg)
            assert len(msg) < 400
        p99 = sorted(lat)[max(0, -(-len(lat) * 99 // 100) - 1)]  # nearest rank
        assert p99 < 0.5, f"/js/ p99 {p99 * 1000:.0f} ms during the attack: {sorted(lat)[-5:]}, slowest #{lat.index(max(lat))} of {len(lat)}"
        assert httpx.post(http(url) + "/api/load", content=honest, timeout=30).status_code == 200


def test_full_sandbox_answers_503_busy_retry_before_reading_the_body(honest):
    """One slot, no queue: an upload that trickles in holds it; the next is told 503 at once."""
    with serve(SandboxLimits(workers=1, queue=0)) as url:
        host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
        slow = socket.create_connection((host, port), timeout=5)
        try:
            slow.sendall(f"POST /api/load HTTP/1.1\r\nHost: x\r\nContent-Length: {len(honest)}\r\n"
                         "Content-Type: application/octet-stream\r\n\r\n".encode() + honest[:100])
            time.sleep(0.3)
            t0 = time.perf_counter()
            r = httpx.post(http(url) + "/api/load", content=honest, timeout=10)
            assert r.status_code == 503 and "busy, retry" in r.json()["error"]
            assert r.headers["retry-after"] == "5"
            assert time.perf_counter() - t0 < 1.0
            assert httpx.get(http(url) + "/js/peer/ui.js", timeout=5).status_code == 200
            slow.sendall(honest[100:])
            assert b" 200 " in slow.recv(64)
        finally:
            slow.close()
        assert httpx.post(http(url) + "/api/load", content=honest, timeout=30).status_code == 200


def test_memory_budget_of_the_parse_is_enforced():
    """A 40 MB honest file under a 16 MiB budget: the child runs out, the answer is a 400 that
    says so, and the server is unaffected."""
    big = make_file(LARGE)
    with serve(SandboxLimits(mem_mb=16)) as url:
        r = httpx.post(http(url) + "/api/load", content=big, timeout=30)
        assert r.status_code == 400 and "memory budget" in r.json()["error"], r.text
        assert httpx.get(http(url) + "/js/peer/ui.js", timeout=5).status_code == 200


def test_wall_clock_limit_answers_busy_retry(honest):
    with serve(SandboxLimits(wall_s=0.0)) as url:
        r = httpx.post(http(url) + "/api/load", content=honest, timeout=30)
        assert r.status_code == 503 and "busy, retry" in r.json()["error"], r.text


def test_sandbox_limits_from_env():
    lim = ParseSandbox.from_env({"DAISY_LOAD_WORKERS": "3", "DAISY_LOAD_QUEUE": "0",
                                 "DAISY_LOAD_CPU_S": "5", "DAISY_LOAD_MEM_MB": "512",
                                 "DAISY_LOAD_WALL_S": "12"}).limits
    assert (lim.workers, lim.queue, lim.cpu_s, lim.mem_mb, lim.wall_s) == (3, 0, 5, 512, 12)
    with pytest.raises(ValueError, match="DAISY_LOAD_CPU_S"):
        ParseSandbox.from_env({"DAISY_LOAD_CPU_S": "lots"})


def test_deeply_nested_state_header_is_a_400_not_a_500():
    """The finding: a state header nested deeper than ~1,000 levels answered 500 (fixed in
    daisy/files/state_codec.py on main; checked here through every route)."""
    import json
    import struct
    header = ('{"format": "daisychain-state", "version": 1, "x": ' + "[" * 5000 + "]" * 5000
              + "}").encode()
    header += b" " * (-len(header) % 8)
    body = struct.pack("<Q", len(header)) + header
    with serve(SandboxLimits()) as url:
        for route in ("/api/checkpoint.pt", "/api/model.safetensors", "/api/kit.html"):
            r = httpx.post(http(url) + route, content=body, timeout=10)
            assert r.status_code == 400 and "too deeply" in r.json()["error"], r.text
        json.dumps(r.json())


def test_parse_processes_never_import_the_servers_main_module(tmp_path, honest):
    """Under `python app.py`, multiprocessing's children re-imported app.py (and Gradio): ~5 s
    per upload. The sandbox's helpers must not run the main module again."""
    import subprocess
    import sys
    marker = tmp_path / "imports"
    upload = tmp_path / "ok.pt"
    upload.write_bytes(honest)
    script = tmp_path / "main.py"
    script.write_text(
        "import os, sys\n"
        f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
        "if __name__ == '__main__':\n"
        f"    sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})\n"
        "    from daisy.space.sandbox import ParseSandbox\n"
        f"    ck = ParseSandbox().load_checkpoint(open({str(upload)!r}, 'rb').read())\n"
        "    print(ck.step)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "7", out.stderr
    assert marker.read_text().split() == ["__main__"]
