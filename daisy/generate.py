"""Sampling text from a model, reproducibly: same weights + prompt + settings + seed give the
same text here, in the page (frontend_js/generate.js) and in the offline kit.

For token number i (0-based) of the continuation:
    context = the last seq_len tokens of (prompt + tokens so far)   (an empty prompt starts at EOT)
    logits  = forward(params, context)[last position]               (the INT8 path, as in training)
    temperature == 0: the argmax (lowest id among equal maxima)
    otherwise: z = logits / temperature; keep the top_k largest z (ties: lower id first; top_k = 0
    keeps all); e_j = exp(z_j - max z) for kept j, +0 for the rest; total = tree_sum(e) over all V;
    u = prng.uniform(prng.key(PURPOSE_SAMPLE, seed, i), 0) * total; the token is the first j
    (ascending) whose running sum e_0 + ... + e_j (added left to right) exceeds u, else the last
    kept j.
    python -m daisy.generate CHECKPOINT --prompt "Once" --seed 1 --tokens 200
"""
import argparse
import sys

import numpy as np

from . import prng
from .config import Config
from .detmath import exp, tree_sum
from .model import forward
from .tokenizer import EOT, decode, encode

MAX_TOKENS = 2000
MAX_TEMPERATURE = 10.0      # 0 = greedy (the argmax); the page, the kit and generate.js share this rule


def next_token(logits, i: int, temperature: float, top_k: int, seed: int) -> int:
    """logits (V,) float64 -> the sampled token id for continuation position i."""
    V = logits.shape[0]
    if temperature == 0.0:
        return int(np.argmax(logits))                         # first maximum
    z = logits / temperature                                  # (V,)
    keep = np.ones(V, dtype=bool)
    if 0 < top_k < V:
        order = np.lexsort((np.arange(V), -z))                # by z descending, then id ascending
        keep[:] = False
        keep[order[:top_k]] = True
    m = np.max(z[keep])
    e = np.where(keep, exp(z - m), 0.0)                       # (V,)
    total = float(tree_sum(e))
    u = float(prng.uniform(prng.key(prng.PURPOSE_SAMPLE, seed, i), 0)) * total
    run = 0.0
    last = 0
    for j in range(V):
        if not keep[j]:
            continue
        run = run + float(e[j])
        last = j
        if run > u:
            return j
    return last


def generate(params, cfg: Config, prompt: str, n_tokens: int, temperature: float = 0.8,
             top_k: int = 40, seed: int = 0):
    """-> (continuation text, token ids)."""
    if not 0 <= n_tokens <= MAX_TOKENS:
        raise ValueError(f"tokens must be in 0..{MAX_TOKENS}, got {n_tokens}")
    if not (temperature >= 0.0 and temperature <= MAX_TEMPERATURE):
        raise ValueError(f"temperature must be in 0..{MAX_TEMPERATURE:g}, got {temperature}")
    if not 0 <= top_k <= 257:
        raise ValueError(f"top_k must be in 0..257 (0 = all), got {top_k}")
    ids = [int(t) for t in encode(prompt)] or [EOT]
    out = []
    for i in range(n_tokens):
        ctx = np.array(ids[-cfg.seq_len:], dtype=np.int64)[None, :]   # (1, T')
        logits = forward(params, cfg, ctx)[-1]                          # (V,)
        t = next_token(logits, i, temperature, top_k, seed)
        ids.append(t)
        out.append(t)
    return decode(out), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m daisy.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a .pt checkpoint written by DaisyChain-Web")
    ap.add_argument("--prompt", default="", help="text to continue")
    ap.add_argument("--tokens", type=int, default=200, help=f"tokens to generate, 0..{MAX_TOKENS} (200)")
    ap.add_argument("--temperature", type=float, default=0.8, help="0 = greedy, up to 10 (0.8)")
    ap.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens, 0 = all (40)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed, 0..2^32-1 (0)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 <= args.seed <= 2**32 - 1:
        ap.error(f"seed must be in 0..{2**32 - 1}, got {args.seed}")
    from .files.checkpoint import CheckpointError, load_checkpoint
    try:
        ck = load_checkpoint(args.checkpoint)
    except (CheckpointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = Config.from_dict(ck.config)
    try:
        text, _ = generate(ck.params, cfg, args.prompt, args.tokens, args.temperature, args.top_k, args.seed)
    except ValueError as e:
        ap.error(str(e))
    sys.stdout.write(args.prompt + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
