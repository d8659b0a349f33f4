"""Checkpoint I/O: .pt files written without torch, read by real torch.load; the restricted loader
refuses bad files with a message naming the problem; model.safetensors interop."""
import io
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from torch import nn

from daisy.files.checkpoint import (CheckpointError, load_checkpoint, load_safetensors, param_shapes,
                              save_checkpoint, save_safetensors)
from daisy.config import Config
from daisy.hashing import weight_hash
from daisy.tokenizer import VOCAB_SIZE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = dict(width=16, seq_len=16, batch=2, steps=100, lr_x1000=10, layers=2, heads=4, seed=7)


def make_state(cfg=CFG, seed=0):
    rng = np.random.default_rng(seed)
    shapes = param_shapes(cfg)
    params = {n: rng.standard_normal(s) for n, s in shapes.items()}
    m = {n: rng.standard_normal(s) * 1e-3 for n, s in shapes.items()}
    v = {n: rng.random(s) * 1e-6 for n, s in shapes.items()}
    # values whose bits are easy to lose: subnormals, -0.0, extremes
    params["wte.weight"][0, :4] = [5e-324, -0.0, np.finfo(np.float64).max, -np.finfo(np.float64).tiny]
    return params, m, v


def assert_bits_equal(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype == np.float64, f"{what}: dtypes {a.dtype} vs {b.dtype}"
    assert a.shape == b.shape, f"{what}: shapes {a.shape} vs {b.shape}"
    ua, ub = a.view(np.uint64).ravel(), b.view(np.uint64).ravel()
    bad = np.flatnonzero(ua != ub)
    assert bad.size == 0, (f"{what}: first mismatch at flat index {bad[0]}: "
                           f"{a.ravel()[bad[0]]!r} vs {b.ravel()[bad[0]]!r}")


def assert_groups_equal(got, want, what):
    assert list(got) == list(want), f"{what}: names differ"
    for n in want:
        assert_bits_equal(got[n], want[n], f"{what}[{n}]")


@pytest.fixture(scope="module")
def state():
    return make_state()


@pytest.fixture(scope="module")
def blob(state):
    params, m, v = state
    return save_checkpoint(None, config=CFG, params=params, step=42, adam_m=m, adam_v=v,
                           extra={"note": "run A", "losses": [5.5, 4.25]})


def torch_tree(obj):
    """Our loaded torch dict -> same structure with numpy arrays turned into torch tensors."""
    if isinstance(obj, dict):
        return {k: torch_tree(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    return obj


def zip_entries(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def make_zip(entries: dict) -> bytes:
    """A fresh, valid zip (fresh CRCs) of the given entries: a tampered file that passes CRC."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def torch_saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def refused(data, match, **kw):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(data, **kw)
    msg = str(e.value)
    for part in ([match] if isinstance(match, str) else match):
        assert part in msg, f"{part!r} not in the message: {msg}"
    return msg


# --- round trip --------------------------------------------------------------------------------

def test_round_trip_bit_exact_bytes_path_and_file(state, blob, tmp_path):
    params, m, v = state
    path = tmp_path / "run.pt"
    assert save_checkpoint(path, config=Config(**CFG), params=params, step=42, adam_m=m,
                           adam_v=v, extra={"note": "run A", "losses": [5.5, 4.25]}) is None
    assert path.read_bytes() == blob, "a Config and a dict of the same settings give other bytes"
    stream = io.BytesIO()
    save_checkpoint(stream, config=CFG, params=params, step=42, adam_m=m, adam_v=v,
                    extra={"note": "run A", "losses": [5.5, 4.25]})
    assert stream.getvalue() == blob
    for source in (blob, path, str(path), io.BytesIO(blob)):
        ck = load_checkpoint(source)
        assert ck.config == Config(**CFG).to_dict()
        assert (ck.step, ck.adam_t) == (42, 42)
        assert ck.adam == {"t": 42, "m": ck.adam_m, "v": ck.adam_v}
        assert ck.weight_hash == weight_hash(params)
        assert ck.extra == {"note": "run A", "losses": [5.5, 4.25]}
        assert_groups_equal(ck.params, params, "params")
        assert_groups_equal(ck.adam_m, m, "adam_m")
        assert_groups_equal(ck.adam_v, v, "adam_v")
    ck.params["wte.weight"][0, 0] = 1.0    # loaded arrays are the caller's to update in place


def test_same_state_gives_same_bytes_and_adam_t_is_kept(state):
    params, m, v = state
    a = save_checkpoint(None, config=CFG, params=params, step=9, adam_m=m, adam_v=v, adam_t=3)
    b = save_checkpoint(None, config=CFG, params=params, step=9, adam_m=m, adam_v=v, adam_t=3)
    assert a == b
    ck = load_checkpoint(a)
    assert (ck.step, ck.adam_t) == (9, 3)


def test_zip_layout_is_torch_layout(blob):
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        assert names[0] == "archive/data.pkl"
        for need in ("archive/byteorder", "archive/version", "archive/data/0"):
            assert need in names
        assert zf.read("archive/byteorder") == b"little"
        assert zf.read("archive/version") == b"3\n"
        assert zf.read("archive/data.pkl")[:2] == b"\x80\x02", "not pickle protocol 2"
        for i in infos:
            assert i.compress_type == zipfile.ZIP_STORED
            if i.filename.startswith("archive/data/"):
                start = i.header_offset + 30 + len(i.filename) + len(i.extra)
                assert start % 64 == 0, f"{i.filename} starts at {start}, not 64-byte aligned"


# --- torch interop -----------------------------------------------------------------------------

def test_torch_load_weights_only_reads_every_tensor_exactly(state, blob, tmp_path):
    params, m, v = state
    path = tmp_path / "run.pt"
    path.write_bytes(blob)
    for kw in ({}, {"mmap": True}):
        d = torch.load(path, weights_only=True, **kw)
        assert d["format"] == "daisychain" and d["format_version"] == 1
        assert d["tokenizer"] == "daisy-bytes-v1"
        assert d["config"] == Config(**CFG).to_dict()
        assert d["step"] == 42 and d["optim"]["t"] == 42
        assert d["weight_hash"] == weight_hash(params)
        assert d["extra"] == {"note": "run A", "losses": [5.5, 4.25]}
        for group, want in (("model", params), ("m", m), ("v", v)):
            got = d["model"] if group == "model" else d["optim"][group]
            assert list(got) == list(want)
            for n, t in got.items():
                assert t.dtype == torch.float64
                assert_bits_equal(t.numpy(), want[n], f"torch.load {group}[{n}]")


class Attention(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C, bias=False)
        self.proj = nn.Linear(C, C, bias=False)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.fc = nn.Linear(C, 4 * C, bias=False)
        self.proj = nn.Linear(4 * C, C, bias=False)


class Block(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.norm1, self.attn = nn.RMSNorm(C, eps=1e-5), Attention(C)
        self.norm2, self.mlp = nn.RMSNorm(C, eps=1e-5), MLP(C)


class DaisyGPT(nn.Module):
    """The module tree whose state_dict names match a DaisyChain checkpoint."""

    def __init__(self, width, seq_len, layers, vocab=VOCAB_SIZE, **_):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.norm_f = nn.RMSNorm(width, eps=1e-5)
        self.head = nn.Linear(width, vocab, bias=False)


def test_torch_module_loads_the_state_dict_strictly(state, blob, tmp_path):
    params, _, _ = state
    path = tmp_path / "run.pt"
    path.write_bytes(blob)
    ckpt = torch.load(path, weights_only=True)
    model = DaisyGPT(**ckpt["config"]).double()
    result = model.load_state_dict(ckpt["model"], strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for n, t in model.state_dict().items():
        assert_bits_equal(t.numpy(), params[n], f"module {n}")


def test_torch_save_of_the_same_dict_loads(state, blob):
    params, m, v = state
    d = torch.load(io.BytesIO(blob), weights_only=True)
    d["model"] = dict(d["model"])
    ck = load_checkpoint(torch_saved(d))
    assert ck.step == 42 and ck.weight_hash == weight_hash(params)
    assert_groups_equal(ck.params, params, "params")
    assert_groups_equal(ck.adam_v, v, "adam_v")
    # a module's own state_dict (an OrderedDict with _metadata) saved by torch also loads
    model = DaisyGPT(**CFG).double()
    model.load_state_dict(d["model"])
    d["model"] = model.state_dict()
    assert_groups_equal(load_checkpoint(torch_saved(d)).params, params, "module state_dict")


def test_unrelated_pytorch_checkpoints_are_not_daisychain():
    msg = refused(torch_saved(nn.Linear(3, 4).state_dict()), "not a DaisyChain checkpoint")
    assert "weight, bias" in msg
    refused(torch_saved({"epoch": 3, "state_dict": {}}), ["not a DaisyChain checkpoint", "epoch"])
    # a whole pickled module names its class: refused before anything is built
    refused(torch_saved(nn.Linear(3, 4)), ["refused", "torch.nn.modules.linear.Linear"])


# --- bad files ---------------------------------------------------------------------------------

def test_truncated_files_are_refused(blob):
    for n in (0, 10, len(blob) // 2, len(blob) - 1):
        refused(blob[:n], "not a PyTorch zip checkpoint (truncated or corrupt file?)")
    refused(b"\x80\x02}q\x00.", "not a PyTorch zip checkpoint")   # a legacy (non-zip) pickle


def test_corrupt_bytes_are_refused_by_crc(blob):
    entries = zip_entries(blob)
    for name in ("data.pkl", "data/3"):
        data = bytearray(blob)
        inner = entries[f"archive/{name}"]
        at = blob.index(inner) + len(inner) // 2        # the entry's bytes inside the file
        data[at] ^= 0xFF
        refused(bytes(data), f"entry {name} fails its CRC-32 check")


def test_altered_tensor_data_is_caught_by_the_weight_hash(state, blob):
    entries = zip_entries(blob)
    one = bytearray(entries["archive/data/5"])
    one[3] ^= 0x01                                       # one bit of one weight
    entries["archive/data/5"] = bytes(one)
    msg = refused(make_zip(entries), ["weight hash mismatch", weight_hash(state[0])])
    assert "corrupt or was altered" in msg


def test_garbage_pickle_with_a_valid_crc_is_refused(blob):
    entries = zip_entries(blob)
    entries["archive/data.pkl"] = entries["archive/data.pkl"][: len(entries["archive/data.pkl"]) // 2]
    refused(make_zip(entries), "data.pkl is not a valid pickle")
    entries["archive/data.pkl"] = b"\x80\x02hello"
    refused(make_zip(entries), "data.pkl is not a valid pickle")
    del entries["archive/data.pkl"]
    refused(make_zip(entries), "no data.pkl in the archive")


def test_missing_storage_entry_is_refused(blob):
    entries = zip_entries(blob)
    del entries["archive/data/7"]
    refused(make_zip(entries), "the archive has no entry data/7")


def edited(blob, edit) -> bytes:
    """Our file, opened by torch, changed by `edit(dict)`, saved again by torch."""
    d = torch.load(io.BytesIO(blob), weights_only=True)
    edit(d)
    return torch_saved(d)


def test_wrong_tokenizer_and_format_are_refused(blob):
    refused(edited(blob, lambda d: d.update(tokenizer="gpt2-bpe")),
            "tokenizer mismatch: expected 'daisy-bytes-v1', found 'gpt2-bpe'")
    refused(edited(blob, lambda d: d.update(format_version=2)),
            "unsupported checkpoint format_version 2 (this reader knows 1)")
    refused(edited(blob, lambda d: d.pop("optim")), "checkpoint is missing 'optim'")


def test_wrong_dimensions_are_refused(blob):
    def widen(d):
        d["config"]["width"] = 32
    refused(edited(blob, widen),
            "tensor model['wte.weight'] has shape (257, 16), expected (257, 32)")

    def bad_qkv(d):
        d["model"]["blocks.1.attn.qkv.weight"] = torch.zeros(48, 17, dtype=torch.float64)
    refused(edited(blob, bad_qkv),
            "tensor model['blocks.1.attn.qkv.weight'] has shape (48, 17), expected (48, 16)")

    def float32(d):
        d["optim"]["m"]["head.weight"] = d["optim"]["m"]["head.weight"].float()
    refused(edited(blob, float32), "tensor optim.m['head.weight'] has dtype float32, expected float64")

    def drop(d):
        del d["model"]["blocks.1.mlp.fc.weight"]
    refused(edited(blob, drop), "model is missing tensor(s): blocks.1.mlp.fc.weight")

    def add(d):
        d["optim"]["v"]["lm_head.bias"] = torch.zeros(3, dtype=torch.float64)
    refused(edited(blob, add), "optim.v has unexpected tensor(s): lm_head.bias")

    def fewer_layers(d):
        d["config"]["layers"] = 1
    refused(edited(blob, fewer_layers), "model has unexpected tensor(s): blocks.1.norm1.weight")


def test_bad_config_is_refused(blob):
    refused(edited(blob, lambda d: d["config"].update(width=200)),
            "bad config: model width (width) must be in 16..128, got 200")
    refused(edited(blob, lambda d: d["config"].update(heads=3)),
            "model width (16) must be a multiple of heads (3)")
    refused(edited(blob, lambda d: d["config"].update(dropout=1)), "unknown setting(s): dropout")
    refused(edited(blob, lambda d: d["config"].pop("seed")), "config is missing setting(s): seed")


def test_files_over_the_size_limit_are_refused(blob, tmp_path):
    path = tmp_path / "big.pt"
    path.write_bytes(blob)
    limit = len(blob) - 1
    for source in (blob, path, io.BytesIO(blob)):
        refused(source, f"over the size limit of {limit:,} bytes", max_bytes=limit)
    refused(path, f"file is too large: {len(blob):,} bytes", max_bytes=limit)
    assert load_checkpoint(path, max_bytes=len(blob)).step == 42


def test_pickle_that_would_run_code_is_refused_and_never_runs(blob, tmp_path):
    class RunsCode:
        def __init__(self, marker):
            self.marker = marker

        def __reduce__(self):
            return (os.system, (f"touch {self.marker}",))

    # positive control: the payload is live, plain pickle would run it
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(RunsCode(control), protocol=2))
    assert control.exists(), "the test payload does not run code: the test proves nothing"

    marker = tmp_path / "pwned"
    entries = zip_entries(blob)
    for protocol in (2, 4):                      # GLOBAL and STACK_GLOBAL opcodes
        entries["archive/data.pkl"] = pickle.dumps({"format": "daisychain", "x": RunsCode(marker)},
                                                   protocol=protocol)
        refused(make_zip(entries), ["refused", f"{os.system.__module__}.system"])
    builtins_eval = pickle.dumps(
        type("E", (), {"__reduce__": lambda self: (eval, (f"open({str(marker)!r}, 'w')",))})(),
        protocol=2)
    entries["archive/data.pkl"] = builtins_eval
    refused(make_zip(entries), ["refused", "__builtin__.eval"])   # protocol 2 spells builtins so
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps(RunsCode(marker), protocol=2))
    refused(tmp_path / "legacy.pt", "not a PyTorch zip checkpoint")
    assert not marker.exists(), "the loader ran code from the file"


def test_save_refuses_state_that_does_not_match_the_config(state):
    params, m, v = state
    bad = dict(params, **{"head.weight": np.zeros((VOCAB_SIZE, 17))})
    with pytest.raises(CheckpointError, match=r"model\['head.weight'\] has shape \(257, 17\), expected \(257, 16\)"):
        save_checkpoint(None, config=CFG, params=bad, step=1, adam_m=m, adam_v=v)
    with pytest.raises(CheckpointError, match=r"optim.v is missing tensor\(s\): norm_f.weight"):
        save_checkpoint(None, config=CFG, params=params, step=1, adam_m=m,
                        adam_v={k: a for k, a in v.items() if k != "norm_f.weight"})
    with pytest.raises(CheckpointError, match="has dtype float32, expected float64"):
        save_checkpoint(None, config=CFG, params=dict(params, **{"wpe.weight": params["wpe.weight"].astype(np.float32)}),
                        step=1, adam_m=m, adam_v=v)
    with pytest.raises(CheckpointError, match="only plain values are allowed"):
        save_checkpoint(None, config=CFG, params=params, step=1, adam_m=m, adam_v=v,
                        extra={"arr": np.zeros(2)})


def test_the_module_does_not_import_torch(tmp_path):
    code = ("import sys, numpy as np\n"
            "from daisy.files.checkpoint import save_checkpoint, load_checkpoint, param_shapes\n"
            "cfg = dict(width=16, seq_len=16, layers=1)\n"
            "z = {n: np.zeros(s) for n, s in param_shapes(cfg).items()}\n"
            "ck = load_checkpoint(save_checkpoint(None, config=cfg, params=z, step=0, adam_m=z, adam_v=z))\n"
            "assert ck.config['layers'] == 1\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr


# --- safetensors -------------------------------------------------------------------------------

def test_safetensors_round_trip_and_interop(state, tmp_path):
    params, _, _ = state
    meta = {"format": "daisychain", "tokenizer": "daisy-bytes-v1", "step": "42"}
    path = tmp_path / "model.safetensors"
    save_safetensors(path, params, meta)
    got, got_meta = load_safetensors(path)
    assert got_meta == meta
    assert_groups_equal(got, params, "ours->ours")
    theirs = safetensors.numpy.load_file(str(path))             # the reference implementation
    assert sorted(theirs) == sorted(params)
    for n in params:
        assert_bits_equal(theirs[n], params[n], f"ours->safetensors {n}")
    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == meta
    as_torch = safetensors.torch.load_file(str(path))
    assert_bits_equal(as_torch["head.weight"].numpy(), params["head.weight"], "ours->torch")
    # and their writer's file through our reader
    theirs_path = tmp_path / "theirs.safetensors"
    safetensors.numpy.save_file(params, str(theirs_path), metadata=meta)
    got2, meta2 = load_safetensors(theirs_path)
    assert meta2 == meta
    assert sorted(got2) == sorted(params)
    for n in params:
        assert_bits_equal(got2[n], params[n], f"safetensors->ours {n}")
    assert save_safetensors(None, params, meta) == path.read_bytes()


def test_bad_safetensors_are_refused(state):
    params, _, _ = state
    data = save_safetensors(None, {"a": params["norm_f.weight"]}, {"k": "v"})

    def bad(blob, text, **kw):
        with pytest.raises(CheckpointError) as e:
            load_safetensors(blob, **kw)
        assert text in str(e.value), str(e.value)

    bad(data[:5], "shorter than its 8-byte header length")
    bad(data[:40], "exceeds the file's")
    bad(data[:-8], "malformed shape or data_offsets")
    bad(data + b"\0" * 8, "8 trailing bytes after the tensor data")
    bad(data, "over the size limit of 10 bytes", max_bytes=10)
    f32 = safetensors.numpy.save({"a": np.zeros(3, np.float32)})
    bad(f32, "tensor 'a' has dtype 'F32', expected 'F64'")
    with pytest.raises(CheckpointError, match="metadata must map str to str"):
        save_safetensors(None, params, {"step": 42})
