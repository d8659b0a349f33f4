"""Parse untrusted checkpoint files where they cannot stall the server.

The budgets in daisy.files.checkpoint bound the work a file can ask for; this module is the backstop
for whatever they miss: each parse runs in its own short-lived process with a CPU-time limit,
an address-space limit and a wall-clock timeout, and at most `workers` run at once with `queue`
more waiting. A caller beyond that is told "busy, retry" (HTTP 503) before its upload is even
read. Limits and their environment variables: docs/TROUBLESHOOTING.md.

How: `workers` helper processes (`python -m daisy.space.sandbox`, started on first use, numpy and
daisy.files.checkpoint already imported) each take one job at a time and fork a child per job, which
limits itself and parses. Helpers are plain subprocesses, not multiprocessing children: those
re-import the server's main module (app.py, and with it Gradio: ~5 s per parse). The upload and
the parsed values travel through files on a RAM disk, the answers as one JSON line: nothing
from a parse process is ever unpickled.

    sandbox = ParseSandbox.from_env()
    with sandbox.slot():                      # ParseBusy when full
        ck = sandbox.load_checkpoint(body)    # blocking: call it from a worker thread
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from daisy.files.checkpoint import DEFAULT_MAX_BYTES, Checkpoint, CheckpointError, load_checkpoint, param_shapes
from daisy.space.env import env_number

ROOT = Path(__file__).resolve().parents[2]   # the repository (this file: daisy/space/)
# A pipe moves ~450 MB/s here (a 40 MB checkpoint cost ~180 ms more each way): files on a RAM
# disk instead, deleted as soon as the parse is done.
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class ParseBusy(Exception):
    """No parse slot (or the machine too slow to finish in time): answer 503, retry later."""


@dataclass(frozen=True)
class SandboxLimits:
    workers: int = 2          # parses at once (each one process)
    queue: int = 4            # more waiting for a worker; beyond this: ParseBusy
    cpu_s: int = 10           # CPU seconds per parse (the largest honest file takes ~0.1 s)
    mem_mb: int = 768         # address space a parse may add to its process
    wall_s: float = 30.0      # wall-clock limit per parse, waiting excluded


# ---- the helper process (python -m daisy.space.sandbox) ----------------------------------------------

def _parse(job: dict) -> dict:
    """In the forked child: limit itself, parse the file at job["in"], write the float64 values
    (model, optim.m, optim.v in param_shapes order) to job["out"] -> the JSON answer."""
    with open("/proc/self/status") as f:      # limit what it may add, not what it already maps
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    mem = vm + job["mem_mb"] * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_s"], job["cpu_s"] + 1))
    try:
        ck = load_checkpoint(job["in"], max_bytes=job["max_bytes"])
        names = list(param_shapes(ck.config))
        with open(job["out"], "wb") as f:
            for group in (ck.params, ck.adam_m, ck.adam_v):
                for n in names:
                    f.write(memoryview(np.ascontiguousarray(group[n], dtype="<f8")).cast("B"))
        return {"ok": {"config": ck.config, "step": ck.step, "adam_t": ck.adam_t,
                       "weight_hash": ck.weight_hash, "extra": ck.extra}}
    except CheckpointError as e:   # the temp file's name is no business of the uploader's
        return {"error": str(e).replace(repr(job["in"]), "the upload").replace(job["in"], "the upload")}
    except MemoryError:
        return {"error": f"checkpoint refused: parsing it needs more than the {job['mem_mb']} "
                         f"MiB memory budget"}


def _serve() -> None:
    """Helper loop: a JSON job per stdin line -> fork a child that parses it; reply with
    {"pid"} at once, then {"status", "answer"} when the child is done."""
    out = sys.stdout
    for line in sys.stdin:
        job = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                          # the parse process
            os.close(r)
            try:
                answer = json.dumps(_parse(job)).encode()
            except BaseException as e:  # noqa: BLE001  (anything else: report, never hang)
                answer = json.dumps({"error": f"checkpoint refused: the parser failed "
                                              f"({type(e).__name__})"}).encode()
            with os.fdopen(w, "wb") as f:
                f.write(answer)
            os._exit(0)
        os.close(w)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        with os.fdopen(r, "rb") as f:
            answer = f.read(1 << 24)
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"status": status, "signal": os.WTERMSIG(status)
                              if os.WIFSIGNALED(status) else 0,
                              "answer": answer.decode("utf-8", "replace")}) + "\n")
        out.flush()


# ---- the server side ---------------------------------------------------------------------------

class _Helper:
    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daisy.space.sandbox"], cwd=ROOT, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=None, bufsize=0, start_new_session=True,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
        self.buffer = b""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, job: dict) -> None:
        self.proc.stdin.write((json.dumps(job) + "\n").encode())

    def reply(self, timeout: float):
        """The next JSON line, or None when timeout passed first."""
        fd = self.proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError("the parse helper exited")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait(5)


def _close_all(helpers: list) -> None:
    for helper in helpers:
        helper.close()


class ParseSandbox:
    def __init__(self, limits: SandboxLimits | None = None):
        self.limits = limits or SandboxLimits()
        self._lock = threading.Lock()
        self._admitted = 0
        self._idle: queue.Queue = queue.Queue()
        for _ in range(max(1, self.limits.workers)):
            self._idle.put(None)              # a slot; its helper starts on first use
        self._helpers: list[_Helper] = []
        # helpers end with the server (stdin EOF); a sandbox dropped earlier ends its own
        weakref.finalize(self, _close_all, self._helpers)

    @classmethod
    def from_env(cls, env=os.environ) -> "ParseSandbox":
        d = SandboxLimits()

        def num(name, default, kind=float):
            return env_number(env, name, default, kind, allow_zero=True)
        return cls(SandboxLimits(
            workers=max(1, num("DAISY_LOAD_WORKERS", d.workers, int)),
            queue=num("DAISY_LOAD_QUEUE", d.queue, int),
            cpu_s=max(1, num("DAISY_LOAD_CPU_S", d.cpu_s, int)),
            mem_mb=max(64, num("DAISY_LOAD_MEM_MB", d.mem_mb, int)),
            wall_s=num("DAISY_LOAD_WALL_S", d.wall_s)))

    @contextlib.contextmanager
    def slot(self):
        """Hold a place (running or waiting) for one parse, or raise ParseBusy at once. Take it
        before reading the upload, so a crowd of uploads cannot pile up in memory either."""
        with self._lock:
            if self._admitted >= self.limits.workers + self.limits.queue:
                raise ParseBusy(f"busy, retry: {self._admitted} checkpoint(s) are being read "
                                f"(the limit is {self.limits.workers} at once plus "
                                f"{self.limits.queue} waiting)")
            self._admitted += 1
        try:
            yield
        finally:
            with self._lock:
                self._admitted -= 1

    def load_checkpoint(self, body, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Checkpoint:
        """daisy.files.checkpoint.load_checkpoint(body) run in a limited child process. Raises
        CheckpointError (the file's fault, with the child's message) or ParseBusy."""
        if len(body) > max_bytes:                  # the same message as in-process, unforked
            return load_checkpoint(body, max_bytes=max_bytes)
        helper = self._idle.get()                  # waits while `workers` parses run
        try:
            if helper is None or not helper.alive():
                helper = _Helper()
                self._helpers[:] = [h for h in self._helpers if h.alive()] + [helper]
            return self._run(helper, body, max_bytes)
        except CheckpointError:                    # the file's fault; the helper is fine
            raise
        except BaseException:
            if helper is not None:                 # unknown state: start a fresh one next time
                helper.close()
                helper = None
            raise
        finally:
            self._idle.put(helper)

    def _run(self, helper: _Helper, body, max_bytes: int) -> Checkpoint:
        fd, in_path = tempfile.mkstemp(prefix="daisy-load-", suffix=".pt", dir=SHM_DIR)
        out_path = in_path[:-3] + ".f64"
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            helper.send({"in": in_path, "out": out_path, "max_bytes": max_bytes,
                         "cpu_s": self.limits.cpu_s, "mem_mb": self.limits.mem_mb})
            started = helper.reply(10.0)
            if started is None:
                raise ParseBusy("busy, retry: the parser did not start within 10 s")
            done = helper.reply(self.limits.wall_s)
            if done is None:
                with contextlib.suppress(OSError):
                    os.kill(started["pid"], signal.SIGKILL)
                helper.reply(5.0)                  # its status line: the helper is free again
                raise ParseBusy(f"busy, retry: reading the checkpoint took over "
                                f"{self.limits.wall_s:g} s (the server is overloaded)")
            if done["signal"] in (signal.SIGXCPU, signal.SIGKILL):
                raise CheckpointError(f"checkpoint refused: reading it took over the "
                                      f"{self.limits.cpu_s} s CPU budget")
            try:
                answer = json.loads(done["answer"])
            except ValueError:
                raise CheckpointError(f"checkpoint refused: the parser stopped (status "
                                      f"{done['status']}; over a budget?)") from None
            if "error" in answer:
                raise CheckpointError(answer["error"])
            meta = answer["ok"]
            # a read-only view of the RAM-disk file (it stays mapped after the unlink)
            values = (np.memmap(out_path, dtype="<f8", mode="r")
                      if os.path.getsize(out_path) else np.empty(0, dtype="<f8"))
        finally:
            for path in (in_path, out_path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        shapes = param_shapes(meta["config"])
        groups, at = [], 0
        for _ in range(3):
            group = {}
            for name, shape in shapes.items():
                size = int(np.prod(shape))
                group[name] = values[at:at + size].reshape(shape)
                at += size
            groups.append(group)
        if at != values.size:
            raise CheckpointError("checkpoint refused: the parser sent back the wrong amount of data")
        return Checkpoint(config=meta["config"], params=groups[0], adam_m=groups[1],
                          adam_v=groups[2], step=meta["step"], weight_hash=meta["weight_hash"],
                          adam_t=meta["adam_t"], extra=meta["extra"])


if __name__ == "__main__":
    _serve()
