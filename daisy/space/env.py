"""Numbers and switches from environment variables (DAISY_*): one parser each, so every setting
accepts and refuses the same way and a bad value stops startup with its name in the message."""
from __future__ import annotations


def env_number(env, name: str, default, kind=float, *, allow_zero: bool = False):
    """env[name] as `kind` (int or float), or `default` when unset or empty. A value that is not
    a number, or not > 0 (>= 0 with allow_zero), raises ValueError naming the variable."""
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"{name} must be {what}, got {raw[:40]!r}") from None
    if not (value >= 0 if allow_zero else value > 0):     # `not >` also refuses nan
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {raw[:40]!r}")
    return value


FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def env_flag(env, name: str, default: bool = False) -> bool:
    """env[name] as a switch: 1/true/yes/on or 0/false/no/off (any case), `default` when unset or
    empty; anything else raises ValueError naming the variable."""
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        return FLAG_VALUES[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"{name} must be 1/true/yes/on or 0/false/no/off, got {raw[:40]!r}") from None
