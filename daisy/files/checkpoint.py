"""Checkpoint files: PyTorch-compatible .pt (zip) and model.safetensors, written and read without torch.

A .pt file here has the layout `torch.save` writes for a dict of CPU float64 tensors:

    archive/data.pkl                  pickle protocol 2 of the top-level dict; each tensor is
                                      torch._utils._rebuild_tensor_v2(storage, 0, shape, stride,
                                      False, OrderedDict()) over a persistent-id storage
                                      ('storage', torch.DoubleStorage, key, 'cpu', numel)
    archive/.storage_alignment        "64"
    archive/byteorder                 "little"
    archive/data/<key>                raw little-endian float64 bytes, stored (not deflated),
                                      data start 64-byte aligned (padding in the zip extra field)
    archive/version                   "3\\n"
    archive/.data/serialization_id    40 decimal digits (derived from the content: files are
                                      byte-for-byte reproducible)

We leave out `.format_version`: with it, torch may compute storage offsets assuming miniz's
data-descriptor layout, which Python's zipfile does not write.

Top-level object (plain ints and strings, tensors in the module-name order of `param_shapes`):
    {"format": "daisychain", "format_version": 1, "tokenizer": "daisy-bytes-v1",
     "config": {...}, "step": int, "weight_hash": str,
     "model": {name: tensor}, "optim": {"t": int, "m": {name: tensor}, "v": {name: tensor}},
     ["extra": {...plain values...}]}

Loading never runs code from the file: a restricted unpickler resolves only the three globals
above (plus the other torch storage type names, so a wrong dtype gets a precise message) and
refuses everything else before anything is called.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import json
import os
import pickle
import struct
import tempfile
import zipfile
import zlib
from typing import Any

import numpy as np

from daisy.config import Config, ConfigError
from daisy.hashing import weight_hash
from daisy.model import param_shapes as _model_param_shapes
from daisy.tokenizer import TOKENIZER_ID, VOCAB_SIZE

FORMAT = "daisychain"
FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 64 * 1024 * 1024   # the largest settings (width 128, T 128, L 8) are ~40 MB
ARCHIVE = "archive"
ALIGN = 64

# torch storage type name -> the numpy dtype of its elements (all little-endian)
_STORAGE_DTYPES = {
    "DoubleStorage": "<f8", "FloatStorage": "<f4", "HalfStorage": "<f2", "BFloat16Storage": "<u2",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?",
}
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


def _name(value, limit: int = 40) -> str:
    """A key or name from a file for a message: the text itself (cut to limit) when it is a
    string, else a bounded excerpt."""
    if isinstance(value, str):
        return value[:limit] + ("..." if len(value) > limit else "")
    return _excerpt(value, limit)


def _excerpt(value, limit: int = 40) -> str:
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


def _validated_config(config) -> dict:
    """-> plain dict of every Config field (defaults filled in), or CheckpointError."""
    try:
        cfg = config if isinstance(config, Config) else Config.from_dict(_config_dict(config))
    except ConfigError as e:
        raise CheckpointError(f"bad config: {e}") from None
    except TypeError as e:   # a field of the wrong kind (e.g. a list) fails inside validation
        raise CheckpointError(f"bad config: {e}") from None
    return cfg.to_dict()


# ---------------------------------------------------------------------------------------------
# Writing .pt

class _Tensor:
    """A float64 array to be pickled as a torch tensor over storage `key`."""
    __slots__ = ("array", "key")

    def __init__(self, array, key):
        self.array, self.key = array, key


class _PickleWriter:
    """Emits pickle protocol 2 opcodes for the few types a checkpoint holds. Written by hand
    because pickle's own Pickler would import torch to resolve torch's globals."""

    def __init__(self):
        self.out = io.BytesIO()
        self.out.write(b"\x80\x02")                        # PROTO 2

    def dump(self, obj) -> bytes:
        self._obj(obj)
        self.out.write(b".")                               # STOP
        return self.out.getvalue()

    def _global(self, module, name):
        self.out.write(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

    def _obj(self, obj):
        w = self.out.write
        if obj is None:
            w(b"N")
        elif obj is True:
            w(b"\x88")
        elif obj is False:
            w(b"\x89")
        elif isinstance(obj, int):
            if 0 <= obj < 256:
                w(b"K" + bytes([obj]))                     # BININT1
            elif -2**31 <= obj < 2**31:
                w(b"J" + struct.pack("<i", obj))           # BININT
            else:
                n = obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True)
                w(b"\x8a" + bytes([len(n)]) + n)           # LONG1
        elif isinstance(obj, float):
            w(b"G" + struct.pack(">d", obj))               # BINFLOAT
        elif isinstance(obj, str):
            b = obj.encode("utf-8")
            w(b"X" + struct.pack("<I", len(b)) + b)        # BINUNICODE
        elif isinstance(obj, tuple):
            if not obj:
                w(b")")
            else:
                w(b"(")
                for x in obj:
                    self._obj(x)
                w(b"t")
        elif isinstance(obj, list):
            w(b"]")                                        # EMPTY_LIST
            if obj:
                w(b"(")
                for x in obj:
                    self._obj(x)
                w(b"e")                                    # APPENDS
        elif isinstance(obj, dict):
            w(b"}")                                        # EMPTY_DICT
            if obj:
                w(b"(")
                for k, v in obj.items():
                    self._obj(k)
                    self._obj(v)
                w(b"u")                                    # SETITEMS
        elif isinstance(obj, _Tensor):
            a = obj.array
            shape = tuple(int(s) for s in a.shape)
            self._global("torch._utils", "_rebuild_tensor_v2")
            w(b"(")
            w(b"(")
            self._obj("storage")
            self._global("torch", "DoubleStorage")
            self._obj(obj.key)
            self._obj("cpu")
            self._obj(int(a.size))
            w(b"t")
            w(b"Q")                                        # BINPERSID
            self._obj(0)                                   # storage offset
            self._obj(shape)
            self._obj(_c_strides(shape))
            self._obj(False)                               # requires_grad
            self._global("collections", "OrderedDict")     # backward hooks: OrderedDict()
            w(b")R")
            w(b"t")
            w(b"R")                                        # REDUCE
        else:
            raise CheckpointError(f"cannot store a value of type {type(obj).__name__} in a checkpoint")


def _checked_tensors(group: str, arrays: dict, shapes: dict) -> dict:
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


def _check_plain(value, where="extra"):
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
                    raise CheckpointError(f"{where} keys must be strings, found {_excerpt(k)}")
                todo.append((v, depth + 1))
        else:
            raise CheckpointError(f"{where} holds a {type(x).__name__}; only plain values are allowed")


def _aligned_zipinfo(name: str, offset: int) -> zipfile.ZipInfo:
    """A stored entry whose data starts on an ALIGN boundary, padded like torch's writer does
    (an extra field with id 'FB')."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    header = 30 + len(name.encode()) + 4          # local header + name + extra field header
    pad = -(offset + header) % ALIGN
    info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
    return info


