"""Training data for the reference trainer: a token stream and the batch addressing rule.

A batch is addressed by (run seed, step, slot), so any peer can rebuild any other's batch:
    k = prng.key(PURPOSE_DATA, seed, step, slot)        step counts from 0
    start_b = prng.draw(k, b) mod (len(stream) - T)     b = 0..B-1
    x_b = stream[start_b : start_b + T],  y_b = stream[start_b + 1 : start_b + T + 1]
JS twin: frontend_js/data.js.
"""
from pathlib import Path

import numpy as np

from . import prng
from .tokenizer import encode_documents

BUILTIN_CORPUS = Path(__file__).parent / "corpus" / "builtin.txt"
DOC_SEPARATOR = "\n\n\n"


class DataError(ValueError):
    """The data file cannot be used; the message says why."""


def corpus_documents(text: str) -> list:
    """A corpus file's text -> its documents: separated by DOC_SEPARATOR, blank ones dropped, each
    without its leading and trailing newlines (the one rule: the CLI and the Space's data route)."""
    return [d.strip("\n") for d in text.split(DOC_SEPARATOR) if d.strip()]


def builtin_documents(path=BUILTIN_CORPUS) -> list:
    return corpus_documents(Path(path).read_text(encoding="utf-8"))


def builtin_stream(path=BUILTIN_CORPUS) -> np.ndarray:
    """The built-in corpus as one uint16 token stream (documents each followed by EOT)."""
    return encode_documents(builtin_documents(path))


def parquet_stream(path) -> np.ndarray:
    """A parquet file with a string column `text` (FineWeb-Edu's schema) -> token stream."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise DataError(f"--data: no such file: {path}") from None
    except Exception as e:   # pyarrow raises ArrowInvalid and friends for non-parquet bytes
        raise DataError(f"--data: {path} is not a readable parquet file ({e})") from None
    if "text" not in pf.schema_arrow.names:
        raise DataError(f"--data: {path} has no 'text' column (FineWeb-Edu schema expected); "
                        f"columns: {', '.join(pf.schema_arrow.names)}")
    col = pf.read(columns=["text"]).column("text")
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise DataError(f"--data: column 'text' in {path} has type {col.type}, expected string")
    docs = [d for d in col.to_pylist() if d]
    if not docs:
        raise DataError(f"--data: {path} has no non-empty 'text' rows")
    return encode_documents(docs)


def batch_starts(n_tokens: int, seed: int, step: int, slot: int, B: int, T: int) -> np.ndarray:
    """(B,) start offsets of the batch of (seed, step, slot) in a stream of n_tokens."""
    if n_tokens < T + 1:
        raise DataError(f"the token stream has {n_tokens} tokens; at least seq_len+1 = {T + 1} needed")
    k = prng.key(prng.PURPOSE_DATA, seed, step, slot)
    return prng.draw(k, np.arange(B, dtype=np.uint32)).astype(np.int64) % (n_tokens - T)


def get_batch(stream: np.ndarray, seed: int, step: int, slot: int, B: int, T: int):
    """-> x (B, T), y (B, T) int64 token ids."""
    starts = batch_starts(len(stream), seed, step, slot, B, T)     # (B,)
    rows = starts[:, None] + np.arange(T + 1)[None, :]              # (B, T+1)
    return split_rows(stream[rows], B, T)


def split_rows(rows, B: int, T: int):
    """B rows of T+1 tokens ((B, T+1) or flat, row-major; e.g. a /data/batch answer) ->
    x (B, T), y (B, T) int64: x = row[:, :-1], y = row[:, 1:]."""
    window = np.asarray(rows).astype(np.int64).reshape(B, T + 1)
    return window[:, :-1], window[:, 1:]
