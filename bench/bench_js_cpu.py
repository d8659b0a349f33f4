"""JS CPU mirror vs PyTorch float32 CPU, in the same run: `python bench/bench_js_cpu.py`.

Runs bench/js_cpu_core.mjs in node (bench/bench_js_cpu.mjs) and in headless Chromium (the
system /usr/bin/chromium with tests/page_browser.py's flags, the page served from a local
http.server), and bench_reference.time_torch (the same architecture in PyTorch float32,
2 threads), alternately, so all three see the same machine load. Prints markdown tables
with the ratio to PyTorch. Each round is a median of 5 runs; the table the median of 3 rounds.
"""
import functools
import http.server
import json
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_reference import time_torch   # noqa: E402
from daisy import data                    # noqa: E402
from daisy.config import Config           # noqa: E402
from page_browser import CHROMIUM, FLAGS  # noqa: E402
from playwright.sync_api import sync_playwright   # noqa: E402

ROUNDS, STEPS, REPS = 3, 10, 5
PAGE = b"<!doctype html><meta charset=utf-8><title>bench_js_cpu</title>"


class Handler(http.server.SimpleHTTPRequestHandler):
    """The repository as static files (JS as text/javascript for modules), plus a blank page
    and the built-in token stream as little-endian uint16 bytes."""
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".js": "text/javascript", ".mjs": "text/javascript"}
    stream_bytes = b""

    def do_GET(self):
        if self.path in ("/bench_page.html", "/bench_stream.u16"):
            body = PAGE if self.path.endswith(".html") else self.stream_bytes
            self.send_response(200)
            self.send_header("Content-Type", "text/html" if self.path.endswith(".html") else "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


BROWSER_RUN = """async ([steps, reps]) => {
  const { runBench } = await import('/bench/js_cpu_core.mjs');
  const stream = new Uint16Array(await (await fetch('/bench_stream.u16')).arrayBuffer());
  return runBench(stream, { steps, reps });
}"""


def node_round():
    r = subprocess.run(["node", "bench/bench_js_cpu.mjs", "--json", "--steps", str(STEPS), "--reps", str(REPS)],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def main():
    cfg, stream = Config(), data.builtin_stream()
    Handler.stream_bytes = stream.astype("<u2").tobytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(ROOT)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    torch_ms, runs = [], {"node": [], "Chromium": []}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, timeout=30_000)
            try:
                version = browser.version
                for _ in range(ROUNDS):
                    torch_ms.append(time_torch(cfg, stream, steps=STEPS, reps=REPS))
                    runs["node"].append(node_round())
                    page = browser.new_page()
                    page.goto(base + "/bench_page.html")
                    runs["Chromium"].append(page.evaluate(BROWSER_RUN, [STEPS, REPS]))
                    page.close()
            finally:
                browser.close()
    finally:
        server.shutdown()
    node_version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    t = statistics.median(torch_ms)
    print(f"load average {os.getloadavg()[0]:.2f}; node {node_version}, Chromium {version}; "
          f"{ROUNDS} alternating rounds, each a median of {REPS} runs\n")
    print("| path (default config, one peer) | ms/step | ratio to PyTorch |")
    print("|---|---|---|")
    print(f"| PyTorch float32 CPU (2 threads) | {t:.2f} | 1.00 |")
    for where, js in runs.items():
        for k in js[0]["step_ms"]:
            v = statistics.median(j["step_ms"][k] for j in js)
            print(f"| JS CPU mirror ({where}), {k} | {v:.2f} | {v / t:.2f} |")
    print("\n| int8 GEMM shape | node scalar GOPS | node wasm-simd GOPS | Chromium scalar GOPS | Chromium wasm-simd GOPS |")
    print("|---|---|---|---|---|")
    for i, g in enumerate(runs["node"][0]["gemm_gops"]):
        cells = [statistics.median(j["gemm_gops"][i][e] for j in runs[w]) for w in runs for e in ("scalar", "wasm")]
        print(f"| {g['what']} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
