"""Convergence study for issue 25 §2: can a run hide its exchange behind the compute and keep the
loss? Settings against per-step sync (the default), at equal tokens, on the reference trainer
(daisy.train.Group: INT8 units, int8 exchange, the built-in corpus), P peers, default model:

    sync            today: every step exchanges, every replica applies the group's G.
    delay           one-step-delayed update: W_{s+1} = adam(W_s, G_{s-1}) (G_{-1}: no update);
                    step s's exchange can travel while step s+1 computes. Every replica identical.
    local:H:OUTER   local steps: each replica takes H Adam steps on its own batches (its own inner
                    Adam state), then the group averages the int8-encoded deltas
                    D_i = W_global - W_i (the run's exchange codec, step key = the round's last
                    step) and applies an outer step: OUTER = avg (W = W_global - mean D) or
                    nesterov (DiLoCo: lr 0.7, momentum 0.9, buf = 0.9 buf + D; W -= 0.7 (D + 0.9 buf));
                    avgreset = avg, and every replica's inner Adam state (m, v, t) starts afresh
                    after each exchange (then every replica is the same at every exchange);
                    scaleX = an outer learning rate X without momentum (W = W_global - X mean D;
                    scale1 = avg; X = P steps by the sum of the deltas).

Measures per run: the training loss (group mean per step) at steps 300 and 2,000 as "final" =
the mean of the last 20 steps before it (tests/test_convergence.py's rule), and "eval" = the mean
loss of the group's weights (synchronized: every setting's replicas agree at a multiple of H) on
8 fixed batches (step keys 1e6..1e6+7, slot 0; the same for every setting).

    python bench/study_overlap.py --mode sync --seed 1234 --steps 2000 --out /tmp/ov/sync-1234.json
    python bench/study_overlap.py --table /tmp/ov/*.json        # the TEST_RESULTS table
"""
import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from daisy import data  # noqa: E402
from daisy.config import Config  # noqa: E402
from daisy.model import forward  # noqa: E402
from daisy.train import Group  # noqa: E402
from daisy.optim import adam_init, adam_step  # noqa: E402

CHECKPOINTS = (20, 300, 2000)
LAST_N = 20
EVAL_KEYS = [1_000_000 + k for k in range(8)]


def eval_loss(cfg, params, batches) -> float:
    losses = []
    for k in EVAL_KEYS:
        x, y = batches.get(k, 0)
        loss, _ = forward(params, cfg, x, y)
        losses.append(float(loss))
    return float(np.mean(losses))


