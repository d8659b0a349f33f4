"""model.safetensors (weights only): u64 LE header length, JSON header, raw data. F64 only."""
from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

from daisy.files.checkpoint_checks import DEFAULT_MAX_BYTES, CheckpointError
from daisy.files.pt_read import read_limited


def save_safetensors(path_or_file, params: dict, metadata: dict | None = None):
    """Write float64 params as safetensors ('F64'); metadata: str -> str (stored in
    __metadata__). path_or_file may be None to get the bytes back."""
    metadata = dict(metadata or {})
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise CheckpointError(f"safetensors metadata must map str to str, got {k!r}: {v!r:.40}")
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    arrays, offset = [], 0
    for name, a in params.items():
        if not isinstance(a, np.ndarray) or a.dtype != np.float64:
            raise CheckpointError(f"safetensors: {name!r} must be a float64 array")
        a = np.ascontiguousarray(a, dtype="<f8")
        header[name] = {"dtype": "F64", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)                    # data starts 8-byte aligned
    chunks = [struct.pack("<Q", len(hjson)), hjson] + [memoryview(a).cast("B") for a in arrays]
    if path_or_file is None:
        return b"".join(chunks)
    if hasattr(path_or_file, "write"):
        for c in chunks:
            path_or_file.write(c)
        return None
    with open(os.fspath(path_or_file), "wb") as f:
        for c in chunks:
            f.write(c)
    return None


def load_safetensors(path_or_bytes, *, max_bytes: int = DEFAULT_MAX_BYTES):
    """-> (params: name -> float64 array in file-header order, metadata: dict). F64 only."""
    data = memoryview(read_limited(path_or_bytes, max_bytes)).cast("B")
    if len(data) < 8:
        raise CheckpointError("not a safetensors file: shorter than its 8-byte header length")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > len(data) - 8:
        raise CheckpointError(f"not a safetensors file (truncated?): header length {hlen} exceeds "
                              f"the file's {len(data) - 8} remaining bytes")
    try:
        header = json.loads(bytes(data[8:8 + hlen]))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"not a safetensors file: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError("not a safetensors file: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError("safetensors: __metadata__ must map strings to strings")
    body = data[8 + hlen:]
    params, spans = {}, []
    for name, entry in header.items():
        if not isinstance(entry, dict) or entry.get("dtype") != "F64":
            found = entry.get("dtype") if isinstance(entry, dict) else entry
            raise CheckpointError(f"safetensors: tensor {name!r} has dtype {found!r:.20}, expected 'F64'")
        shape, offs = entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)
                and isinstance(offs, list) and len(offs) == 2
                and all(isinstance(o, int) for o in offs) and 0 <= offs[0] <= offs[1] <= len(body)):
            raise CheckpointError(f"safetensors: tensor {name!r} has a malformed shape or data_offsets")
        if offs[1] - offs[0] != 8 * int(np.prod(shape, dtype=np.int64)):
            raise CheckpointError(f"safetensors: tensor {name!r} of shape {tuple(shape)} spans "
                                  f"{offs[1] - offs[0]} bytes")
        spans.append(tuple(offs))
        params[name] = np.frombuffer(body[offs[0]:offs[1]], dtype="<f8").reshape(shape)  # view of a private buffer
    pos = 0
    for begin, end in sorted(spans):                      # data must be covered exactly once
        if begin != pos:
            raise CheckpointError("safetensors: tensor data overlaps or leaves gaps")
        pos = end
    if pos != len(body):
        raise CheckpointError(f"safetensors: {len(body) - pos} trailing bytes after the tensor data")
    return params, metadata
