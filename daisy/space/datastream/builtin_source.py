"""The built-in corpus as a source: one shard with one row group (its whole stream), so a
built-in batch equals daisy.data.get_batch(builtin_stream(), seed, step, slot, B, T) bit for bit.
Its documents by daisy.data.corpus_documents (the CLI's rule); its data id names the file's bytes:
    data_id = "builtin:{sha256 of the corpus file, 16 hex}:daisy-bytes-v1"
"""
import hashlib
import os
import threading

import numpy as np

from daisy import data
from daisy.space.datastream.errors import DataUnavailable
from daisy.tokenizer import TOKENIZER_ID, encode_documents


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
