"""WGSL int8 GEMM on SwiftShader (headless Chromium, docs/ARCHITECTURE.md "Browser tests") next to
numpy in the same run: GOPS (2*batch*M*K*N / t) of the packed and portable kernels at the
default model's GEMM shapes and 512^3, against numpy int32 matmul (exact, no BLAS) and float32
matmul (BLAS; not exact, a speed reference only). WGSL time is one dispatch, submit to onSubmittedWorkDone, median of
--runs after a warm-up; "call" is one engine-style gemm end to end (pack, upload, dispatch,
readback). Every WGSL result is checked exact against the JS CPU engine. SwiftShader proves
correctness, not speed (the H200 figures are in bench/h200/).

    python bench/bench_wgsl.py [--runs 5] [--no-512]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.browser import static_server, webgpu_page  # noqa: E402

# (batch, M, K, N) of one default-config step (width 32, seq 32, batch 8, heads 4, vocab 257),
# as recorded from the JS model by bench/h200/run_all.mjs
MODEL_SHAPES = [(1, 256, 32, 96), (32, 32, 8, 32), (32, 32, 32, 8), (1, 256, 32, 32), (1, 256, 32, 128),
                (1, 256, 128, 32), (1, 256, 32, 257), (1, 257, 256, 32), (1, 256, 257, 32),
                (1, 32, 256, 128), (1, 128, 256, 32)]


def numpy_ms(shape, dtype, runs):
    b, M, K, N = shape
    rng = np.random.default_rng(0)
    a = rng.integers(-127, 128, (b, M, K)).astype(dtype)
    w = rng.integers(-127, 128, (b, K, N)).astype(dtype)
    np.matmul(a, w)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        np.matmul(a, w)
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-512", action="store_true", help="skip 512^3 (about 30 s on SwiftShader)")
    args = ap.parse_args()
    shapes = MODEL_SHAPES + ([] if args.no_512 else [(1, 512, 512, 512)])
    with static_server() as base, webgpu_page(base + "/tests/pages/gpu_selftest.html", "bench") as (page, _):
        page.wait_for_function("window.selftestReady === true", timeout=30_000)
        res = page.evaluate("([s, r]) => window.selftest.benchGemm(s, r)", [[list(x) for x in shapes], args.runs])
    adapter = res["adapter"]
    print(f"adapter: {adapter['vendor']} {adapter['architecture']} ({adapter['description']}), runs={args.runs}")
    wgsl = {(r["kernel"], tuple(r["shape"])): r for r in res["rows"]}
    bad = [k for k, r in wgsl.items() if not r["exact"]]
    if bad:
        raise SystemExit(f"WGSL results not exact: {bad}")
    hdr = f"{'shape (b,M,K,N)':>20} | {'packed GOPS':>11} {'call ms':>8} | {'portable GOPS':>13} {'call ms':>8} | {'np int32 GOPS':>13} | {'np f32 GOPS':>11} | packed/np-int32"
    print(hdr)
    print("-" * len(hdr))
    for shape in shapes:
        ops = 2 * shape[0] * shape[1] * shape[2] * shape[3]
        p, q = wgsl[("packed", shape)], wgsl[("portable", shape)]
        gp, gq = ops / statistics.median(p["ms"]) / 1e6, ops / statistics.median(q["ms"]) / 1e6
        gi = ops / numpy_ms(shape, np.int32, args.runs) / 1e6
        gf = ops / numpy_ms(shape, np.float32, args.runs) / 1e6
        print(f"{'x'.join(map(str, shape)):>20} | {gp:11.3f} {p['callMs']:8.1f} | {gq:13.3f} {q['callMs']:8.1f} | {gi:13.3f} | {gf:11.2f} | {gp / gi:.3f}")


if __name__ == "__main__":
    main()
