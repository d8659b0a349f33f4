"""Training data for the group: FineWeb-Edu streamed by row group, or the built-in corpus.

Source. `HuggingFaceFW/fineweb-edu`, config `sample-10BT` (files `sample/10BT/*.parquet`),
revision `REVISION` (override: env DAISY_DATA_REVISION, a branch, tag or commit sha), column
`text`, read through
`huggingface_hub.HfFileSystem` + `pyarrow.parquet`: the footer once per shard (pyarrow reads
its last 64 KiB) and then only the `text` column chunk of the one row group a request needs,
as HTTP Range requests (`cache_type="none"`: no read-ahead). Shards (0.5-2 GB) are never
downloaded whole. HF_ENDPOINT picks the hub (tests point it at tests/testhub.py).

Pinning. A branch such as "main" moves, so the batches of a key could change under a
long-lived Space. When the source starts online it resolves the requested revision to the
dataset's commit sha (GET /api/datasets/{repo}/revision/{rev}, through
huggingface_hub.HfApi.dataset_info) and reads every file at that commit. The commit is part of
the data id, so two servers (or one server before and after the branch moved) that would serve
different bytes never show the same data id:
    data_id = "HuggingFaceFW/fineweb-edu@{commit sha}:sample-10BT:text:daisy-bytes-v1"
    builtin = "builtin:{sha256 of the corpus file, 16 hex}:daisy-bytes-v1"
Pin a commit for good with DAISY_DATA_REVISION=<sha> (it is checked against the hub too).

Token stream of a row group. Its non-empty documents in file order, each encoded by
daisy.tokenizer (byte-level `daisy-bytes-v1`) and followed by EOT (256), exactly as
daisy.data.parquet_stream does for a whole file. Served as little-endian uint16.

Keys (the same key always gives the same bytes for one `data_id`):
    window(shard, rg, offset, length)  = stream(shard, rg)[offset : offset + length]
    batch(seed, step, slot, batch, seq_len):
        pick   = daisy.prng.key(PURPOSE_DATA, seed, step, slot, PICK_ROW_GROUP)
        shard  = draw(pick, 0) % n_shards            (shards indexed in sorted path order)
        rg     = draw(pick, 1) % n_row_groups(shard)
        rows   = the reference trainer's rule (daisy.data.batch_starts) on stream(shard, rg):
                 start_b = draw(key(PURPOSE_DATA, seed, step, slot), b) % (n - seq_len)
                 row_b   = stream[start_b : start_b + seq_len + 1]
        -> (batch, seq_len + 1) tokens, row-major; inputs row[:, :-1], targets row[:, 1:].
    One batch reads one row group, so a cold batch costs at most one row group's bytes. The
    chosen shard and rg come back in the X-Daisy-Shard / X-Daisy-Row-Group headers.
    The built-in corpus is one shard with one row group (its whole stream), so a built-in
    batch equals daisy.data.get_batch(builtin_stream(), seed, step, slot, B, T) bit for bit.

Sources. HubSource (the hub) and BuiltinSource (the built-in corpus: one shard, one row group)
answer one interface (data_id, num_shards, num_row_groups, is_cached, row_group_tokens, info);
DataSource is the fallback around them and serves the keyed requests on the active one.

Fallback. When the hub is offline (HF_HUB_OFFLINE=1), unreachable, answers an error, or lists
no parquet file, the source switches to the built-in corpus (daisy/corpus/builtin.txt, or env
DAISY_DATA_BUILTIN; its documents by daisy.data.corpus_documents, the CLI's rule). The switch
is sticky for the process so the whole group keeps seeing one corpus; every response says which
source served it (X-Daisy-Source, X-Daisy-Fallback-Reason, X-Daisy-Data-Id; /data/info `source`
and `reason`).
Peers must compare `data_id` before sharing batches.

Caches. Decoded row groups (tokens) on disk under DAISY_DATA_CACHE_DIR (default
~/.cache/daisy/data), at most DAISY_DATA_CACHE_MB MiB (default 256), least recently used
evicted first; plus an in-memory LRU of DAISY_DATA_MEM_MB MiB (default 64). Cache keys start
with the data id, so a new commit never reads an old commit's tokens.

Prefetch. Serving batch (seed, step, slot, ...) queues the same (seed, slot) at steps
step+1..step+PREFETCH_STEPS (env DAISY_DATA_PREFETCH_STEPS, 0 = off) for one background worker
thread, which reads the row groups those batches need into the caches. The queue is bounded
(PREFETCH_QUEUE keys; when full, new keys are dropped and counted), keys already queued are not
queued twice, and a request never waits for the worker: it only enqueues. A peer that asks for
its batches in step order thus finds the next step's row group cached. Fetches lock per row
group (and per footer): one row group is fetched once however many requests and the worker want
it, while different row groups download in parallel (a peer's own prefetch of its next batches,
HttpBatches, thereby overlaps several hub round trips).

Routes (make_data_router):
    GET /data/info     source, reason (why it fell back), summary (what that means, in words),
                       dataset, config, revision (requested), commit (resolved;
                       null for builtin), data_id, shards, shard_files (paths in the repo; the
                       built-in corpus by file name only), cache and prefetch counters
    GET /data/window?shard=&rg=&offset=&length=     -> application/octet-stream
    GET /data/batch?seed=&step=&slot=&batch=&seq_len= -> application/octet-stream
Bad parameters -> 400 {"error": "...", "code": "bad_parameter", "parameter": name}; data unavailable ->
503 {"error", "code": "data_unavailable"} (ERROR_CODES).

Standalone server (tests, bench): python -m daisy.space.datastream --host 127.0.0.1 --port 7861
"""
import hashlib
import os
import queue
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from daisy import data, prng
from daisy.space.env import env_number
from daisy.tokenizer import EOT, TOKENIZER_ID, encode_documents

