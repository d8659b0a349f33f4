"""The one config of a run: the starter's settings, applied to the whole group.

Every field is an int so a config is exact on every wire and in every file, but `exchange`: the
name of the gradient exchange codec (daisy/exchange_codec.py), one of EXCHANGES.

`local_steps` (H, 1..64) is how many steps each device takes between exchanges
(docs/VERIFICATION.md "Local steps"): 1, the default, exchanges gradients every step; H > 1 lets
every replica take H Adam steps on its own batches, then the group averages the int8-encoded
weight deltas (the replicas' weights averaged). The wire form (to_dict) leaves it out
at 1, so a run without it has the bytes it always had (checkpoints, state bodies, descriptors).
JS twin: frontend_js/config.js.
"""
from dataclasses import dataclass, fields, asdict

from .tokenizer import VOCAB_SIZE   # 257: bytes + EOT


@dataclass(frozen=True)
class Config:
    width: int = 32        # embedding / channel width C of the transformer
    seq_len: int = 32      # context window T in tokens
    batch: int = 8         # sequences per device per step B (more devices = bigger batch)
    steps: int = 300       # training steps of the run
    lr_x1000: int = 10     # Adam learning rate times 1000 (10 means lr = 0.01)
    layers: int = 2        # transformer blocks L
    heads: int = 4         # attention heads H; width must be a multiple of heads
    seed: int = 1234       # run seed: init, data slicing and sampling all derive from it
    exchange: str = "int8"  # how gradients travel between peers: "int8" (1/7.9 the bytes; default) or "f64" (exact)
    local_steps: int = 1   # H: steps each device takes between exchanges (1 = exchange every step)

    def __post_init__(self):
        validate(self)

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def lr(self) -> float:
        return self.lr_x1000 / 1000.0     # one IEEE division, same bits everywhere

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["local_steps"] == 1:     # the default is left out: the bytes of every run before it
            del d["local_steps"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        return cls(**d)


# name -> (min, max, what it is). validate() checks every setting against it; the page's
# sliders (daisy/space/page.py SETTINGS: width, seq_len, batch, steps, lr_x1000) take their bounds from it,
# state_codec.py its largest model. frontend_js/config.js RANGES is its JS twin, for the
# browser's validator: change both.
RANGES = {
    "width": (16, 128, "model width"),
    "seq_len": (16, 128, "sequence length"),
    "batch": (2, 32, "batch per device"),
    "steps": (100, 10000, "steps"),
    "lr_x1000": (5, 50, "learning rate x1000"),
    "layers": (1, 8, "layers"),
    "heads": (1, 8, "heads"),
    "seed": (0, 2**32 - 1, "seed"),
    "local_steps": (1, 64, "local steps"),
}


# the exchange codecs (daisy/exchange_codec.py CODECS); frontend_js/config.js EXCHANGES is the twin
EXCHANGES = ("f64", "int8")


class ConfigError(ValueError):
    """A setting is out of range or inconsistent; the message names it."""


def validate(cfg: Config) -> None:
    for name, (lo, hi, label) in RANGES.items():
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{label} ({name}) must be an integer, got {v!r}")
        if not lo <= v <= hi:
            raise ConfigError(f"{label} ({name}) must be in {lo}..{hi}, got {v}")
    if cfg.exchange not in EXCHANGES:
        raise ConfigError(f"gradient exchange (exchange) must be one of {', '.join(EXCHANGES)}, "
                          f"got {cfg.exchange!r}")
    if cfg.width % cfg.heads:
        raise ConfigError(f"model width ({cfg.width}) must be a multiple of heads ({cfg.heads})")
