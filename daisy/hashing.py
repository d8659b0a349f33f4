"""The canonical weight hash: SHA-256 over every parameter, in param_shapes order, as the
little-endian bytes of its float64 values in row-major order. Shown as hex; the UI shows the
first 16 hex digits.
JS twin: frontend_js/hashing.js."""
import hashlib

import numpy as np


def weight_hash(params) -> str:
    h = hashlib.sha256()
    for w in params.values():
        h.update(np.ascontiguousarray(w, dtype="<f8").tobytes())
    return h.hexdigest()
