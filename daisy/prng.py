"""Counter-based PRNG: a pure function of (key, counter), 32-bit integer ops only.

JS mirrors it with Math.imul and >>> (frontend_js/prng.js); numpy with wrapping uint32 arrays.
Spec (docs/VERIFICATION.md §PRNG):
    mix32(x)          = lowbias32: x ^= x>>16; x *= 0x7feb352d; x ^= x>>15; x *= 0x846ca68b; x ^= x>>16
    key(w0, w1, ...)  = h = 0; for w: h = mix32(h ^ mix32(w + 0x9e3779b9)); return h
    draw(key, i)      = mix32(mix32(i ^ key) + 0x632be5ab)            (all mod 2^32)
    uniform(key, i)   = (draw(key, i) >> 8) * 2^-24                   in [0, 1), exact in float64
"""
import numpy as np

M32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9

# Purposes: the first word of every key, so the streams of init, data and sampling never meet.
PURPOSE_INIT = 1
PURPOSE_DATA = 2
PURPOSE_SAMPLE = 3
PURPOSE_EXCHANGE = 4            # a slot's int8 exchange message (daisy.exchange_codec)
PURPOSE_EXCHANGE_REDUCED = 5    # the re-quantized reduced gradient G


def mix32(x):
    """lowbias32 (C. Wellons): a bijection on uint32 with good avalanche. Scalar int or uint32 array."""
    if isinstance(x, np.ndarray):
        x = x.astype(np.uint32, copy=True)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)                  # wraps mod 2^32
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
        return x
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def key(*words: int) -> int:
    """Fold a sequence of uint32 words (purpose, seed, step, ...) into one stream key."""
    h = 0
    for w in words:
        h = mix32(h ^ mix32((w + GOLDEN) & M32))
    return h


def draw(k: int, i):
    """The i-th uint32 of stream k; i is an int or a uint32 array."""
    if isinstance(i, np.ndarray):
        x = mix32(i.astype(np.uint32) ^ np.uint32(k))
        return mix32(x + np.uint32(0x632BE5AB))
    return mix32((mix32((i ^ k) & M32) + 0x632BE5AB) & M32)


def uniform(k: int, i):
    """Uniform in [0, 1) with 24 bits: (draw >> 8) * 2^-24, exact in float64."""
    d = draw(k, i)
    if isinstance(d, np.ndarray):
        return (d >> np.uint32(8)).astype(np.float64) * (2.0 ** -24)
    return (d >> 8) * (2.0 ** -24)
