"""What a keyed request may ask (package docstring, Keys): the bounds and the one check that
names a parameter out of them."""
from daisy.space.datastream.errors import DataRequestError

MAX_TOKENS = 65536                # most tokens one window or batch response carries
U32_MAX = 2**32 - 1               # seed, step and slot are key words of daisy.prng
PICK_ROW_GROUP = 1                # last key word of the shard/row-group choice of a batch


def check_range(name: str, value: int, lo: int, hi: int | None) -> None:
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise DataRequestError(name, f"{name} must be an integer in {rng}, got {value}")
