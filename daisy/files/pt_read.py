"""The restricted .pt reader: reading a file under a size limit, the zip read without copying
(CRC-checked stored entries under one folder), a scan of data.pkl against the budgets before the
real unpickler sees it, and a restricted unpickler that resolves only the globals a tensor
needs. It returns the top-level object with tensors as LoadedTensor; checkpoint_checks.py
validates it. Budgets and their reasons: checkpoint_checks.py and docs/TROUBLESHOOTING.md
("Checkpoint refused: over a budget").
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
import zlib

import numpy as np

from daisy.files.checkpoint_checks import (MAX_MEMO, MAX_NDIM, MAX_PICKLE_BYTES, MAX_PICKLE_OPS,
                                           MAX_VISITS, CheckpointError, LoadedTensor, c_strides,
                                           excerpt)

# torch storage type name -> the numpy dtype of its elements (all little-endian)
_STORAGE_DTYPES = {
    "DoubleStorage": "<f8", "FloatStorage": "<f4", "HalfStorage": "<f2", "BFloat16Storage": "<u2",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?",
}


def read_limited(path_or_bytes, max_bytes: int):
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
        return LoadedTensor(np.zeros(size, dtype=storage.dtype))
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
                              f"{excerpt(last)} of a storage of {storage.size}")
    if storage_offset == 0 and numel == storage.size and stride == c_strides(size):
        return LoadedTensor(storage.reshape(size))     # the usual case: a view, no copy
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[storage_offset:], shape=size,
                                           strides=tuple(s * item for s in stride), writeable=False)
    return LoadedTensor(np.array(view))            # own, contiguous copy


def _empty_ordered_dict(*args):
    """collections.OrderedDict as a checkpoint uses it: called with no arguments (items come
    by SETITEMS, which the scan checks); arguments would be hashed unchecked."""
    if args:
        raise CheckpointError("data.pkl: OrderedDict is built with arguments (only OrderedDict() "
                              "is allowed)")
    return collections.OrderedDict()


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
            raise CheckpointError(f"data.pkl: unsupported persistent id ({excerpt(pid)})")
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

    def memo_index(short, at):
        """The memo index after a (LONG_)BINPUT/BINGET opcode -> (index, position after it)."""
        if short:
            return data[at], at + 1
        return _U32.unpack_from(data, at)[0], at + 4

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
                idx, i = memo_index(op == 0x71, i)
                if idx > MAX_MEMO:
                    raise CheckpointError(f"checkpoint refused: data.pkl uses memo index {idx:,}, "
                                          f"over the budget of {MAX_MEMO:,}")
                memo[idx] = stack[-1]
            elif op in (0x68, 0x6A):                        # h BINGET, j LONG_BINGET
                idx, i = memo_index(op == 0x68, i)
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


def unpickle_zip(data: bytes):
    """The zip's top-level object, tensors as LoadedTensor."""
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
