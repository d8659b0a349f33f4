"""Parse untrusted checkpoint files where they cannot stall the server.

The budgets in daisy.checkpoint bound the work a file can ask for; this module is the backstop
for whatever they miss: each parse runs in its own short-lived process (forked from a small
fork server that has only daisy.checkpoint loaded, never from the server with its threads) with
a CPU-time limit, an address-space limit and a wall-clock timeout, and at most `workers` run at
once with `queue` more waiting. A caller beyond that is told "busy, retry" (HTTP 503) before
its upload is even read. Limits and their environment variables: docs/TROUBLESHOOTING.md.

    sandbox = ParseSandbox.from_env()
    with sandbox.slot():                      # ParseBusy when full
        ck = sandbox.load_checkpoint(body)    # blocking: call it from a worker thread
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import resource
import signal
import tempfile
import threading
from dataclasses import dataclass

import numpy as np

from .checkpoint import DEFAULT_MAX_BYTES, Checkpoint, CheckpointError, load_checkpoint, param_shapes


class ParseBusy(Exception):
    """No parse slot (or the machine too slow to finish in time): answer 503, retry later."""


def _env_num(env, name: str, default, kind=float):
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw[:40]!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0")
    return value


@dataclass(frozen=True)
class SandboxLimits:
    workers: int = 2          # parses at once (each one process)
    queue: int = 4            # more waiting for a worker; beyond this: ParseBusy
    cpu_s: int = 10           # CPU seconds per parse (the largest honest file takes ~0.1 s)
    mem_mb: int = 768         # address space a parse may add to its process
    wall_s: float = 30.0      # wall-clock limit per parse, waiting excluded


# The file and the parsed values travel through files on a RAM disk, not the pipe: a pipe moves
# ~450 MB/s here, so a 40 MB checkpoint cost ~180 ms more each way; the pipe carries only a
# small JSON answer.
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _child(conn, limits: SandboxLimits, max_bytes: int, in_path: str, out_path: str) -> None:
    """In the parse process: limit itself, parse the file at in_path, write the float64 values
    (model, optim.m, optim.v in param_shapes order) to out_path and send back plain JSON (never
    a pickle)."""
    with open("/proc/self/status") as f:      # limit what it may add, not what it already maps
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    mem = vm + limits.mem_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    try:
        ck = load_checkpoint(in_path, max_bytes=max_bytes)
        names = list(param_shapes(ck.config))
        with open(out_path, "wb") as f:
            for group in (ck.params, ck.adam_m, ck.adam_v):
                for n in names:
                    f.write(memoryview(np.ascontiguousarray(group[n], dtype="<f8")).cast("B"))
        meta = {"config": ck.config, "step": ck.step, "adam_t": ck.adam_t,
                "weight_hash": ck.weight_hash, "extra": ck.extra}
        conn.send_bytes(json.dumps({"ok": meta}).encode())
    except CheckpointError as e:   # the temp file's name is no business of the uploader's
        conn.send_bytes(json.dumps({"error": str(e).replace(repr(in_path), "the upload")
                                    .replace(in_path, "the upload")}).encode())
    except MemoryError:
        conn.send_bytes(json.dumps({"error": f"checkpoint refused: parsing it needs more than "
                                             f"the {limits.mem_mb} MiB memory budget"}).encode())
    except OSError as e:                       # the parent gave up and closed the pipe
        if e.errno is None:
            raise
    finally:
        conn.close()


class ParseSandbox:
    def __init__(self, limits: SandboxLimits | None = None):
        self.limits = limits or SandboxLimits()
        self._lock = threading.Lock()
        self._admitted = 0
        self._running = threading.BoundedSemaphore(max(1, self.limits.workers))
        self._ctx = None

    @classmethod
    def from_env(cls, env=os.environ) -> "ParseSandbox":
        d = SandboxLimits()
        return cls(SandboxLimits(
            workers=max(1, _env_num(env, "DAISY_LOAD_WORKERS", d.workers, int)),
            queue=_env_num(env, "DAISY_LOAD_QUEUE", d.queue, int),
            cpu_s=max(1, _env_num(env, "DAISY_LOAD_CPU_S", d.cpu_s, int)),
            mem_mb=max(64, _env_num(env, "DAISY_LOAD_MEM_MB", d.mem_mb, int)),
            wall_s=_env_num(env, "DAISY_LOAD_WALL_S", d.wall_s)))

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

    def _context(self):
        if self._ctx is None:
            # forkserver: children fork from a clean process that has only imported
            # daisy.checkpoint, not from this server with its threads and sockets
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["daisy.sandbox"])
            self._ctx = ctx
        return self._ctx

    def load_checkpoint(self, body, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Checkpoint:
        """daisy.checkpoint.load_checkpoint(body) run in a limited child process. Raises
        CheckpointError (the file's fault, with the child's message) or ParseBusy."""
        if len(body) > max_bytes:                  # the same message as in-process, unforked
            return load_checkpoint(body, max_bytes=max_bytes)
        with self._running:
            return self._run(body, max_bytes)

    def _run(self, body, max_bytes: int) -> Checkpoint:
        ctx = self._context()
        fd, in_path = tempfile.mkstemp(prefix="daisy-load-", suffix=".pt", dir=SHM_DIR)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        fd, out_path = tempfile.mkstemp(prefix="daisy-load-", suffix=".f64", dir=SHM_DIR)
        os.close(fd)
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(child, self.limits, max_bytes, in_path, out_path),
                           daemon=True)
        proc.start()
        child.close()
        try:
            try:
                if not parent.poll(self.limits.wall_s):
                    raise ParseBusy(f"busy, retry: reading the checkpoint took over "
                                    f"{self.limits.wall_s:g} s (the server is overloaded)")
                answer = json.loads(parent.recv_bytes(1 << 24))
                if "error" in answer:
                    raise CheckpointError(answer["error"])
                meta = answer["ok"]
                # a read-only view of the RAM-disk file (it stays mapped after the unlink)
                values = (np.memmap(out_path, dtype="<f8", mode="r")
                          if os.path.getsize(out_path) else np.empty(0, dtype="<f8"))
            except (EOFError, BrokenPipeError, ConnectionResetError):
                proc.join(1)
                if proc.exitcode in (-signal.SIGXCPU, -signal.SIGKILL):
                    raise CheckpointError(f"checkpoint refused: reading it took over the "
                                          f"{self.limits.cpu_s} s CPU budget") from None
                raise CheckpointError(f"checkpoint refused: the parser stopped (exit code "
                                      f"{proc.exitcode}; over a budget?)") from None
        finally:
            parent.close()
            if proc.is_alive():
                proc.kill()
            proc.join(5)
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
