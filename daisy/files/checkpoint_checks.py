"""Checkpoint validation: the error type, the budgets for untrusted files, the Checkpoint value,
and the checks of config, tensor names/shapes/dtypes and plain values, on save and on load.

daisy.files.checkpoint is the public entry (it re-exports what callers need); the .pt writer
(pt_write.py) and the restricted reader (pt_read.py) use the error, budgets and helpers here.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from daisy.config import Config, ConfigError
from daisy.hashing import weight_hash
from daisy.model import param_shapes as _model_param_shapes
from daisy.tokenizer import TOKENIZER_ID, VOCAB_SIZE

FORMAT = "daisychain"
FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 64 * 1024 * 1024   # the largest settings (width 128, T 128, L 8) are ~40 MB

_DTYPE_NAMES = {"<f8": "float64", "<f4": "float32", "<f2": "float16", "<u2": "bfloat16",
                "<i8": "int64", "<i4": "int32", "<i2": "int16", "i1": "int8", "u1": "uint8",
                "?": "bool"}


class CheckpointError(ValueError):
    """A checkpoint file is refused; the message names the problem."""


# Budgets for untrusted files (docs/TROUBLESHOOTING.md, "Checkpoint refused: over a budget").
# A pickle can share references, so a small file can describe a structure with 2^48 leaves:
# every walk counts visits (a shared reference costs each time it is reached), and everything
# that allocates is checked before it allocates. The largest honest file (width 128, 8 layers,
# full optimizer state) uses ~5,000 opcodes, ~1,300 memo slots and 5 M tensor elements.
MAX_PICKLE_BYTES = 4 << 20            # data.pkl (tensor data lives in other entries)
MAX_PICKLE_OPS = 1 << 20              # opcodes in data.pkl
MAX_MEMO = 1 << 16                    # highest memo index (the unpickler allocates up to it)
MAX_VISITS = 100_000                  # per walk of plain values, and per tuple (hashing walks it)
MAX_DEPTH = 32                        # nesting of plain values in "extra"
MAX_NDIM = 8                          # dimensions of one tensor


def short_name(value, limit: int = 40) -> str:
    """A key or name from a file for a message: the text itself (cut to limit) when it is a
    string, else a bounded excerpt."""
    if isinstance(value, str):
        return value[:limit] + ("..." if len(value) > limit else "")
    return excerpt(value, limit)


def excerpt(value, limit: int = 40) -> str:
    """A short, bounded description of an untrusted value for a message: never its full repr
    (the repr of a shared-reference structure can be astronomically long)."""
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= 64 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, (str, bytes, bytearray)):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    return f"a {type(value).__name__}"


@dataclasses.dataclass
class Checkpoint:
    config: dict              # plain ints, validated by daisy.config
    params: dict              # name -> float64 array, in param_shapes order
    adam_m: dict              # same names/shapes
    adam_v: dict
    step: int
    weight_hash: str          # daisy.hashing.weight_hash(params), checked on load
    adam_t: int = 0           # Adam's step counter
    extra: dict | None = None

    @property
    def adam(self) -> dict:
        """The optimizer state in daisy.optim's form: {"t", "m", "v"}."""
        return {"t": self.adam_t, "m": self.adam_m, "v": self.adam_v}


class LoadedTensor:
    """A tensor as the restricted reader (pt_read.py) hands it over: a numpy array."""
    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


def c_strides(shape) -> tuple:
    """C-order strides in elements: (3, 4) -> (4, 1)."""
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return tuple(reversed(stride))


# ---------------------------------------------------------------------------------------------
# The model's tensor names and shapes

def param_shapes(config) -> dict:
    """name -> shape in the canonical (hash) order, for a Config or a config dict."""
    return _model_param_shapes(config if isinstance(config, Config) else Config.from_dict(config))


def _config_dict(config) -> dict:
    if isinstance(config, Config):
        return config.to_dict()
    if isinstance(config, dict):
        return dict(config)
    raise CheckpointError(f"config must be a daisy.config.Config or a dict, got {type(config).__name__}")


