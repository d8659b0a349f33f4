"""The exchange codec: how a slot's gradient contribution and the reduced gradient G travel
(docs/VERIFICATION.md §12, docs/PROTOCOL.md "GRAD and REDUCED payloads").
frontend_js/exchange_codec.js is the JS twin (codecFor, encode, decode, shardBounds, reduce,
reduceMessage).

    codec = codec_for(cfg.exchange)                      # "f64" | "int8"
    msg   = codec.encode(values, seed=, step=, slot=, offset=)   # a slot's message (bytes)
    vals  = codec.decode(msg, n)                         # (n,) float64; CodecError if malformed
    b     = codec.shard_bounds(N, P)                     # the reduce-scatter's P + 1 cut points
    G     = codec.reduce(decoded slices in slot order, seed=, step=, offset=)
          = codec.decode(codec.reduce_message(...), n)   # the REDUCED payload decoded

A slot's message is a pure function of (its gradient, run seed, step, slot, offset): no private
per-peer state, so any peer can recompute it (gradient audits) and churn needs nothing hidden.
`offset` is the index in the flat gradient (daisy.collective.flatten_grads) of values[0]; the
rsag shards start on block boundaries, so a shard's message is a byte slice of the whole
gradient's message and G is the same in both topologies.

f64: the values' little-endian float64 bytes (today's bytes); reduce = the slot-ordered mean
    (daisy.reduce).
int8: blocks of BLOCK values at fixed positions of the flat gradient; per block a float32 scale
    s = max|x| rounded up to float32, codes q = stochastic round((x * 127) / s) in [-127, 127]
    (unbiased: up with probability frac, the PRNG keyed on (run seed, step, slot), counter = the
    value's index), decoded as (q * s) / 127. reduce = the slot-ordered mean of the decoded
    slices, then re-quantized with a stream of its own (purpose PURPOSE_EXCHANGE_REDUCED), so
    the owner of a shard (rsag) and every peer (all-gather) hold the same G.
Every float op is an IEEE basic op (* / floor compare) on float64, or float32 rounding.
"""
import numpy as np

from . import prng

BLOCK = 256                     # values per int8 block (the last block of a slice may be shorter)
SCALE_BYTES = 4                 # float32 little-endian, before the block's codes
MAX_SCALE = 2.0 ** 64           # a scale at or above it is refused (an honest run diverged long before)
PURPOSE_EXCHANGE = prng.PURPOSE_EXCHANGE
PURPOSE_EXCHANGE_REDUCED = prng.PURPOSE_EXCHANGE_REDUCED


class CodecError(ValueError):
    """A message (or a gradient to encode) is refused; the message says why."""


