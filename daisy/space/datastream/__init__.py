"""Training data for the group: FineWeb-Edu streamed by row group, or the built-in corpus.

One module per job:
    errors.py          DataRequestError (400), DataUnavailable (503), ERROR_CODES (the JSON `code`)
    keys.py            the bounds of a keyed request (MAX_TOKENS, U32_MAX, PICK_ROW_GROUP), check_range
    cache.py           DiskCache, MemoryCache (row groups' tokens), KeyLocks (fetch each once)
    hub_source.py      HubSource: FineWeb-Edu on the Hub at a pinned commit (Source, Pinning)
    builtin_source.py  BuiltinSource: the built-in corpus as one shard of one row group
    fallback.py        Fallback: the hub, switching to the built-in corpus for good on a hub failure
    prefetch.py        Prefetcher: the server's warming of the next steps' row groups
    source.py          DataSource: the keyed requests (window, batch) and /data/info
    routes.py          make_data_router: GET /data/info, /data/window, /data/batch
    __main__.py        python -m daisy.space.datastream --host 127.0.0.1 --port 7861 (tests, bench)

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

Data ids (hub_source.py, builtin_source.py): two servers that would serve different bytes never
show the same one, so peers compare it before sharing batches:
    data_id = "HuggingFaceFW/fineweb-edu@{commit sha}:sample-10BT:text:daisy-bytes-v1"
    builtin = "builtin:{sha256 of the corpus file, 16 hex}:daisy-bytes-v1"

Sources. HubSource and BuiltinSource answer one interface (data_id, num_shards,
num_row_groups, is_cached, row_group_tokens, info); Fallback answers it on the active one, and
DataSource serves the keyed requests through it.

The names the app, tests and benches use are importable from this package.
"""
from daisy.space.datastream.builtin_source import BuiltinSource
from daisy.space.datastream.cache import DiskCache, KeyLocks, MemoryCache
from daisy.space.datastream.errors import ERROR_CODES, DataRequestError, DataUnavailable
from daisy.space.datastream.fallback import FALLBACK_SUMMARIES, Fallback, describe_hub_error, hub_error_kind
from daisy.space.datastream.hub_source import (BLOCK_SIZE, CONFIG, DATASET, REVISION, SHARD_DIR,
                                               TEXT_COLUMN, HubSource)
from daisy.space.datastream.keys import MAX_TOKENS, PICK_ROW_GROUP, U32_MAX
from daisy.space.datastream.prefetch import PREFETCH_QUEUE, PREFETCH_STEPS, Prefetcher
from daisy.space.datastream.routes import make_data_router
from daisy.space.datastream.source import DataSource, Tokens

__all__ = [
    "BLOCK_SIZE", "CONFIG", "DATASET", "ERROR_CODES", "FALLBACK_SUMMARIES", "MAX_TOKENS",
    "PICK_ROW_GROUP", "PREFETCH_QUEUE", "PREFETCH_STEPS", "REVISION", "SHARD_DIR", "TEXT_COLUMN",
    "U32_MAX", "BuiltinSource", "DataRequestError", "DataSource", "DataUnavailable", "DiskCache",
    "Fallback", "HubSource", "KeyLocks", "MemoryCache", "Prefetcher", "Tokens", "describe_hub_error",
    "hub_error_kind", "make_data_router",
]