DATASET = "HuggingFaceFW/fineweb-edu"
CONFIG = "sample-10BT"
SHARD_DIR = "sample/10BT"
# The requested revision; resolved to its commit sha when the source starts online (Pinning).
REVISION = "main"
TEXT_COLUMN = "text"

MAX_TOKENS = 65536                # most tokens one window or batch response carries
U32_MAX = 2**32 - 1
BLOCK_SIZE = 64 * 1024            # HfFileSystem block size; with cache_type="none" no read-ahead
PICK_ROW_GROUP = 1                # last key word of the shard/row-group choice of a batch
PREFETCH_STEPS = 2                # steps ahead whose row groups a batch request warms
PREFETCH_QUEUE = 64               # most batch keys waiting for the prefetch worker


class DataRequestError(ValueError):
    """A request parameter is missing or out of range; the message names it."""

    def __init__(self, parameter: str, message: str):
        super().__init__(message)
        self.parameter = parameter


class DataUnavailable(RuntimeError):
    """Neither the hub nor the built-in corpus can serve (e.g. built-in file missing)."""


# an error answer's JSON `code`: a client decides on it, never on the message's words (a 503
# with a code is the app's answer, one without it a proxy's: daisy/batch_source.py retries those)
ERROR_CODES = {DataRequestError: "bad_parameter", DataUnavailable: "data_unavailable"}


