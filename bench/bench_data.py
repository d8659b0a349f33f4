"""Benchmark of the /data route against the local test hub (tests/testhub.py).

Measures, through real uvicorn on 127.0.0.1 (`python -m daisy.space.datastream` in a subprocess):
  1. cold requests: bytes the hub served per first window of each row group, next to that row
     group's `text` column chunk and its whole size (all columns), plus the footer read;
  2. cached window latency (2048 tokens) and cached batch latency (8 x 129 tokens): median of
     RUNS runs of REQS requests each, and the ratio to a baseline in the same run, an HTTP
     request of the same server answered 400 without touching data (framework + socket cost).

Run: python bench/bench_data.py     (about 15 s; prints Markdown tables for TEST_RESULTS.md)
"""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import pyarrow.parquet as pq

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from tests.app_server import free_port  # noqa: E402
from tests.testhub import TestHub, shard_path, write_fineweb_shard  # noqa: E402

ROW_GROUPS, ROWS = 6, 1000        # one shard; ~0.5 MB of compressed text per row group
RUNS, REQS = 7, 100


def median_ms(client: httpx.Client, path: str, params: dict) -> float:
    times = []
    for _ in range(REQS):
        t0 = time.perf_counter()
        r = client.get(path, params=params)
        times.append(time.perf_counter() - t0)
        r.content
    return statistics.median(times) * 1e3


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="bench-data-")
    local = os.path.join(tmp, "shard.parquet")
    write_fineweb_shard(local, ROW_GROUPS, ROWS, seed=1)
    meta = pq.ParquetFile(local).metadata
    with open(local, "rb") as f:
        hub = TestHub({shard_path(0): f.read()})
    hub.start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DAISY_"))}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=os.path.join(tmp, "hf"), HF_HUB_DISABLE_TELEMETRY="1",
               DAISY_DATA_REVISION="main", DAISY_DATA_CACHE_DIR=os.path.join(tmp, "cache"), PYTHONPATH=REPO_ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "daisy.space.datastream", "--port", str(port)],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("data server did not start")
                time.sleep(0.05)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        info = client.get("/data/info").json()
        assert info["source"] == "fineweb-edu", info

        print(f"shard: {ROW_GROUPS} row groups x {ROWS} rows, file {os.path.getsize(local) / 1e6:.2f} MB\n")
        print("| row group | text chunk (B) | whole row group (B) | hub bytes, cold window | ratio to text chunk | cold ms |")
        print("|---|---|---|---|---|---|")
        for rg in range(ROW_GROUPS):
            hub.reset_counts()
            t0 = time.perf_counter()
            r = client.get("/data/window", params=dict(shard=0, rg=rg, offset=0, length=2048))
            ms = (time.perf_counter() - t0) * 1e3
            assert r.status_code == 200, r.text
            served = hub.total_bytes()
            chunk = meta.row_group(rg).column(0).total_compressed_size
            whole = sum(meta.row_group(rg).column(c).total_compressed_size for c in range(meta.num_columns))
            note = " (incl. 64 KiB footer read)" if rg == 0 else ""
            print(f"| {rg} | {chunk} | {whole} | {served}{note} | {served / chunk:.3f} | {ms:.0f} |")

        window = dict(shard=0, rg=1, offset=4096, length=2048)
        batch = dict(seed=1234, step=0, slot=0, batch=8, seq_len=128)
        r = client.get("/data/batch", params=batch)
        assert r.status_code == 200, r.text
        baseline = dict(shard=0, rg=0, offset=0, length=0)           # 400, no data touched
        rows = {"baseline (400 answer)": [], "cached window 2048 tok": [], "cached batch 8x129 tok": []}
        for _ in range(RUNS):
            rows["baseline (400 answer)"].append(median_ms(client, "/data/window", baseline))
            rows["cached window 2048 tok"].append(median_ms(client, "/data/window", window))
            rows["cached batch 8x129 tok"].append(median_ms(client, "/data/batch", batch))
        base = statistics.median(rows["baseline (400 answer)"])
        print(f"\n{RUNS} runs x {REQS} requests, keep-alive httpx client on loopback\n")
        print("| request | median of run medians (ms) | min..max run median (ms) | ratio to baseline |")
        print("|---|---|---|---|")
        for name, meds in rows.items():
            m = statistics.median(meds)
            print(f"| {name} | {m:.2f} | {min(meds):.2f}..{max(meds):.2f} | {m / base:.2f} |")
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
        hub.stop()


if __name__ == "__main__":
    main()
