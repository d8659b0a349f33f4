"""The headless peer (`node frontend_js/headless.mjs URL --json`) as a test's process: its JSON
lines collected by a reader thread, commands written to its stdin, SIGTERM to leave.

    with headless_peer(base, tmp, "--keep") as h:
        h.wait(lambda e: e["event"] == "welcome", "welcome")
        h.send("start steps=100,width=16")
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time

from tests.app_server import REPO_ROOT

WAIT_S = 30


class HeadlessPeer:
    def __init__(self, proc: subprocess.Popen, log_path: str):
        self.proc = proc
        self.log_path = log_path
        self.events: list[dict] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"event": "text", "text": line.rstrip()}
            with self.lock:
                self.events.append(event)

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()[-3000:]

    def wait(self, pred, what: str, timeout_s: float = WAIT_S) -> dict:
        """The first event (from the start) for which pred is true, within timeout_s."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            with self.lock:
                events = self.events[seen:]
            for e in events:
                if pred(e):
                    return e
            seen += len(events)
            if time.monotonic() > deadline or (self.proc.poll() is not None and not self.reader.is_alive()):
                with self.lock:
                    tail = self.events[-8:]
                raise AssertionError(f"headless peer: {what} not within {timeout_s} s (exit {self.proc.poll()}); "
                                     f"last events {tail}\nstderr: {self.log()}")
            time.sleep(0.05)

    def all(self, name: str) -> list[dict]:
        with self.lock:
            return [e for e in self.events if e["event"] == name]

    def steps(self) -> dict[int, str]:
        """{step: hash}: the last computation of each step (a recomputed step replaces it)."""
        out: dict[int, str] = {}
        with self.lock:
            for e in self.events:
                if e["event"] == "step":
                    out[e["step"]] = e["hash"]
                elif e["event"] == "step-undone":
                    out = {s: h for s, h in out.items() if s <= e["step"]}
        return out

    @property
    def peer_id(self) -> str:
        return self.wait(lambda e: e["event"] == "welcome", "welcome")["peerId"]

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def terminate(self, timeout_s: float = 15) -> int:
        """SIGTERM (the page's goodbye) -> its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)


@contextlib.contextmanager
def headless_peer(base: str, tmp, *args: str, label: str = "headless"):
    """`node frontend_js/headless.mjs BASE --json --identity TMP/LABEL.json ARGS` -> HeadlessPeer;
    killed on exit if still running."""
    log_path = os.path.join(str(tmp), f"{label}.stderr")
    cmd = ["node", "frontend_js/headless.mjs", base, "--json", "--identity", os.path.join(str(tmp), f"{label}.json"), *args]
    with open(log_path, "w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True, bufsize=1)
    peer = HeadlessPeer(proc, log_path)
    try:
        yield peer
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