def hub_error_kind(exc: BaseException) -> str:
    """Which kind of hub failure exc is: offline, unreachable, hub_error, not_found or other."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    if isinstance(exc, OfflineModeIsEnabled):
        return "offline"
    if isinstance(exc, HfHubHTTPError):
        return "hub_error"
    if type(exc).__module__.startswith("httpx"):     # connection refused, DNS, timeouts
        return "unreachable"
    if isinstance(exc, FileNotFoundError):
        return "not_found"
    return "other"


def describe_hub_error(exc: BaseException) -> str:
    """One line saying why the hub could not serve: offline, unreachable, or an HTTP error."""
    msg = " ".join(str(exc).split())[:160]
    kind = hub_error_kind(exc)
    if kind == "offline":
        return "offline: HF_HUB_OFFLINE is set"
    if kind == "hub_error":
        return f"hub error: HTTP {exc.response.status_code}"
    if kind == "unreachable":
        return f"unreachable: {type(exc).__name__}: {msg}"
    if kind == "not_found":
        return f"not found: {msg}"
    return f"{type(exc).__name__}: {msg}"


# what a fallback means, in words for the page (/data/info `summary`); the detail is `reason`
FALLBACK_SUMMARIES = {
    "offline": "the Space runs offline (HF_HUB_OFFLINE): using the built-in corpus",
    "unreachable": "the Hub could not be reached: using the built-in corpus",
    "hub_error": "the Hub answered with an error: using the built-in corpus",
    "not_found": "FineWeb-Edu was not found on the Hub: using the built-in corpus",
    "other": "the Hub could not serve FineWeb-Edu: using the built-in corpus",
}


def _env_int(name: str, default: int) -> int:
    return env_number(os.environ, name, default, int, allow_zero=True)


@dataclass(frozen=True)
class Tokens:
    """A response: tokens (uint16) and where they came from."""
    tokens: np.ndarray
    source: str              # "fineweb-edu" | "builtin"
    reason: str | None       # why it fell back, when source is builtin
    data_id: str
    shard: int
    rg: int


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


class HubSource:
    """FineWeb-Edu row groups from the hub at one pinned commit (module docstring: Source, Pinning,
    Caches). open() resolves the revision and lists the shards, raising on any hub failure."""
    name = "fineweb-edu"
    remote = True                            # reads cost hub round trips: worth prefetching

    def __init__(self, endpoint: str | None, revision: str, disk: DiskCache, memory: MemoryCache, locks: "KeyLocks"):
        self.endpoint, self.revision = endpoint, revision
        self.disk, self.memory, self.locks = disk, memory, locks
        self.commit: str | None = None       # the revision's commit sha, once resolved
        self.fs = None
        self.shards: list[str] = []          # paths in repo, sorted
        self.footers: dict[int, object] = {} # shard -> pyarrow FileMetaData

    def open(self) -> None:
        from huggingface_hub import HfApi, HfFileSystem
        # Pin: every read below goes to this commit, whatever the branch does later. expand=["sha"]:
        # only the commit, not the listing of every file of the dataset (thousands for FineWeb-Edu).
        commit = HfApi(endpoint=self.endpoint).dataset_info(DATASET, revision=self.revision,
                                                            expand=["sha"]).sha
        if not (isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit)):
            raise ValueError(f"the hub resolved revision {self.revision!r} to {str(commit)[:60]!r}, "
                             f"not a commit sha")
        self.commit = commit
        self.fs = HfFileSystem(endpoint=self.endpoint, skip_instance_cache=True)
        root = self._root()
        found = self.fs.glob(root + SHARD_DIR + "/*.parquet")
        self.shards = sorted(p[len(root):] for p in found)
        if not self.shards:
            raise FileNotFoundError(f"no parquet files under {SHARD_DIR} at revision {self.revision} "
                                    f"(commit {commit})")

    def _root(self) -> str:
        return f"datasets/{DATASET}@{self.commit}/"

    @property
    def data_id(self) -> str:
        return f"{DATASET}@{self.commit}:{CONFIG}:{TEXT_COLUMN}:{TOKENIZER_ID}"

    def num_shards(self) -> int:
        return len(self.shards)

    def num_row_groups(self, shard: int) -> int:
        return self._footer(shard).num_row_groups

    def _footer(self, shard: int):
        meta = self.footers.get(shard)
        if meta is None:
            import pyarrow.parquet as pq
            with self.locks.lock(f"footer/{self.data_id}/{shard}"):
                meta = self.footers.get(shard)           # another thread may have read it
                if meta is None:
                    with self._open(shard) as f:
                        meta = pq.ParquetFile(f).metadata
                    if TEXT_COLUMN not in meta.schema.names:
                        raise DataUnavailable(f"{self.shards[shard]} has no column {TEXT_COLUMN!r}")
                    self.footers[shard] = meta
        return meta

    def _open(self, shard: int):
        return self.fs.open(self._root() + self.shards[shard], "rb", block_size=BLOCK_SIZE, cache_type="none")

    def _row_group_key(self, shard: int, rg: int) -> str:
        return f"{self.data_id}/{self.shards[shard]}/{rg}"

    def is_cached(self, shard: int, rg: int) -> bool:
        key = self._row_group_key(shard, rg)
        return key in self.memory or key in self.disk

    def row_group_tokens(self, shard: int, rg: int) -> np.ndarray:
        key = self._row_group_key(shard, rg)
        arr = self.memory.get(key)
        if arr is None:
            arr = self.disk.get(key)
            if arr is None:
                arr = self._fetch_row_group(shard, rg, key)
            self.memory.put(key, arr)
        return arr

    def _fetch_row_group(self, shard: int, rg: int, key: str) -> np.ndarray:
        import pyarrow.parquet as pq
        meta = self._footer(shard)
        with self.locks.lock(key):
            # another thread may have fetched it meanwhile (memory only when over the disk limit)
            cached = self.memory.get(key)
            if cached is None:
                cached = self.disk.get(key)
            if cached is not None:
                return cached
            with self._open(shard) as f:
                table = pq.ParquetFile(f, metadata=meta).read_row_group(rg, columns=[TEXT_COLUMN])
            # non-empty documents only, as daisy.data.parquet_stream
            arr = encode_documents([d for d in table.column(TEXT_COLUMN).to_pylist() if d])
            self.disk.put(key, arr)
        return arr

    def info(self) -> dict:
        return {"commit": self.commit, "data_id": self.data_id, "shards": len(self.shards),
                "shard_files": list(self.shards),
                "row_groups": {str(s): m.num_row_groups for s, m in sorted(self.footers.items())},
                "total_tokens": None}    # unknown until every row group was read


class BuiltinSource:
    """The built-in corpus (daisy/corpus/builtin.txt, or another file) as one shard with one row
    group, its documents by daisy.data's rule; read on first use."""
    name = "builtin"
    remote = False

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()
        self.tokens: np.ndarray | None = None
        self.id: str | None = None

    def _load(self) -> np.ndarray:
        with self.lock:
            if self.tokens is None:
                try:
                    with open(self.path, encoding="utf-8") as f:
                        text = f.read()
                except OSError as exc:
                    raise DataUnavailable(f"built-in corpus {self.file_name()} unreadable: {exc.strerror}") from exc
                docs = data.corpus_documents(text)
                if not docs:
                    raise DataUnavailable(f"built-in corpus {self.file_name()} has no documents")
                self.tokens = encode_documents(docs)
                self.id = "builtin:" + hashlib.sha256(text.encode()).hexdigest()[:16] + ":" + TOKENIZER_ID
        return self.tokens

    def file_name(self) -> str:
        """The corpus by file name: answers never show the server's paths."""
        return os.path.basename(self.path)

    @property
    def data_id(self) -> str:
        self._load()
        return self.id

    def num_shards(self) -> int:
        return 1

    def num_row_groups(self, shard: int) -> int:
        return 1

    def is_cached(self, shard: int, rg: int) -> bool:
        return True

    def row_group_tokens(self, shard: int, rg: int) -> np.ndarray:
        return self._load()

    def info(self) -> dict:
        try:
            tokens = self._load()
        except DataUnavailable as exc:
            return {"commit": None, "data_id": None, "shards": 0, "shard_files": [], "row_groups": {},
                    "total_tokens": 0, "error": str(exc)}
        return {"commit": None, "data_id": self.id, "shards": 1, "shard_files": [self.file_name()],
                "row_groups": {"0": 1}, "total_tokens": int(len(tokens))}


