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

This module is the public entry (importers use only it); the work is split by job:
    checkpoint_checks.py   CheckpointError, budgets, the Checkpoint value, config/shape/tensor checks
    pt_write.py            the pickle protocol 2 emitter and the aligned zip writer
    pt_read.py             size-limited reading, zip under limits, pickle scan, restricted unpickler
    safetensors_file.py    model.safetensors save/load
"""
from __future__ import annotations

import numpy as np

from daisy.files.checkpoint_checks import (DEFAULT_MAX_BYTES, FORMAT, FORMAT_VERSION,  # noqa: F401
                                           MAX_DEPTH, MAX_MEMO, MAX_NDIM, MAX_PICKLE_BYTES,
                                           MAX_PICKLE_OPS, MAX_VISITS, Checkpoint,
                                           CheckpointError, check_plain, checked_tensors,
                                           checkpoint_from_top, param_shapes, validated_config)
from daisy.files.pt_read import read_limited, unpickle_zip
from daisy.files.pt_write import PtTensor, write_pt
from daisy.files.safetensors_file import load_safetensors, save_safetensors  # noqa: F401
from daisy.hashing import weight_hash
from daisy.tokenizer import TOKENIZER_ID

__all__ = ["Checkpoint", "CheckpointError", "DEFAULT_MAX_BYTES", "FORMAT", "FORMAT_VERSION",
           "MAX_DEPTH", "MAX_MEMO", "MAX_NDIM", "MAX_PICKLE_BYTES", "MAX_PICKLE_OPS", "MAX_VISITS",
           "load_checkpoint", "load_safetensors", "param_shapes", "save_checkpoint",
           "save_safetensors"]


def save_checkpoint(path_or_file, *, config, params, step, adam_m, adam_v, adam_t=None,
                    extra=None):
    """Write a .pt checkpoint that torch.load(weights_only=True) opens.

    path_or_file: a path (written atomically: temp file, then rename), a binary file object,
    or None to get the file's bytes back. adam_t defaults to step (Adam's counter)."""
    cfg = validated_config(config)
    shapes = param_shapes(cfg)
    model = checked_tensors("model", params, shapes)
    m = checked_tensors("optim.m", adam_m, shapes)
    v = checked_tensors("optim.v", adam_v, shapes)
    adam_t = step if adam_t is None else adam_t
    for label, n in (("step", step), ("adam_t", adam_t)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise CheckpointError(f"{label} must be a non-negative integer, got {n!r}")
    if extra is not None:
        if not isinstance(extra, dict):
            raise CheckpointError(f"extra must be a dict, got {type(extra).__name__}")
        check_plain(extra)

    storages = []                                   # key order = order of first use in the pickle

    def tensors(arrays):
        out = {}
        for name, a in arrays.items():
            out[name] = PtTensor(a, str(len(storages)))
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
    return write_pt(path_or_file, top, storages)


def load_checkpoint(path_or_bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Checkpoint:
    """Read and validate a .pt checkpoint (ours, or torch.save of the same dict). Pure: it never
    executes code from the file and changes nothing; any problem raises CheckpointError.
    path_or_bytes: a path, bytes-like, or a binary file object."""
    try:
        return checkpoint_from_top(unpickle_zip(read_limited(path_or_bytes, max_bytes)))
    except RecursionError:                          # absurdly nested plain values in the pickle
        raise CheckpointError("corrupt checkpoint: values are nested too deeply") from None