def validated_config(config) -> dict:
    """-> plain dict of every Config field (defaults filled in), or CheckpointError."""
    try:
        cfg = config if isinstance(config, Config) else Config.from_dict(_config_dict(config))
    except ConfigError as e:
        raise CheckpointError(f"bad config: {e}") from None
    except TypeError as e:   # a field of the wrong kind (e.g. a list) fails inside validation
        raise CheckpointError(f"bad config: {e}") from None
    return cfg.to_dict()


def checked_tensors(group: str, arrays: dict, shapes: dict) -> dict:
    """Same names, shapes and float64 as the config says -> name -> contiguous '<f8' array."""
    missing = [n for n in shapes if n not in arrays]
    unexpected = [n for n in arrays if n not in shapes]
    if missing:
        raise CheckpointError(f"{group} is missing tensor(s): {', '.join(missing)}")
    if unexpected:
        raise CheckpointError(f"{group} has unexpected tensor(s): {', '.join(map(str, unexpected))}")
    out = {}
    for name, shape in shapes.items():
        a = arrays[name]
        if not isinstance(a, np.ndarray):
            raise CheckpointError(f"{group}[{name!r}] is a {type(a).__name__}, expected a float64 array")
        if a.dtype != np.float64:
            raise CheckpointError(f"{group}[{name!r}] has dtype {a.dtype}, expected float64")
        if a.shape != shape:
            raise CheckpointError(f"{group}[{name!r}] has shape {a.shape}, expected {shape}")
        out[name] = np.ascontiguousarray(a, dtype="<f8")
    return out


def check_plain(value, where="extra"):
    """extra values must be plain data (no arrays, no objects) so the file stays weights_only-safe.
    Iterative, with a budget of MAX_VISITS visits (shared references count each time) and
    MAX_DEPTH levels: a file's `extra` is untrusted."""
    todo, visits = [(value, 0)], 0
    while todo:
        x, depth = todo.pop()
        visits += 1
        if visits > MAX_VISITS:
            raise CheckpointError(f"{where} is too large: over {MAX_VISITS:,} values "
                                  f"(shared references count each time they are reached)")
        if x is None or isinstance(x, (bool, int, float, str)):
            continue
        if depth >= MAX_DEPTH and isinstance(x, (list, tuple, dict)):
            raise CheckpointError(f"{where} is nested deeper than {MAX_DEPTH} levels")
        if isinstance(x, (list, tuple)):
            todo.extend((v, depth + 1) for v in x)
        elif isinstance(x, dict):
            for k, v in x.items():
                if not isinstance(k, str):
                    raise CheckpointError(f"{where} keys must be strings, found {excerpt(k)}")
                todo.append((v, depth + 1))
        else:
            raise CheckpointError(f"{where} holds a {type(x).__name__}; only plain values are allowed")


def _tensor_group(group: str, obj, shapes: dict, cfg: dict) -> dict:
    if not isinstance(obj, dict):
        raise CheckpointError(f"{group} must be a dict of tensors, found {type(obj).__name__}")
    missing = [n for n in shapes if n not in obj]
    unexpected = [n for n in obj if n not in shapes]
    if missing:
        raise CheckpointError(f"{group} is missing tensor(s): {', '.join(missing[:8])}"
                              + (" ..." if len(missing) > 8 else ""))
    if unexpected:
        raise CheckpointError(f"{group} has unexpected tensor(s): {', '.join(map(short_name, unexpected[:8]))}"
                              + (" ..." if len(unexpected) > 8 else ""))
    dims = f"width={cfg['width']}, seq_len={cfg['seq_len']}, vocab={VOCAB_SIZE}"
    out = {}
    for name, shape in shapes.items():
        t = obj[name]
        if not isinstance(t, LoadedTensor):
            raise CheckpointError(f"{group}[{name!r}] is not a tensor ({type(t).__name__})")
        a = t.array
        if not isinstance(a, np.ndarray):           # a pickle BUILD could have replaced it
            raise CheckpointError(f"{group}[{name!r}] is not a tensor")
        if a.shape != shape:
            raise CheckpointError(f"tensor {group}[{name!r}] has shape {a.shape}, expected {shape} "
                                  f"for the checkpoint's config ({dims})")
        if a.dtype != np.float64:
            raise CheckpointError(f"tensor {group}[{name!r}] has dtype "
                                  f"{_DTYPE_NAMES.get(a.dtype.str, a.dtype.name)}, expected float64")
        out[name] = a
    return out


