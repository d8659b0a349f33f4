"""FineWeb-Edu on the Hub, one row group at a time, at one pinned commit.

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
Pin a commit for good with DAISY_DATA_REVISION=<sha> (it is checked against the hub too).

Token stream of a row group: as in the package docstring, exactly as daisy.data.parquet_stream
does for a whole file. Decoded row groups go through the caches (cache.py).
"""
import re

import numpy as np

from daisy.space.datastream.cache import DiskCache, KeyLocks, MemoryCache
from daisy.space.datastream.errors import DataUnavailable
from daisy.tokenizer import TOKENIZER_ID, encode_documents

DATASET = "HuggingFaceFW/fineweb-edu"
CONFIG = "sample-10BT"
SHARD_DIR = "sample/10BT"
# The requested revision; resolved to its commit sha when the source starts online (Pinning).
REVISION = "main"
TEXT_COLUMN = "text"

BLOCK_SIZE = 64 * 1024            # HfFileSystem block size; with cache_type="none" no read-ahead


class HubSource:
    """FineWeb-Edu row groups from the hub at one pinned commit (this module's docstring: Source,
    Pinning; cache.py). open() resolves the revision and lists the shards, raising on any hub
    failure."""
    name = "fineweb-edu"
    remote = True                            # reads cost hub round trips: worth prefetching

    def __init__(self, endpoint: str | None, revision: str, disk: DiskCache, memory: MemoryCache, locks: KeyLocks):
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