class KeyLocks:
    """One lock per footer / row group: the same one is fetched once however many requests (and
    the prefetch worker) want it, while different ones download in parallel."""

    def __init__(self):
        self.locks: dict[str, threading.Lock] = {}
        self.guard = threading.Lock()

    def lock(self, key: str) -> threading.Lock:
        with self.guard:
            return self.locks.setdefault(key, threading.Lock())


class DataSource:
    """The data route's source: the hub (HubSource) with the built-in corpus (BuiltinSource) as
    its fallback, a switch made once and kept for the process (module docstring, Fallback). The
    keyed requests (window, batch) run on whichever is active, through the one interface both
    have: data_id, num_shards, num_row_groups, is_cached, row_group_tokens, info."""

    def __init__(self, *, endpoint: str | None = None, revision: str | None = None,
                 cache_dir: str | None = None, cache_mb: int | None = None,
                 mem_mb: int | None = None, builtin_path: str | None = None,
                 prefetch_steps: int | None = None):
        cache_dir = cache_dir or os.environ.get("DAISY_DATA_CACHE_DIR") or os.path.expanduser("~/.cache/daisy/data")
        disk = DiskCache(cache_dir, (cache_mb if cache_mb is not None else _env_int("DAISY_DATA_CACHE_MB", 256)) << 20)
        memory = MemoryCache((mem_mb if mem_mb is not None else _env_int("DAISY_DATA_MEM_MB", 64)) << 20)
        self.hub = HubSource(endpoint or os.environ.get("HF_ENDPOINT") or None,
                             revision or os.environ.get("DAISY_DATA_REVISION") or REVISION, disk, memory, KeyLocks())
        self.builtin = BuiltinSource(builtin_path or os.environ.get("DAISY_DATA_BUILTIN") or str(data.BUILTIN_CORPUS))
        self.active: HubSource | BuiltinSource = self.hub
        self.reason: str | None = None       # why it fell back, once it did (the detail)
        self.summary: str | None = None      # what that means (FALLBACK_SUMMARIES)
        self.setup_lock = threading.Lock()   # guards setup and the switch to builtin
        self.ready = False
        steps = prefetch_steps if prefetch_steps is not None else _env_int("DAISY_DATA_PREFETCH_STEPS", PREFETCH_STEPS)
        self.prefetcher = Prefetcher(self, steps) if steps > 0 else None

    # -- setup and fallback -----------------------------------------------------------------
    def start(self) -> None:
        """Resolve the revision and list the shards now, in the background, so the first peer's
        request does not pay for it (requests that come earlier wait for the same setup)."""
        threading.Thread(target=self._ensure_ready, name="daisy-data-setup", daemon=True).start()

    def _ensure_ready(self) -> None:
        if self.ready:
            return
        with self.setup_lock:
            if self.ready:
                return
            try:
                self.hub.open()
            except Exception as exc:        # any hub failure: serve the built-in corpus
                self._fall_back(exc, describe_hub_error(exc))
            self.ready = True

    def _fall_back(self, exc: BaseException, reason: str) -> None:
        # callers hold self.setup_lock
        self.active, self.reason = self.builtin, reason
        self.summary = FALLBACK_SUMMARIES[hub_error_kind(exc)]
        self.hub.memory.clear()              # hub arrays are no use any more

    @property
    def source(self) -> str:
        return self.active.name

    @property
    def data_id(self) -> str:
        return self.active.data_id

    # -- shape of the data ------------------------------------------------------------------
    def num_shards(self) -> int:
        self._ensure_ready()
        return self.active.num_shards()

    def num_row_groups(self, shard: int) -> int:
        self._ensure_ready()
        return self.active.num_row_groups(shard)

    def is_cached(self, shard: int, rg: int) -> bool:
        """Whether row group rg of shard is in memory or on disk (no hub read needed)."""
        return self.active.is_cached(shard, rg)

    def row_group_tokens(self, shard: int, rg: int) -> np.ndarray:
        """The token stream of one row group (callers validate shard and rg)."""
        return self.active.row_group_tokens(shard, rg)

    def pick_row_group(self, seed: int, step: int, slot: int) -> tuple[int, int]:
        """(shard, rg) of the batch (seed, step, slot): the rule of the module docstring."""
        choice = prng.key(prng.PURPOSE_DATA, seed, step, slot, PICK_ROW_GROUP)
        shard = prng.draw(choice, 0) % self.num_shards()
        return shard, prng.draw(choice, 1) % self.num_row_groups(shard)

    # -- keyed requests ---------------------------------------------------------------------
    def _serve(self, pick) -> Tokens:
        """Run pick() on the active source; on a hub failure switch to builtin and retry once."""
        self._ensure_ready()
        if self.active is self.hub:
            try:
                return pick()
            except (DataRequestError, DataUnavailable):
                raise
            except Exception as exc:
                with self.setup_lock:
                    if self.active is self.hub:
                        self._fall_back(exc, "hub failed while streaming: " + describe_hub_error(exc))
        return pick()

    def _result(self, tokens: np.ndarray, shard: int, rg: int) -> Tokens:
        return Tokens(tokens, self.active.name, self.reason, self.active.data_id, shard, rg)

    def window(self, shard: int, rg: int, offset: int, length: int) -> Tokens:
        _check("offset", offset, 0, None)
        _check("length", length, 1, MAX_TOKENS)

        def pick() -> Tokens:
            _check("shard", shard, 0, self.num_shards() - 1)
            _check("rg", rg, 0, self.num_row_groups(shard) - 1)
            stream = self.row_group_tokens(shard, rg)
            if offset + length > len(stream):
                raise DataRequestError("offset", f"offset + length must be at most {len(stream)} "
                                       f"(tokens in shard {shard} row group {rg}), got {offset + length}")
            return self._result(stream[offset:offset + length], shard, rg)
        return self._serve(pick)

    def batch(self, seed: int, step: int, slot: int, batch: int, seq_len: int) -> Tokens:
        for name, value in (("seed", seed), ("step", step), ("slot", slot)):
            _check(name, value, 0, U32_MAX)
        _check("batch", batch, 1, MAX_TOKENS // 2)
        _check("seq_len", seq_len, 1, MAX_TOKENS - 1)
        if batch * (seq_len + 1) > MAX_TOKENS:
            raise DataRequestError("batch", f"batch * (seq_len + 1) must be at most {MAX_TOKENS}, "
                                   f"got {batch} * {seq_len + 1} = {batch * (seq_len + 1)}")

        def pick() -> Tokens:
            shard, rg = self.pick_row_group(seed, step, slot)
            stream = self.row_group_tokens(shard, rg)
            try:
                starts = data.batch_starts(len(stream), seed, step, slot, batch, seq_len)   # (B,)
            except data.DataError as exc:
                raise DataUnavailable(f"shard {shard} row group {rg}: {exc}") from exc
            rows = starts[:, None] + np.arange(seq_len + 1, dtype=np.int64)[None, :]         # (B, T+1)
            return self._result(stream[rows].reshape(-1), shard, rg)
        out = self._serve(pick)
        if self.prefetcher is not None and self.active.remote:
            self.prefetcher.after_batch(seed, step, slot)      # enqueue only: never waits
        return out

    def info(self) -> dict:
        self._ensure_ready()
        # no server paths here (cache folder, built-in corpus location): a public route
        hub = self.hub
        return {"source": self.source, "reason": self.reason, "summary": self.summary, "dataset": DATASET, "config": CONFIG,
                "revision": hub.revision, "column": TEXT_COLUMN, "tokenizer": TOKENIZER_ID, "eot": EOT,
                "max_tokens": MAX_TOKENS,
                "cache": {"bytes": hub.disk.total_bytes(), "limit_bytes": hub.disk.limit,
                          "memory_bytes": hub.memory.bytes, "memory_limit_bytes": hub.memory.limit},
                "prefetch": self.prefetcher.counts() if self.prefetcher is not None else {"steps": 0},
                **self.active.info()}


class Prefetcher:
    """One background thread that reads the row groups of the next steps' batches into the
    caches (module docstring, Prefetch). Bounded queue, no key queued twice, never blocks."""

    def __init__(self, source: "DataSource", steps: int):
        self.source, self.steps = source, steps
        self.queue: queue.Queue = queue.Queue(PREFETCH_QUEUE)
        self.pending: set = set()            # keys queued or being warmed
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.n = {"queued": 0, "fetched": 0, "cached": 0, "dropped": 0, "errors": 0}
        self.last_error: str | None = None

    def after_batch(self, seed: int, step: int, slot: int) -> None:
        """Batch (seed, step, slot) was served: warm the same slot's next steps."""
        for ahead in range(1, self.steps + 1):
            if step + ahead <= U32_MAX:
                self.offer((seed, step + ahead, slot))

    def offer(self, key: tuple) -> None:
        with self.lock:
            if key in self.pending:
                return
            try:
                self.queue.put_nowait(key)
            except queue.Full:
                self.n["dropped"] += 1           # a slow hub: the request path fetches it later
                return
            self.pending.add(key)
            self.n["queued"] += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="daisy-data-prefetch", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            key = self.queue.get()
            try:
                self._warm(key)
            except Exception as exc:     # the request path falls back; here we only count it
                with self.lock:
                    self.n["errors"] += 1
                    self.last_error = describe_hub_error(exc)
            finally:
                with self.lock:
                    self.pending.discard(key)
                self.queue.task_done()

    def _warm(self, key: tuple) -> None:
        src = self.source
        if not src.active.remote:
            return
        shard, rg = src.pick_row_group(*key)
        if src.is_cached(shard, rg):
            outcome = "cached"
        else:
            src.row_group_tokens(shard, rg)
            outcome = "fetched"
        with self.lock:
            self.n[outcome] += 1

    def idle(self) -> bool:
        with self.lock:
            return not self.pending

    def counts(self) -> dict:
        with self.lock:
            return {"steps": self.steps, "pending": len(self.pending), **self.n,
                    "last_error": self.last_error}


def _check(name: str, value: int, lo: int, hi: int | None) -> None:
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise DataRequestError(name, f"{name} must be an integer in {rng}, got {value}")


# -- HTTP -------------------------------------------------------------------------------------
def _int_params(query, names: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for name in names:
        raw = query.get(name)
        if raw is None or raw == "":
            raise DataRequestError(name, f"missing parameter {name} (an integer)")
        text = raw.strip()
        # one optional minus, then ASCII digits: int() would raise (a 500) on "--5" or "1-2"
        if len(text) > 40 or not re.fullmatch(r"-?[0-9]+", text):
            raise DataRequestError(name, f"{name} must be an integer, got {raw[:40]!r}")
        out[name] = int(text)
    return out


def _header_text(s: str) -> str:
    """Header-safe: printable ASCII, one line, bounded."""
    return "".join(c if " " <= c <= "~" else "?" for c in s)[:200]


def make_data_router(source: DataSource):
    """A FastAPI router with /data/info, /data/window and /data/batch over `source`."""
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse, Response

    router = APIRouter(prefix="/data")

    def tokens_response(t: Tokens) -> Response:
        headers = {"X-Daisy-Source": t.source, "X-Daisy-Data-Id": _header_text(t.data_id),
                   "X-Daisy-Tokens": str(len(t.tokens)), "X-Daisy-Shard": str(t.shard),
                   "X-Daisy-Row-Group": str(t.rg), "Cache-Control": "no-cache"}
        if t.reason:
            headers["X-Daisy-Fallback-Reason"] = _header_text(t.reason)
        return Response(t.tokens.astype("<u2").tobytes(), media_type="application/octet-stream", headers=headers)

    def answer(fn, query, names) -> Response:
        try:
            return tokens_response(fn(**_int_params(query, names)))
        except DataRequestError as exc:
            return JSONResponse({"error": str(exc), "code": ERROR_CODES[DataRequestError], "parameter": exc.parameter},
                                status_code=400)
        except DataUnavailable as exc:
            return JSONResponse({"error": str(exc), "code": ERROR_CODES[DataUnavailable]}, status_code=503)

    @router.get("/info")
    def data_info():
        return source.info()

    @router.get("/window")
    def data_window(request: Request):
        return answer(source.window, request.query_params, ("shard", "rg", "offset", "length"))

    @router.get("/batch")
    def data_batch(request: Request):
        return answer(source.batch, request.query_params, ("seed", "step", "slot", "batch", "seq_len"))

    return router


def main() -> None:
    import argparse

    import uvicorn
    from fastapi import FastAPI

    ap = argparse.ArgumentParser(description="Serve only the /data routes (tests, benchmarks).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7861)
    args = ap.parse_args()
    app = FastAPI()
    source = DataSource()
    source.start()
    app.include_router(make_data_router(source))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
