"""The *state body*: one replica (weights, optionally Adam's moments) as compact bytes.

The page sends its replica to the model routes (daisy/space/model_routes.py) in this form and gets a loaded
checkpoint back in it; frontend_js/state_codec.js is its JS twin (one module per language; here
under files/ with the other file formats, there beside the mirror: the page reads no files).

    bytes 0..7     u64 LE  N = length of the header (a multiple of 8: JSON padded with spaces)
    bytes 8..8+N   UTF-8 JSON header:
                   {"format": "daisychain-state", "version": 1, "config": {8 ints},
                    "step": int, "adam_t": int, "parts": ["model"] | ["model", "optim.m", "optim.v"],
                    ["weight_hash": hex str], ["extra": {plain values}]}
    then           float64 little-endian values: for each part in order, every tensor of the
                   config in the canonical order (daisy.model.param_shapes), row-major.
                   The length must be exactly what the config and parts say.

The float data starts 8-byte aligned, so the page reads it with one Float64Array per tensor.
A weight_hash, when given, must equal the hash of the weights received (a transfer check).

A refused body raises StateError; its message names the problem.
"""
import json
import struct

import numpy as np

from daisy.config import RANGES, Config, ConfigError
from daisy.hashing import weight_hash
from daisy.files.checkpoint import param_shapes   # a Config or a config dict -> canonical shapes
from daisy.model import param_count

STATE_FORMAT = "daisychain-state"
STATE_VERSION = 1
PARTS_WEIGHTS = ("model",)
PARTS_FULL = ("model", "optim.m", "optim.v")
MAX_STATE_HEADER = 64 * 1024


# the largest settings' full state (~38 MiB) plus the header: a bigger body is refused unread
MAX_STATE_BYTES = 8 + MAX_STATE_HEADER + 8 * len(PARTS_FULL) * param_count(
    Config(**{name: RANGES[name][1] for name in ("width", "seq_len", "layers", "heads")}))


class StateError(ValueError):
    """A state body is refused; the message names the problem."""


def encode_state(*, config, step: int, params: dict, adam_m: dict | None = None,
                 adam_v: dict | None = None, adam_t: int | None = None, weight_hash: str | None = None,
                 extra: dict | None = None) -> bytes:
    """A replica -> the state body. With adam_m/adam_v all three parts, else the weights only."""
    cfg = config.to_dict() if isinstance(config, Config) else dict(config)
    shapes = param_shapes(cfg)
    groups = [params] if adam_m is None else [params, adam_m, adam_v]
    header = {"format": STATE_FORMAT, "version": STATE_VERSION, "config": cfg, "step": int(step),
              "adam_t": int(step if adam_t is None else adam_t),
              "parts": list(PARTS_WEIGHTS if adam_m is None else PARTS_FULL)}
    if weight_hash is not None:
        header["weight_hash"] = weight_hash
    if extra is not None:
        header["extra"] = extra
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    chunks = [struct.pack("<Q", len(hjson)), hjson]
    for group in groups:
        chunks += [np.ascontiguousarray(group[name], dtype="<f8").tobytes() for name in shapes]
    return b"".join(chunks)


def _header_int(header: dict, key: str) -> int:
    v = header.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise StateError(f"state header: {key} must be a non-negative integer, got {v!r:.40}")
    return v


def decode_state(body, *, need_optim: bool, need_hash: bool = False) -> dict:
    """The state body -> {config (dict), step, adam_t, params, adam_m, adam_v (None when only
    the weights came), weight_hash (computed), extra}. Shapes come from the config; the data
    length must match exactly. need_hash: the header must carry the weight_hash to check."""
    data = memoryview(body).cast("B")
    if len(data) < 8:
        raise StateError(f"the state body is {len(data)} bytes, shorter than its 8-byte header length")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > MAX_STATE_HEADER or hlen > len(data) - 8:
        raise StateError(f"state header length {hlen} is over the limit of {MAX_STATE_HEADER} bytes "
                         f"or past the end of the {len(data)}-byte body")
    if hlen % 8:
        raise StateError(f"state header length {hlen} is not a multiple of 8")
    try:
        header = json.loads(bytes(data[8:8 + hlen]))
    except (UnicodeDecodeError, ValueError) as e:
        raise StateError(f"state header is not JSON ({e})") from None
    except RecursionError:          # [[[[...]]]] past the parser's depth: a refusal, not a 500
        raise StateError("state header nests too deeply to be a DaisyChain state header") from None
    if not isinstance(header, dict) or header.get("format") != STATE_FORMAT:
        raise StateError(f"not a DaisyChain state body (expected format {STATE_FORMAT!r})")
    if header.get("version") != STATE_VERSION:
        raise StateError(f"unsupported state version {header.get('version')!r:.20} "
                         f"(this server knows {STATE_VERSION})")
    raw_cfg = header.get("config")
    if not isinstance(raw_cfg, dict):
        raise StateError("state header: config must be an object of the run's settings")
    try:
        cfg = Config.from_dict(raw_cfg).to_dict()
    except (ConfigError, TypeError) as e:
        raise StateError(f"bad config: {e}") from None
    step, adam_t = _header_int(header, "step"), _header_int(header, "adam_t")
    parts = tuple(header.get("parts") or ())
    if parts not in (PARTS_WEIGHTS, PARTS_FULL):
        raise StateError(f"state header: parts must be {list(PARTS_WEIGHTS)} or {list(PARTS_FULL)}, "
                         f"got {header.get('parts')!r:.80}")
    if need_optim and parts != PARTS_FULL:
        raise StateError("a checkpoint needs the optimizer state: send parts "
                         f"{list(PARTS_FULL)}, got {list(parts)}")
    shapes = param_shapes(cfg)
    sizes = {name: int(np.prod(shape)) for name, shape in shapes.items()}
    per_part = sum(sizes.values())
    tensor_bytes = len(data) - 8 - hlen
    want = 8 * per_part * len(parts)
    if tensor_bytes != want:
        dims = ", ".join(f"{k}={cfg[k]}" for k in ("width", "seq_len", "layers"))
        raise StateError(f"the state body holds {tensor_bytes} bytes of tensor data; the config "
                         f"({dims}) needs {want} for {len(parts)} part(s) of {per_part} float64 values")
    values = np.frombuffer(data[8 + hlen:], dtype="<f8")
    groups, at = [], 0
    for _ in parts:
        group = {}
        for name, shape in shapes.items():
            group[name] = values[at:at + sizes[name]].reshape(shape)
            at += sizes[name]
        groups.append(group)
    params = groups[0]
    claimed = header.get("weight_hash")
    if need_hash and claimed is None:
        raise StateError("the state header carries no weight_hash to check the weights against")
    actual = weight_hash(params)
    if claimed is not None and claimed != actual:
        raise StateError(f"weight hash mismatch: the page says {str(claimed):.64}, the weights "
                         f"received hash to {actual}")
    extra = header.get("extra")
    if extra is not None and not isinstance(extra, dict):
        raise StateError(f"state header: extra must be an object, got {type(extra).__name__}")
    return {"config": cfg, "step": step, "adam_t": adam_t, "params": params,
            "adam_m": groups[1] if len(groups) > 1 else None,
            "adam_v": groups[2] if len(groups) > 2 else None,
            "weight_hash": actual, "extra": extra}
