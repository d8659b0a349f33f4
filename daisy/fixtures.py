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
    exchange.dsyf  per codec c and case i (meta.cases: codec, seed, step, slot, offset, P):
                   {c}.{i}.values (n,) f64, {c}.{i}.message (bytes) i8, {c}.{i}.decoded (n,) f64;
                   per reduce case j: {c}.reduce{j}.slices (P, n) f64, {c}.reduce{j}.message i8,
                   {c}.reduce{j}.G (n,) f64; meta.malformed: [{codec, n, hex, error}] (the
                   decoder's exact message); meta.train_int8: P=4 rsag hashes of 5 steps
Regenerate after any intended change to the math; the mirrors' tests tell you when.
JS twin: frontend_js/fixtures.js.
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
from .exchange_codec import BLOCK, CodecError, codec_for

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


def exchange_values(rng, n):
    """Gradient-like values of many magnitudes, with the codec's corners: a zero block, -0,
    subnormals, a block of ties (x * 127 / s an integer + 1/2), values near the 2^64 bound."""
    x = rng.standard_normal(n) * np.exp2(rng.integers(-40, 10, n).astype(np.float64))
    if n > 3 * BLOCK:
        x[:BLOCK] = 0.0
        x[BLOCK] = -0.0
        x[BLOCK + 1:BLOCK + 9] = [5e-324, -5e-324, 1e-310, 2.0 ** -1074 * 3, 1e-45, -1e-40, 2.0 ** -149, 0.0]
        tie = 2 * BLOCK
        x[tie:tie + BLOCK] = (np.arange(BLOCK) % 255 - 127 + 0.5) / 127.0      # s = 1: y = k + 1/2
        x[tie] = 1.0
        x[3 * BLOCK] = 1.8e19                                                  # s < 2^64
    return x


def exchange_fixture(out):
    rng = np.random.default_rng(20261204)       # fixture inputs only; never in the step
    tensors, cases, reduces = [], [], []
    for name in ("f64", "int8"):
        codec = codec_for(name)
        for i, (n, seed, step, slot, offset) in enumerate([(1, 1234, 0, 0, 0), (255, 7, 3, 1, 512),
                                                           (1000, 1234, 299, 5, 0), (5000, 2**32 - 1, 9, 63, 2**20)]):
            x = exchange_values(rng, n)
            msg = codec.encode(x, seed=seed, step=step, slot=slot, offset=offset)
            tensors += [(f"{name}.{i}.values", x), (f"{name}.{i}.message", np.frombuffer(msg, dtype=np.int8)),
                        (f"{name}.{i}.decoded", codec.decode(msg, n))]
            cases.append({"codec": name, "i": i, "seed": seed, "step": step, "slot": slot, "offset": offset})
        for j, (P, n, offset) in enumerate([(1, 300, 0), (3, 1000, 256), (5, 2049, 4096)]):
            slices = np.stack([codec.decode(codec.encode(exchange_values(rng, n), seed=11, step=j, slot=s,
                                                         offset=offset), n) for s in range(P)])
            msg = codec.reduce_message(list(slices), seed=11, step=j, offset=offset)
            tensors += [(f"{name}.reduce{j}.slices", slices),
                        (f"{name}.reduce{j}.message", np.frombuffer(msg, dtype=np.int8)),
                        (f"{name}.reduce{j}.G", codec.reduce(list(slices), seed=11, step=j, offset=offset))]
            reduces.append({"codec": name, "j": j, "P": P, "seed": 11, "step": j, "offset": offset})
    malformed = []
    good = codec_for("int8").encode(exchange_values(rng, 300), seed=1, step=1, slot=0, offset=0)
    bad_scale = bytearray(good)
    bad_scale[260 + 3] |= 0x80                             # block 1's scale negative
    inf_scale = bytearray(good)
    inf_scale[0:4] = np.array([np.inf], dtype="<f4").tobytes()
    big_scale = bytearray(good)
    big_scale[0:4] = np.array([2.0 ** 64], dtype="<f4").tobytes()
    code_128 = bytearray(good)
    code_128[4 + 17] = 0x80
    zero_scale = bytearray(good)
    zero_scale[0:4] = bytes(4)
    for codec, n, msg in [("int8", 300, good[:-1]), ("int8", 301, good), ("int8", 300, bytes(bad_scale)),
                          ("int8", 300, bytes(inf_scale)), ("int8", 300, bytes(big_scale)),
                          ("int8", 300, bytes(code_128)), ("int8", 300, bytes(zero_scale)),
                          ("f64", 3, bytes(23))]:
        try:
            codec_for(codec).decode(msg, n)
            raise AssertionError("a malformed case decoded")
        except CodecError as e:
            malformed.append({"codec": codec, "n": n, "hex": msg.hex(), "error": str(e)})
    cfg = Config(width=16, heads=4, seq_len=16, batch=2, layers=1, steps=100, exchange="int8")
    group = Group(cfg, 4, data.builtin_stream())
    train = [group.step()[2][0] for _ in range(5)]
    write_fixture(out / "exchange.dsyf", "exchange", tensors,
                  {"cases": cases, "reduces": reduces, "malformed": malformed, "block": BLOCK,
                   "train_int8": {"config": cfg.to_dict(), "peers": 4, "hashes": train}})


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
    exchange_fixture(out)
    print(f"wrote units, forward, backward, train20, exchange fixtures (version {VERSION}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