def _write_zip(fileobj, records) -> None:
    """records: [(name, bytes-like)] written as stored, aligned entries under ARCHIVE/."""
    with zipfile.ZipFile(fileobj, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, data in records:
            zf.writestr(_aligned_zipinfo(f"{ARCHIVE}/{name}", fileobj.tell()), data)


def save_checkpoint(path_or_file, *, config, params, step, adam_m, adam_v, adam_t=None,
                    extra=None):
    """Write a .pt checkpoint that torch.load(weights_only=True) opens.

    path_or_file: a path (written atomically: temp file, then rename), a binary file object,
    or None to get the file's bytes back. adam_t defaults to step (Adam's counter)."""
    cfg = _validated_config(config)
    shapes = param_shapes(cfg)
    model = _checked_tensors("model", params, shapes)
    m = _checked_tensors("optim.m", adam_m, shapes)
    v = _checked_tensors("optim.v", adam_v, shapes)
    adam_t = step if adam_t is None else adam_t
    for label, n in (("step", step), ("adam_t", adam_t)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise CheckpointError(f"{label} must be a non-negative integer, got {n!r}")
    if extra is not None:
        if not isinstance(extra, dict):
            raise CheckpointError(f"extra must be a dict, got {type(extra).__name__}")
        _check_plain(extra)

    storages = []                                   # key order = order of first use in the pickle

    def tensors(arrays):
        out = {}
        for name, a in arrays.items():
            out[name] = _Tensor(a, str(len(storages)))
            storages.append(a)
        return out

    top = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "tokenizer": TOKENIZER_ID,
        "config": cfg, "step": int(step), "weight_hash": weight_hash(model),
        "model": tensors(model),
        "optim": {"t": int(adam_t), "m": tensors(m), "v": tensors(v)},
    }
    if extra is not None:
        top["extra"] = extra
    pkl = _PickleWriter().dump(top)
    serialization_id = str(int.from_bytes(hashlib.sha256(pkl).digest()[:16], "little")).zfill(40)
    records = [("data.pkl", pkl), (".storage_alignment", b"64"), ("byteorder", b"little")]
    records += [(f"data/{i}", memoryview(a).cast("B")) for i, a in enumerate(storages)]
    records += [("version", b"3\n"), (".data/serialization_id", serialization_id.encode())]

    if path_or_file is None:
        buf = io.BytesIO()
        _write_zip(buf, records)
        return buf.getvalue()
    if hasattr(path_or_file, "write"):
        buf = io.BytesIO()                          # the caller's stream may not be seekable
        _write_zip(buf, records)
        path_or_file.write(buf.getbuffer())
        return None
    path = os.fspath(path_or_file)
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            _write_zip(f, records)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return None


# ---------------------------------------------------------------------------------------------
# Reading .pt

def _read_limited(path_or_bytes, max_bytes: int):
    """The whole file as one writable buffer, bytearray or uint8 array (arrays loaded from it
    are views, not copies)."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        if len(path_or_bytes) > max_bytes:
            raise CheckpointError(_too_big(len(path_or_bytes), max_bytes))
        return bytearray(path_or_bytes)
    if hasattr(path_or_bytes, "read"):
        data = bytearray(path_or_bytes.read(max_bytes + 1))
        if len(data) > max_bytes:
            raise CheckpointError(_too_big(len(data), max_bytes, exact=False))
    else:
        path = os.fspath(path_or_bytes)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise CheckpointError(_too_big(size, max_bytes))
                data = np.empty(size, dtype=np.uint8)   # not zero-filled, unlike bytearray(size)
                with memoryview(data) as view:
                    n = 0
                    while n < size and (k := f.readinto(view[n:])):
                        n += k
                if n < size or f.read(1):             # the file changed while we read it
                    raise CheckpointError(f"checkpoint {path!r} changed while it was being read")
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint {path!r}: {e.strerror or e}") from None
    return data


def _too_big(size, max_bytes, exact=True):
    # a stream is read only up to max_bytes + 1 bytes, so its true size is unknown beyond that
    what = f"{size:,} bytes" if exact else f"more than {max_bytes:,} bytes"
    mib = f" ({max_bytes / 2**20:g} MiB)" if max_bytes % 2**20 == 0 else ""
    return f"file is too large: {what}, over the size limit of {max_bytes:,} bytes{mib}"


class _Storage:
    """A storage type named in the pickle (torch.DoubleStorage etc.); never callable."""
    __slots__ = ("name", "dtype")

    def __init__(self, name):
        self.name, self.dtype = name, np.dtype(_STORAGE_DTYPES[name])


class _LoadedTensor:
    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None, *, budget=None):
    """Stand-in for torch._utils._rebuild_tensor_v2: a numpy view of the storage, bounds-checked.
    budget: a one-item list of tensor elements still allowed (counted before any copy)."""
    if not isinstance(storage, np.ndarray):
        raise CheckpointError("data.pkl: a tensor is not built over a storage")
    ints = lambda t: isinstance(t, tuple) and all(isinstance(x, int) and not isinstance(x, bool)
                                                  for x in t)
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) <= MAX_NDIM
            and len(size) == len(stride)):
        raise CheckpointError(f"data.pkl: a tensor's shape and stride are not two tuples of the "
                              f"same length (at most {MAX_NDIM})")
    if not (isinstance(storage_offset, int) and ints(size) and ints(stride)):
        raise CheckpointError("data.pkl: a tensor has a malformed offset, shape or stride")
    if storage_offset < 0 or any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise CheckpointError("data.pkl: a tensor has a negative offset, shape or stride")
    if 0 in size:
        return _LoadedTensor(np.zeros(size, dtype=storage.dtype))
    # Stride 0 (or overlapping strides) makes a tiny storage look huge, and the copy below
    # would allocate it all: every dimension of more than one element needs a stride > 0, and
    # all tensors together hold at most the budget's elements.
    if any(s == 0 and n > 1 for n, s in zip(size, stride)):
        raise CheckpointError("data.pkl: a tensor has stride 0 (elements that share storage)")
    numel = 1
    for n in size:
        numel *= n
    if budget is not None:
        budget[0] -= numel
        if budget[0] < 0:
            raise CheckpointError("data.pkl: the tensors hold more elements than the file can "
                                  "(over the budget of the size limit / 8)")
    last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= storage.size:
        raise CheckpointError(f"data.pkl: a tensor of {len(size)} dimension(s) reaches element "
                              f"{_excerpt(last)} of a storage of {storage.size}")
    if storage_offset == 0 and numel == storage.size and stride == _c_strides(size):
        return _LoadedTensor(storage.reshape(size))     # the usual case: a view, no copy
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[storage_offset:], shape=size,
                                           strides=tuple(s * item for s in stride), writeable=False)
    return _LoadedTensor(np.array(view))            # own, contiguous copy


def _empty_ordered_dict(*args):
    """collections.OrderedDict as a checkpoint uses it: called with no arguments (items come
    by SETITEMS, which the scan checks); arguments would be hashed unchecked."""
    if args:
        raise CheckpointError("data.pkl: OrderedDict is built with arguments (only OrderedDict() "
                              "is allowed)")
    return collections.OrderedDict()


def _c_strides(shape) -> tuple:
    """C-order strides in elements: (3, 4) -> (4, 1)."""
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return tuple(reversed(stride))


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals a tensor checkpoint needs; anything else is refused before it
    could be called. Storages are read from the zip by persistent id."""

    def __init__(self, data: bytes, read_storage, max_elements: int):
        super().__init__(io.BytesIO(data))
        self._read_storage = read_storage
        self._storages = {}
        self._budget = [max_elements]

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            budget = self._budget
            return lambda *args: _rebuild_tensor_v2(*args, budget=budget)
        if (module, name) == ("collections", "OrderedDict"):
            return _empty_ordered_dict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _Storage(name)
        raise CheckpointError(
            f"refused: data.pkl asks for the Python global {module[:60]}.{name[:60]}; a checkpoint may only "
            f"use torch._utils._rebuild_tensor_v2, collections.OrderedDict and torch storage types "
            f"(this file could run code if opened with plain pickle)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _Storage) and isinstance(pid[2], str)
                and isinstance(pid[3], str) and isinstance(pid[4], int)):
            raise CheckpointError(f"data.pkl: unsupported persistent id ({_excerpt(pid)})")
        _, stype, key, _location, numel = pid
        if key not in self._storages:
            raw = self._read_storage(key)
            if len(raw) != numel * stype.dtype.itemsize:
                raise CheckpointError(f"storage data/{key} holds {len(raw)} bytes, expected "
                                      f"{numel} x {stype.dtype.itemsize}")
            self._storages[key] = np.frombuffer(raw, dtype=stype.dtype)
        arr = self._storages[key]
        if arr.dtype != stype.dtype:
            raise CheckpointError(f"storage data/{key} is used with two dtypes")
        return arr


class _BufferReader(io.RawIOBase):
    """A seekable read-only file over a buffer without copying it (io.BytesIO copies a bytearray)."""

    def __init__(self, data):
        self._view, self._pos = memoryview(data), 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b):
        chunk = self._view[self._pos:self._pos + len(b)]
        b[:len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


_U16, _U32, _I32 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<i")


_NOT_STR_KEY = "checkpoint refused: data.pkl has a dict key that is not a string"


def _scan_pickle(pkl: bytes) -> None:
    """Check data.pkl against the budgets before the real (C) unpickler sees it: only the
    opcodes a protocol-2 tensor checkpoint uses, at most MAX_PICKLE_OPS of them, memo indexes
    up to MAX_MEMO (the unpickler allocates up to the highest index), and no tuple that expands
    to more than MAX_VISITS items (dict keys are hashed, and hashing a tuple walks all of it,
    shared references included), and only strings as dict keys (an honest checkpoint has no
    other keys; ints can be made to collide in a dict, tuples are costly to hash). The scan
    follows the stack: one int per item, 0 for a string, a tuple's expanded size, 1 for
    anything else (the walks of lists and dicts are budgeted after loading)."""
    if len(pkl) > MAX_PICKLE_BYTES:
        raise CheckpointError(f"checkpoint refused: data.pkl is {len(pkl):,} bytes, over the "
                              f"budget of {MAX_PICKLE_BYTES:,}")
    data, n, i, ops = pkl, len(pkl), 0, 0
    stack, marks, memo = [], [], {}

    def tuple_of(items):
        w = 1 + sum(items) + items.count(0)
        if w > MAX_VISITS:
            raise CheckpointError(f"checkpoint refused: data.pkl builds a tuple of over "
                                  f"{MAX_VISITS:,} items (shared references count each time)")
        return w

    try:
        while True:
            op = data[i]
            i += 1
            ops += 1
            if op == 0x58:                                  # X BINUNICODE
                i += 4 + _U32.unpack_from(data, i)[0]
                stack.append(0)
            elif op in (0x4B, 0x88, 0x89, 0x4E, 0x29, 0x5D, 0x7D):  # K, True, False, N, ), ], }
                i += op == 0x4B
                stack.append(1)
            elif op == 0x28:                                # ( MARK
                marks.append(len(stack))
            elif op == 0x74:                                # t TUPLE
                at = marks.pop()
                w = tuple_of(stack[at:])
                del stack[at:]
                stack.append(w)
            elif op in (0x85, 0x86, 0x87):                  # TUPLE1..3
                k = op - 0x84
                w = tuple_of(stack[-k:])
                del stack[-k:]
                stack.append(w)
            elif op in (0x52, 0x81):                        # REDUCE, NEWOBJ: callable, args -> 1
                stack.pop()
                stack[-1] = 1
            elif op == 0x51:                                # Q BINPERSID
                stack[-1] = 1
            elif op in (0x71, 0x72):                        # q BINPUT, r LONG_BINPUT
                if op == 0x71:
                    idx = data[i]
                    i += 1
                else:
                    idx = _U32.unpack_from(data, i)[0]
                    i += 4
                if idx > MAX_MEMO:
                    raise CheckpointError(f"checkpoint refused: data.pkl uses memo index {idx:,}, "
                                          f"over the budget of {MAX_MEMO:,}")
                memo[idx] = stack[-1]
            elif op in (0x68, 0x6A):                        # h BINGET, j LONG_BINGET
                if op == 0x68:
                    idx = data[i]
                    i += 1
                else:
                    idx = _U32.unpack_from(data, i)[0]
                    i += 4
                stack.append(memo[idx])
            elif op == 0x63:                                # c GLOBAL: two text lines
                i = data.index(b"\n", data.index(b"\n", i) + 1) + 1
                stack.append(1)
            elif op in (0x4A, 0x4D, 0x47):                  # J BININT, M BININT2, G BINFLOAT
                i += {0x4A: 4, 0x4D: 2, 0x47: 8}[op]
                stack.append(1)
            elif op == 0x8A:                                # LONG1
                i += 1 + data[i]
                stack.append(1)
            elif op == 0x8C:                                # SHORT_BINUNICODE
                i += 1 + data[i]
                stack.append(0)
            elif op == 0x75:                                # u SETITEMS
                at = marks.pop()
                if any(stack[at::2]):
                    raise CheckpointError(_NOT_STR_KEY)
                del stack[at:]
            elif op == 0x65:                                # e APPENDS
                del stack[marks.pop():]
            elif op == 0x73:                                # s SETITEM
                if stack[-2]:
                    raise CheckpointError(_NOT_STR_KEY)
                del stack[-2:]
            elif op in (0x61, 0x62, 0x30):                  # a APPEND, b BUILD, 0 POP
                stack.pop()
            elif op == 0x32:                                # 2 DUP
                stack.append(stack[-1])
            elif op == 0x31:                                # 1 POP_MARK
                del stack[marks.pop():]
            elif op == 0x80:                                # PROTO
                i += 1
            elif op == 0x95:                                # FRAME (protocol 4): a length
                i += 8
            elif op == 0x94:                                # MEMOIZE (protocol 4)
                if len(memo) > MAX_MEMO:
                    raise CheckpointError(f"checkpoint refused: data.pkl uses over {MAX_MEMO:,} "
                                          f"memo slots")
                memo[len(memo)] = stack[-1]
            elif op == 0x93:                                # STACK_GLOBAL: module, name -> 1
                stack.pop()
                stack[-1] = 1
            elif op == 0x2E:                                # . STOP
                return
            else:
                raise CheckpointError(f"checkpoint refused: data.pkl uses pickle opcode "
                                      f"0x{op:02x} at byte {i - 1}, which a tensor checkpoint "
                                      f"does not need")
            if ops > MAX_PICKLE_OPS:
                raise CheckpointError(f"checkpoint refused: data.pkl has over {MAX_PICKLE_OPS:,} "
                                      f"opcodes")
    except CheckpointError:
        raise
    except (IndexError, KeyError, ValueError, struct.error):
        raise CheckpointError("corrupt checkpoint: data.pkl is not a valid pickle (truncated, "
                              "or it uses a memo slot or stack item that does not exist)") from None



def _unpickle_zip(data: bytes):
    """The zip's top-level object, tensors as _LoadedTensor."""
    try:
        zf = zipfile.ZipFile(_BufferReader(data))     # parses the central directory only
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as e:
        raise CheckpointError(f"not a PyTorch zip checkpoint (truncated or corrupt file?): {e}") from None
    with zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        if not names:
            raise CheckpointError("not a PyTorch zip checkpoint: the zip archive is empty")
        if len(set(names)) != len(names):
            raise CheckpointError("corrupt checkpoint: the zip archive has duplicate entries")
        prefix = names[0].split("/", 1)[0] + "/"
        if any(not n.startswith(prefix) for n in names):
            raise CheckpointError("not a PyTorch zip checkpoint: entries are not all under one folder")
        if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
            raise CheckpointError("not a PyTorch zip checkpoint: entries are compressed")
        if sum(i.file_size for i in infos) > len(data):   # stored entries cannot exceed the file
            raise CheckpointError("corrupt checkpoint: zip entry sizes exceed the file size")
        if prefix + "data.pkl" not in names:
            raise CheckpointError(f"not a PyTorch zip checkpoint: no data.pkl in the archive "
                                  f"(found {', '.join(names[:5])})")

        entries = {i.filename: i for i in infos}
        buf = memoryview(data)

        def read(name):
            """A stored entry's bytes as a view into `data`, CRC-checked."""
            info = entries.get(prefix + name)
            if info is None:
                raise CheckpointError(f"corrupt checkpoint: the archive has no entry {name}")
            start = info.header_offset
            head = bytes(buf[start:start + 30])
            if len(head) < 30 or head[:4] != b"PK\x03\x04":
                raise CheckpointError(f"corrupt checkpoint: entry {name} has no local header")
            name_len, extra_len = struct.unpack("<HH", head[26:30])
            begin = start + 30 + name_len + extra_len
            if begin + info.file_size > len(buf):
                raise CheckpointError(f"corrupt checkpoint: entry {name} runs past the end of the file")
            chunk = buf[begin:begin + info.file_size]
            if zlib.crc32(chunk) != info.CRC:
                raise CheckpointError(f"corrupt checkpoint: entry {name} fails its CRC-32 check")
            return chunk

        if prefix + "byteorder" in names and bytes(read("byteorder")) != b"little":
            raise CheckpointError(f"unsupported byte order {bytes(read('byteorder'))!r:.20} "
                                  f"(expected b'little')")
        pkl = bytes(read("data.pkl"))
        _scan_pickle(pkl)
        try:
            return _RestrictedUnpickler(pkl, lambda key: read(f"data/{key}"),
                                        len(data) // 8 + 4096).load()
        except CheckpointError:
            raise
        except Exception as e:   # any malformed pickle: stack underflow, bad opcode, EOF, ...
            raise CheckpointError(f"corrupt checkpoint: data.pkl is not a valid pickle "
                                  f"({type(e).__name__}: {str(e)[:200]})") from None


def _tensor_group(group: str, obj, shapes: dict, cfg: dict) -> dict:
    if not isinstance(obj, dict):
        raise CheckpointError(f"{group} must be a dict of tensors, found {type(obj).__name__}")
    missing = [n for n in shapes if n not in obj]
    unexpected = [n for n in obj if n not in shapes]
    if missing:
        raise CheckpointError(f"{group} is missing tensor(s): {', '.join(missing[:8])}"
                              + (" ..." if len(missing) > 8 else ""))
    if unexpected:
        raise CheckpointError(f"{group} has unexpected tensor(s): {', '.join(map(_name, unexpected[:8]))}"
                              + (" ..." if len(unexpected) > 8 else ""))
    dims = f"width={cfg['width']}, seq_len={cfg['seq_len']}, vocab={VOCAB_SIZE}"
    out = {}
    for name, shape in shapes.items():
        t = obj[name]
        if not isinstance(t, _LoadedTensor):
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
        raise CheckpointError(f"{where} must be a non-negative integer, found {_excerpt(value)}")
    return value


def _looks_like(top) -> str:
    if isinstance(top, dict):
        tensors = [k for k, v in top.items() if isinstance(v, _LoadedTensor)]
        if tensors:
            return (f"it holds {len(tensors)} tensor(s) ({', '.join(map(_name, tensors[:4]))}"
                    f"{', ...' if len(tensors) > 4 else ''}), like another model's state_dict")
        return f"its top-level dict has keys {', '.join(map(_name, list(top)[:6]))}"
    return f"its top-level object is a {type(top).__name__}"


def load_checkpoint(path_or_bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Checkpoint:
    """Read and validate a .pt checkpoint (ours, or torch.save of the same dict). Pure: it never
    executes code from the file and changes nothing; any problem raises CheckpointError.
    path_or_bytes: a path, bytes-like, or a binary file object."""
    try:
        return _load_checkpoint(path_or_bytes, max_bytes)
    except RecursionError:                          # absurdly nested plain values in the pickle
        raise CheckpointError("corrupt checkpoint: values are nested too deeply") from None


def _load_checkpoint(path_or_bytes, max_bytes: int) -> Checkpoint:
    data = _read_limited(path_or_bytes, max_bytes)
    top = _unpickle_zip(data)
    if not isinstance(top, dict) or top.get("format") != FORMAT:
        raise CheckpointError(f"not a DaisyChain checkpoint: {_looks_like(top)} "
                              f"(expected 'format': {FORMAT!r})")
    if top.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"unsupported checkpoint format_version {_excerpt(top.get('format_version'))} "
                              f"(this reader knows {FORMAT_VERSION})")
    if top.get("tokenizer") != TOKENIZER_ID:
        raise CheckpointError(f"tokenizer mismatch: expected {TOKENIZER_ID!r}, found "
                              f"{_excerpt(top.get('tokenizer'), 60)}")
    for key in ("config", "step", "weight_hash", "model", "optim"):
        if key not in top:
            raise CheckpointError(f"checkpoint is missing {key!r}")
    raw_cfg = top["config"]
    if not isinstance(raw_cfg, dict):
        raise CheckpointError(f"config must be a dict, found {type(raw_cfg).__name__}")
    for k, v in raw_cfg.items():   # before daisy.config, whose messages show the values
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or \
                v.bit_length() > 64:
            raise CheckpointError(f"config setting {_name(k)} must be an integer, found {_excerpt(v)}")
    absent = [f.name for f in dataclasses.fields(Config) if f.name not in raw_cfg]
    if absent:
        raise CheckpointError(f"config is missing setting(s): {', '.join(absent)}")
    cfg = _validated_config(raw_cfg)
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
        raise CheckpointError(f"weight hash mismatch: the file says {_name(stored, 64)}, its weights "
                              f"hash to {actual} (the tensor data is corrupt or was altered)")
    extra = top.get("extra")
    if extra is not None and not isinstance(extra, dict):
        raise CheckpointError(f"extra must be a dict, found {type(extra).__name__}")
    if extra is not None:
        _check_plain(extra)
    return Checkpoint(config=cfg, params=params, adam_m=adam_m, adam_v=adam_v, step=step,
                      weight_hash=actual, adam_t=adam_t, extra=extra)


# ---------------------------------------------------------------------------------------------
# model.safetensors (weights only): u64 LE header length, JSON header, raw data

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
    data = memoryview(_read_limited(path_or_bytes, max_bytes)).cast("B")
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
