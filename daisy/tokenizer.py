"""Byte-level tokenizer: ids 0..255 are UTF-8 bytes, 256 is EOT (end of text / document break).

Checkpoints and kits record TOKENIZER_ID; loaders refuse any other id.
JS twin: frontend_js/tokenizer.js.
"""
import numpy as np

TOKENIZER_ID = "daisy-bytes-v1"
EOT = 256
VOCAB_SIZE = 257


def encode(text: str) -> np.ndarray:
    """str -> uint16 token ids (its UTF-8 bytes)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def encode_documents(docs) -> np.ndarray:
    """Documents -> one token stream, each document followed by EOT."""
    parts = []
    for d in docs:
        parts.append(encode(d))
        parts.append(np.array([EOT], dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def decode(ids) -> str:
    """Token ids -> text. EOT becomes a blank line; invalid UTF-8 is replaced, never raised."""
    out, run = [], bytearray()
    for t in ids:
        t = int(t)
        if t == EOT:
            out.append(run.decode("utf-8", errors="replace"))
            out.append("\n\n")
            run = bytearray()
        elif 0 <= t < 256:
            run.append(t)
        else:
            raise ValueError(f"token id {t} outside the vocabulary 0..{VOCAB_SIZE - 1}")
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)