def _finite_or_refuse(x: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(~np.isfinite(x))
    if len(bad):
        i = int(bad[0])
        raise CodecError(f"{what} value {float(x[i])!r} at index {i} is not finite")


def _check_slot_key(seed: int, step: int, slot: int) -> None:
    for name, v in (("seed", seed), ("step", step), ("slot", slot)):
        if not 0 <= v <= 0xFFFFFFFF:
            raise ValueError(f"{name} {v} is not a uint32")


# -- f64: today's bytes -------------------------------------------------------------------------
def even_bounds(N: int, P: int) -> list:
    """The P + 1 cut points of N values into P shards: [floor(k*N/P) for k = 0..P]."""
    if P < 1 or N < 0:
        raise ValueError(f"need P >= 1 and N >= 0, got P={P}, N={N}")
    return [(k * N) // P for k in range(P + 1)]


def slot_mean(slices: list) -> np.ndarray:
    """The reduce rule of daisy.reduce on slices in slot order: acc = g_0; acc = acc + g_s for
    s = 1..P-1 (ascending); acc / P."""
    if not slices:
        raise ValueError("no slices to reduce")
    acc = np.asarray(slices[0], dtype=np.float64)
    for g in slices[1:]:
        acc = acc + g
    return acc / float(len(slices))


class F64Codec:
    """Any float64 travels as it is (non-finite values too: the step's loss check stops a run
    that diverged, as before the codec existed)."""
    name = "f64"

    def message_bytes(self, n: int) -> int:
        return 8 * n

    def encode(self, values, *, seed: int, step: int, slot: int, offset: int) -> bytes:
        return np.asarray(values, dtype=np.float64).reshape(-1).astype("<f8").tobytes()

    def decode(self, message, n: int) -> np.ndarray:
        message = bytes(message)
        if len(message) != 8 * n:
            raise CodecError(f"f64 message of {len(message)} bytes, expected {8 * n} for {n} values")
        return np.frombuffer(message, dtype="<f8").astype(np.float64)

    def shard_bounds(self, N: int, P: int) -> list:
        return even_bounds(N, P)

    def reduce_message(self, slices: list, *, seed: int, step: int, offset: int) -> bytes:
        return self.encode(slot_mean(slices), seed=seed, step=step, slot=0, offset=offset)

    def reduce(self, slices: list, *, seed: int, step: int, offset: int) -> np.ndarray:
        return slot_mean(slices)


# -- int8: blocks, float32 scales, unbiased stochastic rounding --------------------------------
def _round_up_f32(m: np.ndarray) -> np.ndarray:
    """float64 m >= 0 -> the smallest float32 >= m (as float32)."""
    with np.errstate(over="ignore"):                  # beyond float32: inf, refused by the caller
        s = m.astype(np.float32)                      # round to nearest even
    low = s.astype(np.float64) < m
    s[low] = np.nextafter(s[low], np.float32(np.inf))
    return s


def _quantize(x: np.ndarray, key: int, offset: int):
    """(n,) float64 -> (scales (nb,) float32, codes (n,) int8) by the int8 rule."""
    if offset % BLOCK:
        raise ValueError(f"offset {offset} is not a multiple of the block size {BLOCK}")
    _finite_or_refuse(x, "gradient")
    n = len(x)
    nb = -(-n // BLOCK)
    padded = np.zeros(nb * BLOCK)
    padded[:n] = np.abs(x)
    scales = _round_up_f32(padded.reshape(nb, BLOCK).max(axis=1))
    if nb and not float(scales.max()) < MAX_SCALE:
        j = int(np.argmax(scales))
        raise CodecError(f"gradient block {j} is out of the int8 exchange's range "
                         f"(max |value| must be below 2^64)")
    s = np.repeat(scales.astype(np.float64), BLOCK)[:n]
    y = np.zeros(n)
    nz = s > 0
    y[nz] = (x[nz] * 127.0) / s[nz]                     # |y| <= 127: |x| <= s, both ops monotone
    f = np.floor(y)
    u = prng.uniform(key, np.arange(offset, offset + n, dtype=np.uint64).astype(np.uint32))
    codes = (f + (u < (y - f))).astype(np.int8)         # y - floor(y) is exact
    return scales, codes


def _pack(scales: np.ndarray, codes: np.ndarray) -> bytes:
    n, nb = len(codes), len(scales)
    out = np.empty(SCALE_BYTES * nb + n, dtype=np.uint8)
    s_bytes = scales.astype("<f4").view(np.uint8).reshape(nb, SCALE_BYTES)
    c_bytes = codes.view(np.uint8)
    full = n // BLOCK
    body = out[:full * (SCALE_BYTES + BLOCK)].reshape(full, SCALE_BYTES + BLOCK)
    body[:, :SCALE_BYTES] = s_bytes[:full]
    body[:, SCALE_BYTES:] = c_bytes[:full * BLOCK].reshape(full, BLOCK)
    if full < nb:                                       # the short last block
        at = full * (SCALE_BYTES + BLOCK)
        out[at:at + SCALE_BYTES] = s_bytes[full]
        out[at + SCALE_BYTES:] = c_bytes[full * BLOCK:]
    return out.tobytes()


class Int8Codec:
    name = "int8"

    def message_bytes(self, n: int) -> int:
        return SCALE_BYTES * -(-n // BLOCK) + n

    def encode(self, values, *, seed: int, step: int, slot: int, offset: int) -> bytes:
        _check_slot_key(seed, step, slot)
        x = np.asarray(values, dtype=np.float64).reshape(-1)
        return _pack(*_quantize(x, prng.key(PURPOSE_EXCHANGE, seed, step, slot), offset))

    def decode(self, message, n: int) -> np.ndarray:
        message = bytes(message)
        want = self.message_bytes(n)
        nb = -(-n // BLOCK)
        if len(message) != want:
            raise CodecError(f"int8 message of {len(message)} bytes, expected {want} for {n} values "
                             f"in {nb} blocks of {BLOCK}")
        raw = np.frombuffer(message, dtype=np.uint8)
        full = n // BLOCK
        body = raw[:full * (SCALE_BYTES + BLOCK)].reshape(full, SCALE_BYTES + BLOCK)
        s_bytes = np.empty((nb, SCALE_BYTES), dtype=np.uint8)
        s_bytes[:full] = body[:, :SCALE_BYTES]
        codes = np.empty(n, dtype=np.uint8)
        codes[:full * BLOCK] = body[:, SCALE_BYTES:].reshape(-1)
        if full < nb:
            at = full * (SCALE_BYTES + BLOCK)
            s_bytes[full] = raw[at:at + SCALE_BYTES]
            codes[full * BLOCK:] = raw[at + SCALE_BYTES:]
        scales = s_bytes.reshape(-1).view("<f4").astype(np.float64)
        codes = codes.view(np.int8)
        bits = s_bytes.reshape(-1).view("<u4")
        bad = np.flatnonzero((bits >> np.uint32(31) != 0) | ~(scales < MAX_SCALE))
        if len(bad):
            j = int(bad[0])
            raise CodecError(f"block {j}: scale (float32 bits 0x{int(bits[j]):08x}) is out of "
                             f"range (finite, non-negative, below 2^64)")
        s = np.repeat(scales, BLOCK)[:n]
        bad = np.flatnonzero((codes == -128) | ((s == 0) & (codes != 0)))
        if len(bad):
            i = int(bad[0])
            why = "code -128" if codes[i] == -128 else "scale 0 with a non-zero code"
            raise CodecError(f"block {i // BLOCK}: {why} at index {i} (codes are -127..127, all 0 "
                             f"when the scale is 0)")
        return (codes.astype(np.float64) * s) / 127.0

    def shard_bounds(self, N: int, P: int) -> list:
        """Cut points on block boundaries: [min(N, BLOCK * floor(k * nb / P))], nb = ceil(N/BLOCK)."""
        nb = -(-N // BLOCK)
        return [min(N, BLOCK * b) for b in even_bounds(nb, P)]

    def reduce_message(self, slices: list, *, seed: int, step: int, offset: int) -> bytes:
        _check_slot_key(seed, step, 0)
        mean = slot_mean(slices)
        return _pack(*_quantize(mean, prng.key(PURPOSE_EXCHANGE_REDUCED, seed, step), offset))

    def reduce(self, slices: list, *, seed: int, step: int, offset: int) -> np.ndarray:
        return self.decode(self.reduce_message(slices, seed=seed, step=step, offset=offset),
                           len(slices[0]))


CODECS = {"f64": F64Codec(), "int8": Int8Codec()}


def codec_for(name: str):
    """The codec of the run setting `exchange`."""
    try:
        return CODECS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown exchange codec {name!r} (known: {', '.join(CODECS)})") from None
