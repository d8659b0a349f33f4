"""Hostile checkpoint files (issue 13, part 1): each attack is a small file that cost the old
loader exponential time or gigabytes. Each load runs in a forked child with a CPU limit, an
address-space limit and a wall-clock timeout, so a regression fails the test instead of
stalling the suite. See docs/TROUBLESHOOTING.md, "Checkpoint refused: over a budget"."""
from __future__ import annotations

import io
import multiprocessing
import os
import resource
import struct
import time
import zipfile

import numpy as np
import pytest


from daisy.files.checkpoint import (MAX_DEPTH, MAX_MEMO, CheckpointError, load_checkpoint, param_shapes,
                              save_checkpoint)

CFG = dict(width=16, seq_len=16, batch=2, steps=100, lr_x1000=10, layers=1, heads=4, seed=3)


@pytest.fixture(scope="module")
def blob():
    z = {n: np.zeros(s) for n, s in param_shapes(CFG).items()}
    return save_checkpoint(None, config=CFG, params=z, step=1, adam_m=z, adam_v=z)


def entries_of(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def with_pickle(blob: bytes, pkl: bytes) -> bytes:
    entries = entries_of(blob)
    entries["archive/data.pkl"] = pkl
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


# ---- a tiny pickle assembler ----------------------------------------------------------------

def s(text: str) -> bytes:                     # BINUNICODE
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def put(i: int) -> bytes:                      # LONG_BINPUT
    return b"r" + struct.pack("<I", i)


def get(i: int) -> bytes:                      # LONG_BINGET
    return b"j" + struct.pack("<I", i)


def list_dag(depth: int, base: int = 0) -> bytes:
    """A list of two references to the level below, `depth` times: 2**depth leaves in a few
    hundred bytes. Leaves the top list on the stack."""
    ops = b"]" + put(base)
    for d in range(depth):
        ops += b"0](" + get(base + d) + get(base + d) + b"e" + put(base + d + 1)
    return ops


def tuple_dag(depth: int, base: int = 0) -> bytes:
    ops = b")" + put(base)
    for d in range(depth):
        ops += b"0" + get(base + d) + get(base + d) + b"\x86" + put(base + d + 1)
    return ops


def extend_top(blob: bytes, items: bytes) -> bytes:
    """The valid file's data.pkl with more key/value pairs added to its top-level dict (its
    last SETITEMS is the top dict's: the writer emits `... u .`)."""
    pkl = entries_of(blob)["archive/data.pkl"]
    assert pkl.endswith(b"u.")
    return with_pickle(blob, pkl[:-2] + items + b"u.")


def tensor(numel_storage: int, size: tuple, stride: tuple, key: str = "0") -> bytes:
    ints = lambda t: b"(" + b"".join(b"J" + struct.pack("<i", x) for x in t) + b"t"
    return (b"ctorch._utils\n_rebuild_tensor_v2\n((" + s("storage") + b"ctorch\nDoubleStorage\n"
            + s(key) + s("cpu") + b"J" + struct.pack("<i", numel_storage) + b"tQK\x00"
            + ints(size) + ints(stride) + b"\x89ccollections\nOrderedDict\n)RtR")


# ---- running a load with limits ---------------------------------------------------------------

def _child(conn, data, cpu_s, mem_mb):
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + mem_mb * 2**20,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    t0 = time.monotonic()
    try:
        load_checkpoint(data)
        conn.send(("loaded", "", time.monotonic() - t0))
    except BaseException as e:  # noqa: BLE001  (report whatever it was)
        conn.send((type(e).__name__, str(e)[:2000], time.monotonic() - t0))


def bounded_load(data: bytes, *, cpu_s=4, mem_mb=400, wall_s=8.0):
    """load_checkpoint(data) in a forked child -> (exception type name or 'loaded', message,
    seconds); ('killed', exit code, seconds) when a limit or the timeout ended it."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, data, cpu_s, mem_mb))
    t0 = time.monotonic()
    proc.start()
    try:
        if parent.poll(wall_s):
            return parent.recv()
        return ("killed", "timeout", time.monotonic() - t0)
    except EOFError:
        proc.join(2)
        return ("killed", proc.exitcode, time.monotonic() - t0)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)


def refused_fast(data: bytes, *parts: str, within_s: float = 2.0) -> str:
    kind, msg, took = bounded_load(data)
    assert kind == "CheckpointError", f"expected a clean refusal, got {kind}: {msg}"
    for part in parts:
        assert part in msg, f"{part!r} not in the message: {msg}"
    assert took < within_s, f"refusal took {took:.1f} s"
    assert len(msg) < 400, f"message of {len(msg)} chars"
    return msg


# ---- the attacks -----------------------------------------------------------------------------

def test_the_honest_file_loads_under_the_same_limits(blob):
    assert bounded_load(blob)[0] == "loaded"


def test_shared_reference_dag_in_extra_is_refused_by_the_visit_budget(blob):
    """A 2**30-leaf list DAG in `extra` (a few hundred bytes; the finding used depth 48): the
    old plain-value check walked every leaf."""
    refused_fast(extend_top(blob, s("extra") + b"}(" + s("x") + list_dag(30) + b"u"),
                 "extra is too large", "shared references")


def test_deep_nesting_in_extra_is_refused(blob):
    deep = b"](" * 5000 + b"]" + b"e" * 5000  # 5001 levels
    msg = refused_fast(extend_top(blob, s("extra") + b"}(" + s("x") + deep + b"u"))
    assert f"deeper than {MAX_DEPTH}" in msg


def test_refusal_messages_never_repr_what_they_found(blob):
    """A 2**26-leaf DAG as format_version: the old message formatted its repr (30 s, 675 MiB)."""
    msg = refused_fast(extend_top(blob, s("format_version") + list_dag(26)),
                       "unsupported checkpoint format_version a list")
    for field in ("tokenizer", "weight_hash", "step"):
        msg = refused_fast(extend_top(blob, s(field) + list_dag(26)))
        assert "[[" not in msg, msg


def test_huge_memo_index_is_refused_before_the_unpickler_allocates(blob):
    """LONG_BINPUT 2**27: the C unpickler grows its memo table to the index (2.2 GB)."""
    refused_fast(extend_top(blob, s("m") + b"N" + put(1 << 27)), "memo index", f"{MAX_MEMO:,}")


def test_stride_zero_tensors_are_refused_before_any_copy(blob):
    """Two tensors of 2**27 elements over a storage of one element (3.25 GB kept)."""
    huge = tensor(1, (1 << 27,), (0,))
    refused_fast(extend_top(blob, s("a") + huge + s("b") + huge), "stride 0")


def test_overlapping_strides_cannot_multiply_the_elements(blob):
    """Stride 1 in both dimensions of a square view of the first storage: no stride 0, but a
    copy of (n/2)**2 elements of an n-element storage (34 MB from a 33 KB storage here)."""
    n = int(np.prod(next(iter(param_shapes(CFG).values()))))
    refused_fast(extend_top(blob, s("a") + tensor(n, (n // 2, n // 2), (1, 1))),
                 "more elements than the file")


def test_tuple_keys_are_refused_before_they_are_hashed(blob):
    """A tuple DAG as a dict key: hashing walks every leaf, and a dict can hash it once per
    insertion (this one is under the tuple budget: it is the key check that stops it)."""
    keys = tuple_dag(12) + b"K\x01" + b"".join(get(12) + b"K\x01" for _ in range(10000))
    refused_fast(extend_top(blob, keys), "dict key that is not a string")


def test_colliding_int_keys_are_refused(blob):
    """Ints equal modulo 2**61 - 1 hash alike: a dict of them is quadratic."""
    m = 2**61 - 1
    keys = b"".join(b"\x8a\x0a" + (k * m).to_bytes(10, "little", signed=True) + b"N"
                    for k in range(1, 20001))
    refused_fast(extend_top(blob, s("d") + b"}(" + keys + b"u"), "dict key that is not a string")


def test_ordered_dict_with_arguments_is_refused(blob):
    pairs = b"](" + b"".join(b"(" + s(f"k{i}") + b"Nt" for i in range(3)) + b"e"
    refused_fast(extend_top(blob, s("o") + b"ccollections\nOrderedDict\n(" + pairs + b"tR"),
                 "OrderedDict")


def test_too_many_opcodes_and_unknown_opcodes_are_refused(blob):
    refused_fast(extend_top(blob, s("x") + b"](" + b"N" * (1 << 20) + b"e"), "opcodes")
    refused_fast(extend_top(blob, s("x") + b"\x8f"), "opcode 0x8f")   # EMPTY_SET


def test_a_dag_of_tuples_is_refused_by_the_tuple_budget(blob):
    refused_fast(extend_top(blob, s("t") + tuple_dag(30)), "tuple of over")


def test_each_message_is_short_and_names_the_problem(blob):
    """Sanity: a refusal is a CheckpointError in-process too (no child needed once fixed)."""
    with pytest.raises(CheckpointError, match="memo index"):
        load_checkpoint(extend_top(blob, s("m") + b"N" + put(1 << 27)))
    assert os.getpid()  # the test process is untouched
