"""`python app.py` for tests: a real uvicorn server on 127.0.0.1 at a free port, and the page
helpers the browser tests share (open a peer, read its state, wait for a condition).

    with running_app(tmp, "main", {"HF_HUB_OFFLINE": "1"}) as base:     # "http://127.0.0.1:PORT"
        page = open_peer(pages, base + "/", "a")
        wait_state(page, "s.step >= 3", "three steps")
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_S = 90            # bound on the app's start (importing gradio is most of it)
WAIT_MS = 10_000        # bound on every wait for something the page must show


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now and that this process never handed out before: the kernel
    may give a just-released port again, and two servers told the same port make one of them
    exit while the other answers for it (a CI run's data server once reported another's hub)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def start_app(tmp: str, name: str, env_extra: dict, args: list[str], tree: str = REPO_ROOT):
    """`python app.py ARGS` of the checkout `tree`, its HF cache, data cache and log (NAME.log)
    in `tmp`, none of this shell's HF_/DAISY_/GRADIO_ settings -> (process, open log)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DAISY_", "GRADIO_"))}
    env.update(HF_HOME=os.path.join(tmp, f"hf-{name}"), DAISY_DATA_CACHE_DIR=os.path.join(tmp, f"data-{name}"),
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1", **env_extra)
    log = open(os.path.join(tmp, f"{name}.log"), "wb")
    proc = subprocess.Popen([sys.executable, "app.py", *args], cwd=tree, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, log


def wait_up(proc, base: str, log_path: str, verify=True) -> None:
    """verify: httpx's (False: any certificate, for an https base whose certificate the
    test checks itself)."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"app.py exited with {proc.returncode}:\n{open(log_path).read()[-3000:]}")
        try:
            if httpx.get(base + "/", timeout=2, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"app.py did not serve {base}/ within {START_S} s:\n{open(log_path).read()[-3000:]}")


def stop_process(proc, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not exited within grace_s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_app(proc, log) -> None:
    stop_process(proc)
    log.close()


@contextlib.contextmanager
def app_process(tmp: str, name: str, env_extra: dict, tree: str = REPO_ROOT):
    """app.py (of the checkout `tree`) on 127.0.0.1 at a free port -> (process, base URL);
    stopped on exit."""
    port = free_port()
    proc, log = start_app(tmp, name, env_extra, ["--host", "127.0.0.1", "--port", str(port)], tree)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(proc, base, os.path.join(tmp, f"{name}.log"))
        yield proc, base
    finally:
        stop_app(proc, log)


@contextlib.contextmanager
def running_app(tmp: str, name: str, env_extra: dict):
    """app.py on 127.0.0.1 at a free port -> its base URL; stopped on exit."""
    with app_process(tmp, name, env_extra) as (_, base):
        yield base


@contextlib.contextmanager
def offline_app(name: str):
    """A module's own app.py (running_app) in a temp folder, offline (the built-in corpus) and
    with no STUN server (loopback host candidates are all the pages need) -> its base URL. Its
    own server: the pages' network group (all of 127.0.0.1) holds only this module's pages."""
    with tempfile.TemporaryDirectory(prefix=f"daisy-{name}-") as tmp:
        with running_app(tmp, name, {"HF_HUB_OFFLINE": "1", "DAISY_ICE_SERVERS": "[]"}) as base:
            yield base


def open_peer(pages, url: str, label: str, init_script: str | None = None):
    page = pages.new_page(url, label, init_script)
    page.wait_for_function("window.daisy && window.daisy.state().peerId", timeout=WAIT_MS)
    return page


def state(page) -> dict:
    return page.evaluate("window.daisy.state()")


def wait_state(page, js_condition: str, what: str, timeout_ms: int = WAIT_MS):
    try:
        page.wait_for_function(f"(() => {{ const s = window.daisy.state(); return {js_condition}; }})()",
                               timeout=timeout_ms)
    except Exception:
        s = answered_state(page)
        if s is None:       # an evaluate would wait for good: the stack says where the page spins
            from tests.page_browser import js_stack      # (page_browser imports this module)
            raise AssertionError(f"{what}: not within {timeout_ms} ms, and the page does not answer (its main thread never yields); "
                                 f"its JavaScript stack: {js_stack(page)}") from None
        raise AssertionError(f"{what}: not within {timeout_ms} ms; message {s.get('message')!r}; state is {json.dumps(s)[:1500]}") from None


def answered_state(page, timeout_ms: int = 5000) -> dict | None:
    """window.daisy.state(), or None when the page does not answer within timeout_ms."""
    try:
        return json.loads(page.wait_for_function("JSON.stringify(window.daisy.state())", timeout=timeout_ms, polling=100).json_value())
    except Exception:
        return None
