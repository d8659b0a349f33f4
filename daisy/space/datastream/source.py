"""DataSource: the keyed requests (window, batch; package docstring, Keys) on the active source
of the fallback (fallback.py), with the caches (cache.py) and the server's prefetch
(prefetch.py) built from the environment."""
import os
from dataclasses import dataclass

import numpy as np

from daisy import data, prng
from daisy.space.datastream.builtin_source import BuiltinSource
from daisy.space.datastream.cache import DiskCache, KeyLocks, MemoryCache
from daisy.space.datastream.errors import DataRequestError, DataUnavailable
from daisy.space.datastream.fallback import Fallback
from daisy.space.datastream.hub_source import CONFIG, DATASET, REVISION, TEXT_COLUMN, HubSource
from daisy.space.datastream.keys import MAX_TOKENS, PICK_ROW_GROUP, U32_MAX, check_range
from daisy.space.datastream.prefetch import PREFETCH_STEPS, Prefetcher
from daisy.space.env import env_number
from daisy.tokenizer import EOT, TOKENIZER_ID


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


class DataSource:
    """The data route's source: the hub with the built-in corpus as its fallback (`sources`, a
    Fallback), the keyed requests (window, batch) served on whichever is active, and the
    prefetcher of the next steps' row groups."""

    def __init__(self, *, endpoint: str | None = None, revision: str | None = None,
                 cache_dir: str | None = None, cache_mb: int | None = None,
                 mem_mb: int | None = None, builtin_path: str | None = None,
                 prefetch_steps: int | None = None):
        cache_dir = cache_dir or os.environ.get("DAISY_DATA_CACHE_DIR") or os.path.expanduser("~/.cache/daisy/data")
        disk = DiskCache(cache_dir, (cache_mb if cache_mb is not None else _env_int("DAISY_DATA_CACHE_MB", 256)) << 20)
        memory = MemoryCache((mem_mb if mem_mb is not None else _env_int("DAISY_DATA_MEM_MB", 64)) << 20)
        hub = HubSource(endpoint or os.environ.get("HF_ENDPOINT") or None,
                        revision or os.environ.get("DAISY_DATA_REVISION") or REVISION, disk, memory, KeyLocks())
        builtin = BuiltinSource(builtin_path or os.environ.get("DAISY_DATA_BUILTIN") or str(data.BUILTIN_CORPUS))
        self.sources = Fallback(hub, builtin)
        steps = prefetch_steps if prefetch_steps is not None else _env_int("DAISY_DATA_PREFETCH_STEPS", PREFETCH_STEPS)
        self.prefetcher = Prefetcher(self.sources, self.pick_row_group, steps) if steps > 0 else None

    def start(self) -> None:
        """Pin the data's commit now, in the background (Fallback.start)."""
        self.sources.start()

    @property
    def source(self) -> str:
        return self.sources.active.name

    @property
    def data_id(self) -> str:
        return self.sources.data_id

    def pick_row_group(self, seed: int, step: int, slot: int) -> tuple[int, int]:
        """(shard, rg) of the batch (seed, step, slot): the rule of the package docstring."""
        choice = prng.key(prng.PURPOSE_DATA, seed, step, slot, PICK_ROW_GROUP)
        shard = prng.draw(choice, 0) % self.sources.num_shards()
        return shard, prng.draw(choice, 1) % self.sources.num_row_groups(shard)

    # -- keyed requests ---------------------------------------------------------------------
    def _result(self, tokens: np.ndarray, shard: int, rg: int) -> Tokens:
        active = self.sources.active
        return Tokens(tokens, active.name, self.sources.reason, active.data_id, shard, rg)

    def window(self, shard: int, rg: int, offset: int, length: int) -> Tokens:
        check_range("offset", offset, 0, None)
        check_range("length", length, 1, MAX_TOKENS)

        def pick() -> Tokens:
            check_range("shard", shard, 0, self.sources.num_shards() - 1)
            check_range("rg", rg, 0, self.sources.num_row_groups(shard) - 1)
            stream = self.sources.row_group_tokens(shard, rg)
            if offset + length > len(stream):
                raise DataRequestError("offset", f"offset + length must be at most {len(stream)} "
                                       f"(tokens in shard {shard} row group {rg}), got {offset + length}")
            return self._result(stream[offset:offset + length], shard, rg)
        return self.sources.serve(pick)

    def batch(self, seed: int, step: int, slot: int, batch: int, seq_len: int) -> Tokens:
        for name, value in (("seed", seed), ("step", step), ("slot", slot)):
            check_range(name, value, 0, U32_MAX)
        check_range("batch", batch, 1, MAX_TOKENS // 2)
        check_range("seq_len", seq_len, 1, MAX_TOKENS - 1)
        if batch * (seq_len + 1) > MAX_TOKENS:
            raise DataRequestError("batch", f"batch * (seq_len + 1) must be at most {MAX_TOKENS}, "
                                   f"got {batch} * {seq_len + 1} = {batch * (seq_len + 1)}")

        def pick() -> Tokens:
            shard, rg = self.pick_row_group(seed, step, slot)
            stream = self.sources.row_group_tokens(shard, rg)
            try:
                starts = data.batch_starts(len(stream), seed, step, slot, batch, seq_len)   # (B,)
            except data.DataError as exc:
                raise DataUnavailable(f"shard {shard} row group {rg}: {exc}") from exc
            rows = starts[:, None] + np.arange(seq_len + 1, dtype=np.int64)[None, :]         # (B, T+1)
            return self._result(stream[rows].reshape(-1), shard, rg)
        out = self.sources.serve(pick)
        if self.prefetcher is not None and self.sources.active.remote:
            self.prefetcher.after_batch(seed, step, slot)      # enqueue only: never waits
        return out

    def info(self) -> dict:
        self.sources.ensure_ready()
        # no server paths here (cache folder, built-in corpus location): a public route
        hub = self.sources.hub
        return {"source": self.source, "reason": self.sources.reason, "summary": self.sources.summary,
                "dataset": DATASET, "config": CONFIG,
                "revision": hub.revision, "column": TEXT_COLUMN, "tokenizer": TOKENIZER_ID, "eot": EOT,
                "max_tokens": MAX_TOKENS,
                "cache": {"bytes": hub.disk.total_bytes(), "limit_bytes": hub.disk.limit,
                          "memory_bytes": hub.memory.bytes, "memory_limit_bytes": hub.memory.limit},
                "prefetch": self.prefetcher.counts() if self.prefetcher is not None else {"steps": 0},
                **self.sources.active.info()}
