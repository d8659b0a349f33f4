"""JS CPU mirror vs PyTorch float32 CPU, in the same run: `python bench/bench_js_cpu.py`.

Runs bench/bench_js_cpu.mjs (node) and bench_reference.time_torch (the same architecture in
PyTorch float32, 2 threads) alternately, so both see the same machine load, and prints a
markdown table with the ratio. Medians of >= 5 runs each.
"""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_reference import time_torch   # noqa: E402
from daisy import data                    # noqa: E402
from daisy.config import Config           # noqa: E402


def main():
    cfg, stream = Config(), data.builtin_stream()
    torch_ms, js = [], []
    for _ in range(3):
        torch_ms.append(time_torch(cfg, stream, steps=10, reps=5))
        r = subprocess.run(["node", "bench/bench_js_cpu.mjs", "--json", "--steps", "10", "--reps", "5"],
                           cwd=ROOT, capture_output=True, text=True, check=True)
        js.append(json.loads(r.stdout))
    t = statistics.median(torch_ms)
    print(f"load average {os.getloadavg()[0]:.2f}; 3 alternating rounds, each a median of 5 runs\n")
    print("| path (default config, one peer) | ms/step | ratio to PyTorch |")
    print("|---|---|---|")
    print(f"| PyTorch float32 CPU (2 threads) | {t:.2f} | 1.00 |")
    for k in js[0]["step_ms"]:
        v = statistics.median(j["step_ms"][k] for j in js)
        print(f"| JS CPU mirror, {k} | {v:.2f} | {v / t:.2f} |")
    print("\n| int8 GEMM shape | scalar JS GOPS | wasm-simd GOPS |")
    print("|---|---|---|")
    for i, g in enumerate(js[0]["gemm_gops"]):
        s = statistics.median(j["gemm_gops"][i]["scalar"] for j in js)
        w = statistics.median(j["gemm_gops"][i]["wasm"] for j in js)
        print(f"| {g['what']} | {s:.2f} | {w:.2f} |")


if __name__ == "__main__":
    main()
