"""The .pt writer: a hand-written pickle protocol 2 emitter and the zip layout torch.save uses
(stored entries, data 64-byte aligned), byte-for-byte reproducible. The layout is described in
daisy/files/checkpoint.py; what goes in is validated there first (checkpoint_checks.py).
"""
from __future__ import annotations

import hashlib
import io
import os
import struct
import tempfile
import zipfile

from daisy.files.checkpoint_checks import CheckpointError, c_strides

ARCHIVE = "archive"
ALIGN = 64


class PtTensor:
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
        elif isinstance(obj, PtTensor):
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
            self._obj(c_strides(shape))
            self._obj(False)                               # requires_grad
            self._global("collections", "OrderedDict")     # backward hooks: OrderedDict()
            w(b")R")
            w(b"t")
            w(b"R")                                        # REDUCE
        else:
            raise CheckpointError(f"cannot store a value of type {type(obj).__name__} in a checkpoint")


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


def write_pt(path_or_file, top, storages):
    """Pickle `top` (PtTensor leaves over `storages`, indexed by key) into a .pt zip.

    path_or_file: a path (written atomically: temp file, then rename), a binary file object,
    or None to get the file's bytes back."""
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
