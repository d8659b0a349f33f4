"""The README's set-up on a fresh machine: a venv with requirements.txt ALONE, then
`python app.py`, must give a working /signal WebSocket (uvicorn serves WebSockets only when a
WebSocket implementation is installed; without one /signal answers 404 and the page says
"Reconnecting to the server…" forever, while the other tests pass on requirements-dev.txt).

Builds the venv with `python -m venv` + `pip install -r requirements.txt` (with pip's cache warm
the whole test took ~110 s on this 2-core machine; a cold cache downloads gradio and friends
from PyPI; the install is bounded at INSTALL_TIMEOUT_S), starts the
app from it with HF_HUB_OFFLINE=1 and completes a /signal handshake with this process's
`websockets` client: the first message must be `welcome`."""
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from tests.app_server import free_port, stop_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT_S = 300
START_TIMEOUT_S = 90          # importing gradio and building the page on a busy 2-core box


def clean_env(**extra) -> dict:
    """This process's environment without anything that would let the venv see our packages."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith(("HF_", "DAISY_"))}
    env.update(extra)
    return env


def build_venv(where: Path) -> Path:
    """A venv with requirements.txt installed; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120,
                   env=clean_env())
    python = where / "bin" / "python"
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-r", str(ROOT / "requirements.txt")], cwd=ROOT, env=clean_env(),
                       capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert r.returncode == 0, f"pip install -r requirements.txt failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return python


async def first_message(url: str) -> dict:
    async with connect(url, open_timeout=10) as ws:
        return json.loads(await asyncio.wait_for(ws.recv(), 10))


def signal_handshake(python: Path, log_path: Path) -> dict:
    """Start `python app.py` of that venv on a free port; -> the first /signal message."""
    port = free_port()
    with open(log_path, "w+") as log:
        app = subprocess.Popen([str(python), "app.py", "--host", "127.0.0.1", "--port", str(port)],
                               cwd=ROOT, env=clean_env(HF_HUB_OFFLINE="1"), stdout=log,
                               stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if app.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise AssertionError(f"app.py did not come up (rc={app.poll()}):\n{log.read()[-4000:]}")
                try:
                    import httpx
                    if httpx.get(f"http://127.0.0.1:{port}/data/info", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            try:
                return asyncio.run(first_message(f"ws://127.0.0.1:{port}/signal"))
            except Exception as exc:
                log.seek(0)
                raise AssertionError(
                    f"no /signal handshake with app.py from a venv of requirements.txt alone "
                    f"({type(exc).__name__}: {exc}); does requirements.txt bring a WebSocket "
                    f"implementation for uvicorn (websockets)?\napp log:\n{log.read()[-3000:]}") from None
        finally:
            stop_process(app)


def test_requirements_alone_serve_the_signal_websocket(tmp_path):
    python = build_venv(tmp_path / "venv")
    msg = signal_handshake(python, tmp_path / "app.log")
    assert msg.get("type") == "welcome", msg
    assert msg.get("peerId") and msg.get("role") in ("host", "member"), msg