def _int_field(where, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"{where} must be a non-negative integer, found {excerpt(value)}")
    return value


def _looks_like(top) -> str:
    if isinstance(top, dict):
        tensors = [k for k, v in top.items() if isinstance(v, LoadedTensor)]
        if tensors:
            return (f"it holds {len(tensors)} tensor(s) ({', '.join(map(short_name, tensors[:4]))}"
                    f"{', ...' if len(tensors) > 4 else ''}), like another model's state_dict")
        return f"its top-level dict has keys {', '.join(map(short_name, list(top)[:6]))}"
    return f"its top-level object is a {type(top).__name__}"


def checkpoint_from_top(top) -> Checkpoint:
    """The unpickled top-level object of a .pt -> a validated Checkpoint, or CheckpointError."""
    if not isinstance(top, dict) or top.get("format") != FORMAT:
        raise CheckpointError(f"not a DaisyChain checkpoint: {_looks_like(top)} "
                              f"(expected 'format': {FORMAT!r})")
    if top.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"unsupported checkpoint format_version {excerpt(top.get('format_version'))} "
                              f"(this reader knows {FORMAT_VERSION})")
    if top.get("tokenizer") != TOKENIZER_ID:
        raise CheckpointError(f"tokenizer mismatch: expected {TOKENIZER_ID!r}, found "
                              f"{excerpt(top.get('tokenizer'), 60)}")
    for key in ("config", "step", "weight_hash", "model", "optim"):
        if key not in top:
            raise CheckpointError(f"checkpoint is missing {key!r}")
    raw_cfg = top["config"]
    if not isinstance(raw_cfg, dict):
        raise CheckpointError(f"config must be a dict, found {type(raw_cfg).__name__}")
    for k, v in raw_cfg.items():   # before daisy.config, whose messages show the values
        if k == "exchange":         # the one string setting: daisy.config checks its value
            if not isinstance(v, str) or len(v) > 16:
                raise CheckpointError(f"config setting exchange must be a codec name, found {excerpt(v)}")
            continue
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or \
                v.bit_length() > 64:
            raise CheckpointError(f"config setting {short_name(k)} must be an integer, found {excerpt(v)}")
    # a checkpoint written before the exchange setting existed trained with f64 (its default then)
    # and `local_steps` is left out of the wire form at its default 1 (daisy/config.py)
    raw_cfg = {"exchange": "f64", "local_steps": 1, **raw_cfg}
    absent = [f.name for f in dataclasses.fields(Config) if f.name not in raw_cfg]
    if absent:
        raise CheckpointError(f"config is missing setting(s): {', '.join(absent)}")
    cfg = validated_config(raw_cfg)
    step = _int_field("step", top["step"])
    optim = top["optim"]
    if not isinstance(optim, dict) or not {"t", "m", "v"} <= set(optim):
        raise CheckpointError("optim must be a dict with 't', 'm' and 'v'")
    adam_t = _int_field("optim.t", optim["t"])
    shapes = param_shapes(cfg)
    params = _tensor_group("model", top["model"], shapes, cfg)
    adam_m = _tensor_group("optim.m", optim["m"], shapes, cfg)
    adam_v = _tensor_group("optim.v", optim["v"], shapes, cfg)
    stored = top["weight_hash"]
    actual = weight_hash(params)
    if stored != actual:
        raise CheckpointError(f"weight hash mismatch: the file says {short_name(stored, 64)}, its weights "
                              f"hash to {actual} (the tensor data is corrupt or was altered)")
    extra = top.get("extra")
    if extra is not None and not isinstance(extra, dict):
        raise CheckpointError(f"extra must be a dict, found {type(extra).__name__}")
    if extra is not None:
        check_plain(extra)
    return Checkpoint(config=cfg, params=params, adam_m=adam_m, adam_v=adam_v, step=step,
                      weight_hash=actual, adam_t=adam_t, extra=extra)