def run(mode: str, seed: int, steps: int, peers: int, lr_x1000: int | None = None):
    cfg = Config(seed=seed, steps=max(steps, 100), **({} if lr_x1000 is None else {"lr_x1000": lr_x1000}))
    g = Group(cfg, peers, data.builtin_stream())
    losses, evals = [], {}
    parts = mode.split(":")
    H = int(parts[1]) if parts[0] == "local" else 1
    outer = parts[2] if parts[0] == "local" else None
    pending = None
    glob = copy.deepcopy(g.replicas[0].params)        # local: the last synchronized weights
    buf = {k: np.zeros_like(v) for k, v in glob.items()}
    roster = list(range(peers))
    for s in range(steps):
        step_losses, grads = [], []
        for slot, t in enumerate(g.trainers):
            loss_i, g_i = t.local_step(s, slot)
            step_losses.append(loss_i)
            grads.append(g_i)
        if parts[0] == "local":
            for t, g_i in zip(g.trainers, grads):           # each replica's own Adam step
                adam_step(t.replica.params, g_i, t.replica.adam, cfg.lr)
            acc = step_losses[0]
            for l in step_losses[1:]:
                acc = acc + l
            losses.append(acc / len(step_losses))
            if (s + 1) % H == 0:                             # the round's exchange
                hs = [g.collective.exchange(s, roster, slot, 0.0,
                                            {k: glob[k] - t.replica.params[k] for k in glob})
                      for slot, t in enumerate(g.trainers)]
                _, D = hs[0].result()
                for k in glob:
                    if outer.startswith("avg"):
                        glob[k] = glob[k] - D[k]
                    elif outer.startswith("scale"):
                        glob[k] = glob[k] - float(outer[5:]) * D[k]
                    else:
                        buf[k] = 0.9 * buf[k] + D[k]
                        glob[k] = glob[k] - 0.7 * (D[k] + 0.9 * buf[k])
                for t in g.trainers:
                    t.replica.params = copy.deepcopy(glob)
                    if outer.endswith("reset"):             # every replica's inner Adam starts afresh
                        t.replica.adam = adam_init(glob)
        else:
            hs = [g.collective.exchange(s, roster, slot, l, gi)
                  for slot, (l, gi) in enumerate(zip(step_losses, grads))]
            loss, G = hs[0].result()
            losses.append(loss)
            if mode == "sync":
                for t in g.trainers:
                    t.apply(G)
            else:                                            # delay: apply last step's G
                if pending is not None:
                    for t in g.trainers:
                        t.apply(pending)
                pending = G
        if (s + 1) % 250 == 0:
            print(f"{mode} seed {seed}: step {s + 1}, last-{LAST_N} loss {np.mean(losses[-LAST_N:]):.4f}",
                  file=sys.stderr, flush=True)
        if not np.isfinite(losses[-1]):
            raise FloatingPointError(f"{mode} seed {seed}: loss {losses[-1]} at step {s}")
        if s + 1 in CHECKPOINTS:            # the group's weights: local steps' anchor (between exchanges)
            weights = glob if parts[0] == "local" else g.replicas[0].params
            if parts[0] != "local" or (s + 1) % H == 0:
                hashes = {t.replica.params["head.weight"].tobytes() for t in g.trainers}
                assert len(hashes) == 1, f"{mode}: replicas differ at step {s + 1}"
            evals[s + 1] = eval_loss(cfg, weights, g.batches)
    return losses, evals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="sync")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--peers", type=int, default=2)
    ap.add_argument("--lr", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--table", nargs="*")
    a = ap.parse_args()
    if a.table:
        return table(a.table)
    t0 = time.time()
    losses, evals = run(a.mode, a.seed, a.steps, a.peers, a.lr)
    out = {"mode": a.mode, "seed": a.seed, "steps": a.steps, "peers": a.peers, "lr": a.lr,
           "losses": losses, "eval": {str(k): v for k, v in evals.items()},
           "final": {str(c): float(np.mean(losses[c - LAST_N:c])) for c in CHECKPOINTS if c <= a.steps},
           "wall_s": time.time() - t0}
    text = json.dumps(out)
    if a.out:
        Path(a.out).write_text(text)
    print(a.mode, a.seed, out["final"], out["eval"], f"{out['wall_s']:.0f}s")


def smoothed(losses, n=LAST_N):
    """mean of the last n losses at each step (steps n..len), as "final" is taken."""
    c = np.cumsum(np.asarray(losses, dtype=np.float64))
    return {k: float((c[k - 1] - (c[k - n - 1] if k > n else 0.0)) / n) for k in range(n, len(losses) + 1)}


def steps_to(curve: dict, target: float):
    return next((k for k in sorted(curve) if curve[k] <= target), None)


def tokens_to_target(runs, at=(300, 1000)):
    """Per setting and seed: the steps it takes to reach the smoothed loss per-step sync reaches at
    step S (same seed), as a multiple of S (1.00 = as many tokens as sync; None: not within the run)."""
    base = {r["seed"]: smoothed(r["losses"]) for r in runs if r["mode"] == "sync" and r.get("lr") is None}
    print("| setting | seed | " + " | ".join(f"tokens to sync's loss at step {S}" for S in at) + " |")
    print("|---|---|" + "---|" * len(at))
    for r in sorted(runs, key=lambda r: (r["mode"], r["seed"])):
        if r["seed"] not in base or r["mode"] == "sync":
            continue
        curve = smoothed(r["losses"])
        cells = []
        for S in at:
            k = steps_to(curve, base[r["seed"]][S])
            cells.append("not reached in %d steps" % len(r["losses"]) if k is None else f"{k / S:.2f}× ({k} steps)")
        print(f"| {r['mode']} | {r['seed']} | " + " | ".join(cells) + " |")


def time_to_target(runs, alone, S=300):
    """Against one device alone (P = 1, sync): the target is its smoothed loss at step S; each
    P = 2 setting's steps to reach it, and its tokens per step relative to one device."""
    target = smoothed(alone["losses"])[S]
    print(f"\nTarget: one device alone (P = 1, seed {alone['seed']}), smoothed loss at step {S}: {target:.4f}\n")
    print("| setting (P = 2) | seed | steps to target | tokens to target vs alone |\n|---|---|---|---|")
    for r in sorted(runs, key=lambda r: (r["mode"], r["seed"])):
        if r["seed"] != alone["seed"]:
            continue
        k = steps_to(smoothed(r["losses"]), target)
        cell = "not reached" if k is None else f"{k} | {r['peers'] * k / S:.2f}×"
        print(f"| {r['mode']} | {r['seed']} | {cell} |")


def table(paths):
    loaded = [json.loads(Path(p).read_text()) for p in paths]
    runs = [r for r in loaded if r["peers"] == 2]
    alone = [r for r in loaded if r["peers"] == 1]
    key = lambda r: (r["mode"], r.get("lr"))
    base = {r["seed"]: r for r in runs if r["mode"] == "sync" and r.get("lr") is None}
    print("| setting | seed | final@300 | eval@300 | final@2000 | eval@2000 | vs sync final@300 | @2000 | eval @300 | @2000 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(runs, key=lambda r: (str(key(r)), r["seed"])):
        b = base.get(r["seed"])
        f, e = r["final"], r["eval"]
        rel = lambda x, y: f"{100 * (x / y - 1):+.2f} %" if b else "-"
        cells = [f"{f.get(c, float('nan')):.4f}" if c in f else "-" for c in ("300",)] + \
                [f"{e[c]:.4f}" if c in e else "-" for c in ("300",)] + \
                [f"{f[c]:.4f}" if c in f else "-" for c in ("2000",)] + \
                [f"{e[c]:.4f}" if c in e else "-" for c in ("2000",)]
        rels = []
        for src, c in ((f, "300"), (f, "2000"), (e, "300"), (e, "2000")):
            bsrc = b["final"] if src is f else b["eval"] if b else None
            rels.append(rel(src[c], bsrc[c]) if b and c in src and c in bsrc else "-")
        name = r["mode"] + (f" lr {r['lr']}" if r.get("lr") else "")
        print(f"| {name} | {r['seed']} | " + " | ".join(cells + rels) + " |")
    print()
    tokens_to_target(runs)
    for a in alone:
        time_to_target(runs, a)


if __name__ == "__main__":
    main()
