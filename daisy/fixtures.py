"""Golden fixtures for the mirrors (JS CPU, WGSL): `python -m daisy.fixtures OUT_DIR`.

File format (version 1), little-endian throughout:
    bytes 0..3    magic b"DSYF"
    bytes 4..7    u32 format version (1)
    bytes 8..11   u32 header length H
    bytes 12..    H bytes of UTF-8 JSON header, then zero padding to a multiple of 8
    data          the tensors, each starting at a multiple of 8 from the start of data
Header: {"kind": str, "meta": {...}, "config": {...} | null,
         "tensors": [{"name", "dtype": "f64"|"i32"|"i8"|"u16", "shape": [...], "offset", "nbytes"}]}
Tensors are row-major, in the order listed. Float64 scalars in meta are also given as the hex
of their IEEE bits ("loss_bits") so readers can compare exactly.

Files written (tensor order inside each):
    units.dsyf     per case i: case{i}.a (M,K) f64, case{i}.b (K,N) f64, case{i}.qa i8, case{i}.sa (M,),
                   case{i}.qb i8, case{i}.sb (N,), case{i}.acc (M,N) i32, case{i}.out (M,N) f64
    forward.dsyf   param.<name> for every param (canonical order), x (B,T) i32, y (B,T) i32,
                   logits (B*T,V) f64; meta.loss, meta.loss_bits
    backward.dsyf  the same params, x, y, then grad.<name> for every param
    train20.dsyf   stream (n,) u16 (the token stream), loss (20,) f64; meta.hashes (20 lists of
                   P hex hashes), meta.peers; config is the run's config
Regenerate after any intended change to the math; the mirrors' tests tell you when.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

from . import data
from .config import Config
from .model import forward, init_params, loss_and_grads
from .train import Group
from .units import epilogue, gemm_i8, quantize_cols, quantize_rows

MAGIC = b"DSYF"
VERSION = 1
DTYPES = {"f64": "<f8", "i32": "<i4", "i8": "i1", "u16": "<u2"}
DTYPE_NAMES = {(np.dtype(v).kind, np.dtype(v).itemsize): k for k, v in DTYPES.items()}


def write_fixture(path, kind, tensors, meta=None, config=None):
    """tensors: list of (name, ndarray) in file order."""
    entries, blobs, offset = [], [], 0
    for name, arr in tensors:
        dt = DTYPE_NAMES[(arr.dtype.kind, arr.dtype.itemsize)]
        b = np.ascontiguousarray(arr, dtype=DTYPES[dt]).tobytes()
        entries.append({"name": name, "dtype": dt, "shape": list(arr.shape), "offset": offset, "nbytes": len(b)})
        pad = (-len(b)) % 8
        blobs.append(b + b"\0" * pad)
        offset += len(b) + pad
    header = json.dumps({"kind": kind, "meta": meta or {}, "config": config, "tensors": entries},
                        sort_keys=True).encode()
    head = MAGIC + struct.pack("<II", VERSION, len(header)) + header
    head += b"\0" * ((-len(head)) % 8)
    Path(path).write_bytes(head + b"".join(blobs))


def read_fixture(path):
    """-> (header dict, {name: ndarray}); checks magic and version."""
    raw = Path(path).read_bytes()
    if raw[:4] != MAGIC:
        raise ValueError(f"{path}: not a DaisyChain fixture (magic {raw[:4]!r})")
    version, hlen = struct.unpack("<II", raw[4:12])
    if version != VERSION:
        raise ValueError(f"{path}: fixture version {version}, this code reads {VERSION}; regenerate")
    header = json.loads(raw[12:12 + hlen])
    start = 12 + hlen + ((-(12 + hlen)) % 8)
    out = {}
    for t in header["tensors"]:
        o = start + t["offset"]
        out[t["name"]] = np.frombuffer(raw[o:o + t["nbytes"]], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return header, out


def f64_bits(x: float) -> str:
    return struct.pack("<d", x)[::-1].hex()


def unit_cases():
    """Quantizer + GEMM cases: ragged shapes and adversarial values."""
    rng = np.random.default_rng(20261202)        # fixture inputs only; never in the step
    cases = []
    for (M, K, N) in [(1, 1, 1), (3, 5, 7), (17, 33, 9), (64, 64, 64), (5, 130, 3), (31, 16, 257)]:
        cases.append((rng.standard_normal((M, K)), rng.standard_normal((K, N))))
    # adversarial: all-zero rows/cols, a row below the scale floor, exact ties x/s = n + 1/2,
    # huge and tiny magnitudes, +-extremes that hit +-127, a subnormal, negative zero.
    a = np.array([[0.0, 0.0, 0.0, 0.0],
                  [1e-30, -2e-30, 3e-19, 1e-300],
                  [127.0, 0.5, 1.5, -2.5],                 # s = 1: ties 0.5, 1.5, -2.5
                  [-1e300, 1e300, 5e299, -0.0],
                  [5e-324, 1.0, -1.0, 0.25]])
    b = np.array([[1.0, -127.0, 0.0], [3.5, 2.0, 0.0], [-1e-5, 7.0, 0.0], [2.0 ** -70, 1.0, 0.0]])
    cases.append((a, b))
    big = np.tile(np.array([[127.0, -127.0]]), (4, 2048))  # K = 4096: accumulators near the bound
    cases.append((big, np.tile(np.array([[127.0], [-127.0]]), (2048, 3))))
    return cases


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m daisy.fixtures OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)

    tensors = []
    for i, (a, b) in enumerate(unit_cases()):
        qa, sa = quantize_rows(a)
        qb, sb = quantize_cols(b)
        acc = gemm_i8(qa, qb)
        tensors += [(f"case{i}.a", a), (f"case{i}.b", b), (f"case{i}.qa", qa), (f"case{i}.sa", sa),
                    (f"case{i}.qb", qb), (f"case{i}.sb", sb), (f"case{i}.acc", acc),
                    (f"case{i}.out", epilogue(acc, sa, sb))]
    write_fixture(out / "units.dsyf", "units", tensors, meta={"cases": len(unit_cases())})

    cfg = Config()
    stream = data.builtin_stream()
    params = init_params(cfg)
    x, y = data.get_batch(stream, cfg.seed, 0, 0, cfg.batch, cfg.seq_len)
    ptensors = [(f"param.{k}", v) for k, v in params.items()]
    xy = [("x", x.astype(np.int32)), ("y", y.astype(np.int32))]
    logits = forward(params, cfg, x)
    loss, grads = loss_and_grads(params, cfg, x, y)
    meta = {"loss": loss, "loss_bits": f64_bits(loss)}
    write_fixture(out / "forward.dsyf", "forward", ptensors + xy + [("logits", logits)], meta, cfg.to_dict())
    write_fixture(out / "backward.dsyf", "backward",
                  ptensors + xy + [(f"grad.{k}", v) for k, v in grads.items()], meta, cfg.to_dict())

    peers, steps = 2, 20
    group = Group(cfg, peers, stream)
    losses, hashes = [], []
    for _ in range(steps):
        _, l, h = group.step()
        losses.append(l)
        hashes.append(h)
    write_fixture(out / "train20.dsyf", "train", [("stream", stream), ("loss", np.array(losses))],
                  {"peers": peers, "steps": steps, "hashes": hashes,
                   "loss_bits": [f64_bits(l) for l in losses]}, cfg.to_dict())
    print(f"wrote units, forward, backward, train20 fixtures (version {VERSION}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
