"""Where fetched row groups are kept, and the locks that fetch each one once.

Caches. Decoded row groups (tokens) on disk under DAISY_DATA_CACHE_DIR (default
~/.cache/daisy/data), at most DAISY_DATA_CACHE_MB MiB (default 256), least recently used
evicted first; plus an in-memory LRU of DAISY_DATA_MEM_MB MiB (default 64). Cache keys start
with the data id (hub_source.py), so a new commit never reads an old commit's tokens.

Fetches lock per row group (and per footer): one row group is fetched once however many
requests and the prefetch worker want it, while different row groups download in parallel.
"""
import hashlib
import os
import threading
from collections import OrderedDict

import numpy as np


class DiskCache:
    """Row-group token arrays as files, total size bounded, least recently used evicted."""

    def __init__(self, directory: str, limit_bytes: int):
        self.dir = directory
        self.limit = limit_bytes
        self.lock = threading.Lock()
        os.makedirs(directory, exist_ok=True)
        files = [e for e in os.scandir(directory) if e.name.endswith(".u16")]
        files.sort(key=lambda e: e.stat().st_mtime_ns)
        self.sizes: OrderedDict[str, int] = OrderedDict((e.name, e.stat().st_size) for e in files)
        with self.lock:
            self._evict()

    def _name(self, key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()[:40] + ".u16"

    def get(self, key: str) -> np.ndarray | None:
        name = self._name(key)
        with self.lock:
            if name not in self.sizes:
                return None
            self.sizes.move_to_end(name)
        path = os.path.join(self.dir, name)
        try:
            arr = np.fromfile(path, dtype="<u2")
            os.utime(path)                 # mtime = last use, so LRU order survives restarts
        except OSError:
            with self.lock:
                self.sizes.pop(name, None)
            return None
        return arr

    def put(self, key: str, tokens: np.ndarray) -> None:
        data = tokens.astype("<u2").tobytes()
        if len(data) > self.limit:
            return                          # larger than the whole cache: memory only
        name = self._name(key)
        path = os.path.join(self.dir, name)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)              # atomic: a reader never sees half a file
        with self.lock:
            self.sizes[name] = len(data)
            self.sizes.move_to_end(name)
            self._evict()

    def _evict(self) -> None:
        while self.sizes and sum(self.sizes.values()) > self.limit:
            name, _ = self.sizes.popitem(last=False)
            try:
                os.remove(os.path.join(self.dir, name))
            except FileNotFoundError:
                pass

    def __contains__(self, key: str) -> bool:
        with self.lock:
            return self._name(key) in self.sizes

    def total_bytes(self) -> int:
        with self.lock:
            return sum(self.sizes.values())


class MemoryCache:
    """In-memory LRU of token arrays bounded in bytes."""

    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self.items: OrderedDict[str, np.ndarray] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, key: str) -> np.ndarray | None:
        with self.lock:
            arr = self.items.get(key)
            if arr is not None:
                self.items.move_to_end(key)
            return arr

    def __contains__(self, key: str) -> bool:
        with self.lock:
            return key in self.items

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.bytes = 0

    def put(self, key: str, arr: np.ndarray) -> None:
        with self.lock:
            if key in self.items:
                return
            self.items[key] = arr
            self.bytes += arr.nbytes
            while self.bytes > self.limit and len(self.items) > 1:
                _, old = self.items.popitem(last=False)
                self.bytes -= old.nbytes


class KeyLocks:
    """One lock per footer / row group: the same one is fetched once however many requests (and
    the prefetch worker) want it, while different ones download in parallel."""

    def __init__(self):
        self.locks: dict[str, threading.Lock] = {}
        self.guard = threading.Lock()

    def lock(self, key: str) -> threading.Lock:
        with self.guard:
            return self.locks.setdefault(key, threading.Lock())
