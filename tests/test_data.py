"""The /data routes against a local test hub (tests/testhub.py) over real sockets.

Each data server is `python -m daisy.space.datastream` (the real router on real uvicorn) in its own
process, so HF_ENDPOINT / HF_HUB_OFFLINE are read by huggingface_hub as in production.
"""
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from daisy import data, prng
from daisy.space.datastream import MAX_TOKENS, PICK_ROW_GROUP
from tests.app_server import free_port
from tests.testhub import TestHub, rowgroup_tokens, shard_path, write_fineweb_shard

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE_MB = 1                              # the bounded server's disk and memory caches
SHARD_SHAPES = [(6, 150), (5, 120)]       # (row groups, rows per group) of each shard
FOOTER_READ = 64 * 1024                   # pyarrow reads the last 64 KiB for the footer


def first_mismatch(got: np.ndarray, want: np.ndarray) -> str:
    if len(got) != len(want):
        return f"length {len(got)} != {len(want)}"
    i = int(np.flatnonzero(got != want)[0])
    return f"first mismatch at index {i}: got {int(got[i])}, want {int(want[i])}"


def assert_tokens_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert len(got) == len(want) and np.array_equal(got, want), first_mismatch(got, want)


def tokens_of(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/octet-stream"
    return np.frombuffer(resp.content, dtype="<u2")


class DataServer:
    """`python -m daisy.space.datastream` on a free port with the given environment."""

    def __init__(self, tmp, name: str, env: dict):
        self.port = free_port()
        self.cache_dir = os.path.join(tmp, f"cache-{name}")
        full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DAISY_"))}
        full.update(HF_HOME=os.path.join(tmp, f"hfhome-{name}"), HF_HUB_DISABLE_TELEMETRY="1",
                    DAISY_DATA_REVISION="main", DAISY_DATA_CACHE_DIR=self.cache_dir,
                    PYTHONPATH=REPO_ROOT)
        full.update(env)
        self.log = open(os.path.join(tmp, f"server-{name}.log"), "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "daisy.space.datastream", "--port", str(self.port)],
                                     cwd=REPO_ROOT, env=full, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def wait_up(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.log.seek(0)
        raise AssertionError(f"data server did not start (rc={self.proc.poll()}):\n{self.log.read()}")

    def get(self, path: str, **params) -> httpx.Response:
        return self.client.get(path, params=params)

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("data"))
    files, groups, metas = {}, [], []
    for i, (n_rg, rows) in enumerate(SHARD_SHAPES):
        local = os.path.join(tmp, f"shard{i}.parquet")
        groups.append(write_fineweb_shard(local, n_rg, rows, seed=i + 1))
        metas.append(pq.ParquetFile(local).metadata)
        with open(local, "rb") as f:
            files[shard_path(i)] = f.read()
    # The built-in corpus: generated here so the test does not depend on daisy/corpus.
    builtin = os.path.join(tmp, "builtin.txt")
    docs = [f"Document {i}: the river carries water to the ocean; élève {i * i}." * (1 + i % 5) for i in range(60)]
    with open(builtin, "w", encoding="utf-8") as f:
        f.write("\n\n\n".join(docs) + "\n")

    hubs = {name: TestHub(files) for name in ("main", "offline", "e404", "e500", "broken")}
    for hub in hubs.values():
        hub.start()
    hubs["e404"].fail_status = 404
    hubs["e500"].fail_status = 500
    hubs["broken"].fail_resolve_status = 404       # lists fine, then file reads fail
    # these tests count the hub's bytes exactly: no background prefetch (tests/test_data_pinning.py
    # covers it) may fetch a row group between a reset_counts() and the check
    base = {"DAISY_DATA_BUILTIN": builtin, "DAISY_DATA_PREFETCH_STEPS": "0"}
    specs = {
        "a": {"HF_ENDPOINT": hubs["main"].endpoint, "DAISY_DATA_CACHE_MB": str(CACHE_MB),
              "DAISY_DATA_MEM_MB": str(CACHE_MB)},
        "b": {"HF_ENDPOINT": hubs["main"].endpoint},
        "offline": {"HF_ENDPOINT": hubs["offline"].endpoint, "HF_HUB_OFFLINE": "1"},
        "closed": {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"},   # nothing listens there
        "e404": {"HF_ENDPOINT": hubs["e404"].endpoint},
        "e500": {"HF_ENDPOINT": hubs["e500"].endpoint},
        "broken": {"HF_ENDPOINT": hubs["broken"].endpoint},
    }
    servers = {}
    try:
        for name, env in specs.items():
            servers[name] = DataServer(tmp, name, {**base, **env})
        deadline = time.monotonic() + 45
        for s in servers.values():
            s.wait_up(deadline)
        yield dict(hubs=hubs, servers=servers, groups=groups, metas=metas, builtin=builtin)
    finally:
        for s in servers.values():
            s.stop()
        for hub in hubs.values():
            hub.stop()


def text_chunk_bytes(meta, rg: int) -> int:
    """Compressed size of the `text` column chunk of row group rg (what a cold read needs)."""
    return meta.row_group(rg).column(0).total_compressed_size


def test_info_lists_the_hub_shards(world):
    info = world["servers"]["a"].get("/data/info").json()
    assert info["source"] == "fineweb-edu" and info["reason"] is None
    assert info["dataset"] == "HuggingFaceFW/fineweb-edu" and info["config"] == "sample-10BT"
    assert info["revision"] == "main" and info["column"] == "text"
    assert info["shards"] == 2
    assert info["shard_files"] == [shard_path(0), shard_path(1)]
    assert info["cache"]["limit_bytes"] == CACHE_MB << 20


def test_cold_window_fetches_only_its_row_group(world):
    hub, a = world["hubs"]["main"], world["servers"]["a"]
    meta = world["metas"][0]
    file_size = len(hub.files[shard_path(0)])
    a.get("/data/info")
    hub.reset_counts()

    # First read of shard 0: footer (64 KiB tail) + the text chunk of row group 2.
    got = tokens_of(a.get("/data/window", shard=0, rg=2, offset=0, length=1000))
    assert_tokens_equal(got, rowgroup_tokens(world["groups"][0][2])[:1000])
    served = hub.bytes_served.get(shard_path(0), 0)
    chunk = text_chunk_bytes(meta, 2)
    assert chunk <= served <= chunk + FOOTER_READ, (served, chunk)
    assert served < file_size / 2
    assert shard_path(1) not in hub.bytes_served
    resolves = [r for r in hub.requests if "/resolve/" in r[1]]
    assert resolves and all(r[2].startswith("bytes=") for r in resolves), resolves   # ranges only

    # Footer now known: a cold read of row group 4 costs exactly its text column chunk.
    hub.reset_counts()
    stream4 = rowgroup_tokens(world["groups"][0][4])
    got = tokens_of(a.get("/data/window", shard=0, rg=4, offset=len(stream4) - 300, length=300))
    assert_tokens_equal(got, stream4[-300:])
    assert hub.bytes_served[shard_path(0)] == text_chunk_bytes(meta, 4)

    # Cached: the same key again transfers nothing and returns the same bytes.
    hub.reset_counts()
    again = tokens_of(a.get("/data/window", shard=0, rg=4, offset=len(stream4) - 300, length=300))
    assert_tokens_equal(again, got)
    assert hub.total_bytes() == 0


def test_concurrent_cold_requests_fetch_the_row_group_once(world):
    hub, b = world["hubs"]["main"], world["servers"]["b"]
    tokens_of(b.get("/data/window", shard=1, rg=0, offset=0, length=1))     # footer of shard 1
    hub.reset_counts()
    params = dict(shard=1, rg=3, offset=100, length=500)
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: httpx.get(b.url + "/data/window", params=params, timeout=30), range(8)))
    want = rowgroup_tokens(world["groups"][1][3])[100:600]
    for r in responses:
        assert_tokens_equal(tokens_of(r), want)
    assert hub.bytes_served[shard_path(1)] == text_chunk_bytes(world["metas"][1], 3)


def test_window_headers_and_end_of_row_group(world):
    a = world["servers"]["a"]
    stream = rowgroup_tokens(world["groups"][1][0])
    r = a.get("/data/window", shard=1, rg=0, offset=len(stream) - 8, length=8)
    assert_tokens_equal(tokens_of(r), stream[-8:])
    assert r.headers["x-daisy-source"] == "fineweb-edu"
    assert "x-daisy-fallback-reason" not in r.headers
    assert r.headers["x-daisy-tokens"] == "8" and stream[-1] == 256      # EOT ends the group
    r = a.get("/data/window", shard=1, rg=0, offset=len(stream) - 4, length=8)
    assert r.status_code == 400
    assert r.json()["parameter"] == "offset" and str(len(stream)) in r.json()["error"]


def expected_batch(streams, seed, step, slot, B, T):
    """The documented batch rule, computed from the reference streams."""
    choice = prng.key(prng.PURPOSE_DATA, seed, step, slot, PICK_ROW_GROUP)
    shard = prng.draw(choice, 0) % len(streams)
    rg = prng.draw(choice, 1) % len(streams[shard])
    stream = streams[shard][rg]
    starts = data.batch_starts(len(stream), seed, step, slot, B, T)
    return shard, rg, stream[starts[:, None] + np.arange(T + 1)[None, :]].reshape(-1)


def test_batches_are_deterministic_across_processes(world):
    a, b = world["servers"]["a"], world["servers"]["b"]
    streams = [[rowgroup_tokens(g) for g in shard] for shard in world["groups"]]
    seen = set()
    for seed, step, slot in [(1234, 0, 0), (1234, 0, 1), (1234, 1, 0), (7, 99, 3), (2**32 - 1, 5, 2)]:
        key = dict(seed=seed, step=step, slot=slot, batch=4, seq_len=64)
        ra, rb = a.get("/data/batch", **key), b.get("/data/batch", **key)
        shard, rg, want = expected_batch(streams, seed, step, slot, 4, 64)
        assert_tokens_equal(tokens_of(ra), want)
        assert_tokens_equal(tokens_of(rb), want)                     # a second server process
        assert ra.headers["x-daisy-shard"] == str(shard) and ra.headers["x-daisy-row-group"] == str(rg)
        assert ra.headers["x-daisy-data-id"] == rb.headers["x-daisy-data-id"]
        seen.add(ra.content)
    assert len(seen) == 5                                             # different keys, different bytes


def test_disk_cache_stays_within_its_bound(world):
    hub, a = world["hubs"]["main"], world["servers"]["a"]
    limit = CACHE_MB << 20
    for _ in range(2):
        for shard, (n_rg, _) in enumerate(SHARD_SHAPES):
            for rg in range(n_rg):
                assert a.get("/data/window", shard=shard, rg=rg, offset=0, length=16).status_code == 200
                on_disk = sum(e.stat().st_size for e in os.scandir(a.cache_dir))
                assert on_disk <= limit, (on_disk, limit)
    info = a.get("/data/info").json()
    assert 0 < info["cache"]["bytes"] <= limit
    assert info["cache"]["memory_bytes"] <= info["cache"]["memory_limit_bytes"]
    # Row group 0 of shard 0 was evicted from both caches long ago: it comes from the hub again.
    hub.reset_counts()
    got = tokens_of(a.get("/data/window", shard=0, rg=0, offset=5, length=50))
    assert_tokens_equal(got, rowgroup_tokens(world["groups"][0][0])[5:55])
    assert hub.bytes_served[shard_path(0)] == text_chunk_bytes(world["metas"][0], 0)


@pytest.mark.parametrize("name, reason", [("offline", "offline"), ("closed", "unreachable"),
                                          ("e404", "HTTP 404"), ("e500", "HTTP 500")])
def test_hub_failures_fall_back_to_builtin(world, name, reason):
    server = world["servers"][name]
    stream = data.builtin_stream(world["builtin"])         # the route reads it by daisy.data's rule
    info = server.get("/data/info").json()
    assert info["source"] == "builtin" and reason in info["reason"], info
    assert info["total_tokens"] == len(stream) and info["shards"] == 1
    r = server.get("/data/window", shard=0, rg=0, offset=10, length=200)
    assert_tokens_equal(tokens_of(r), stream[10:210])
    assert r.headers["x-daisy-source"] == "builtin" and reason in r.headers["x-daisy-fallback-reason"]
    # A built-in batch is the reference trainer's batch of the same stream, bit for bit.
    r = server.get("/data/batch", seed=1234, step=3, slot=1, batch=8, seq_len=32)
    x, y = data.get_batch(stream, 1234, 3, 1, 8, 32)
    rows = tokens_of(r).reshape(8, 33).astype(np.int64)
    assert_tokens_equal(rows[:, :-1].reshape(-1), x.reshape(-1))
    assert_tokens_equal(rows[:, 1:].reshape(-1), y.reshape(-1))
    assert r.headers["x-daisy-source"] == "builtin"
    # builtin has one shard and one row group
    r = server.get("/data/window", shard=1, rg=0, offset=0, length=10)
    assert r.status_code == 400 and r.json()["parameter"] == "shard"
    if name == "offline":
        assert world["hubs"]["offline"].requests == []               # offline means no request at all


def test_hub_failing_mid_stream_switches_to_builtin(world):
    server = world["servers"]["broken"]
    assert server.get("/data/info").json()["source"] == "fineweb-edu"      # the listing worked
    r = server.get("/data/window", shard=0, rg=0, offset=0, length=100)
    assert tokens_of(r).shape == (100,)
    assert r.headers["x-daisy-source"] == "builtin"
    reason = r.headers["x-daisy-fallback-reason"]
    assert "hub failed while streaming" in reason and "404" in reason, reason
    info = server.get("/data/info").json()
    assert info["source"] == "builtin" and info["reason"] == reason     # sticky: one corpus per run
    assert server.proc.poll() is None


BAD_REQUESTS = [
    ("/data/window", dict(shard=0, offset=0, length=10), "rg", "missing"),
    ("/data/window", dict(shard=-1, rg=0, offset=0, length=10), "shard", "0..1"),
    ("/data/window", dict(shard=2, rg=0, offset=0, length=10), "shard", "0..1"),
    ("/data/window", dict(shard=0, rg=6, offset=0, length=10), "rg", "0..5"),
    ("/data/window", dict(shard=0, rg="abc", offset=0, length=10), "rg", "integer"),
    ("/data/window", dict(shard=0, rg=0, offset="1.5", length=10), "offset", "integer"),
    ("/data/window", dict(shard=0, rg=0, offset=-3, length=10), "offset", ">= 0"),
    ("/data/window", dict(shard=0, rg=0, offset=0, length=0), "length", f"1..{MAX_TOKENS}"),
    ("/data/window", dict(shard=0, rg=0, offset=0, length=MAX_TOKENS + 1), "length", f"1..{MAX_TOKENS}"),
    ("/data/window", dict(shard="9" * 60, rg=0, offset=0, length=1), "shard", "integer"),
    ("/data/batch", dict(seed=2**32, step=0, slot=0, batch=2, seq_len=8), "seed", "0..4294967295"),
    ("/data/batch", dict(seed=1, step=-1, slot=0, batch=2, seq_len=8), "step", "0..4294967295"),
    ("/data/batch", dict(seed=1, step=0, slot=0, batch=0, seq_len=8), "batch", "1.."),
    ("/data/batch", dict(seed=1, step=0, slot=0, batch=64, seq_len=4096), "batch", str(MAX_TOKENS)),
    ("/data/batch", dict(seed=1, step=0, slot="", batch=2, seq_len=8), "slot", "missing"),
]


def test_bad_requests_get_a_clear_400_and_the_server_stays_up(world):
    a = world["servers"]["a"]
    for path, params, parameter, words in BAD_REQUESTS:
        r = a.get(path, **params)
        assert r.status_code == 400, (path, params, r.status_code, r.text)
        body = r.json()
        assert body["parameter"] == parameter and parameter in body["error"] and words in body["error"], (params, body)
        assert body["code"] == "bad_parameter", body          # clients decide on the code, not the words
    assert a.proc.poll() is None
    assert a.get("/data/info").json()["source"] == "fineweb-edu"
    assert tokens_of(a.get("/data/window", shard=0, rg=0, offset=0, length=4)).shape == (4,)
