"""The data route's pinning (revision -> commit sha, in the data id), its server-side prefetch
(a 100 ms hub: the next step's batch is served without a hub request), and two hardening
findings (no server paths in /data/info; unparsable integers are a 400 naming the parameter).

Real parts only: `python -m daisy.space.datastream` processes (the real router on uvicorn) reading
tests/testhub.py through the real huggingface_hub client (HF_ENDPOINT)."""
import json
import os
import time

import numpy as np
import pytest

from daisy import prng
from daisy.space.datastream import DATASET, PICK_ROW_GROUP
from tests.test_data import DataServer, assert_tokens_equal, tokens_of
from tests.testhub import TestHub, rowgroup_tokens, shard_path, write_fineweb_shard

SHAPES = [(6, 60), (5, 50)]              # (row groups, rows) per shard: small, quick to write
SHA_A = "a" * 40
SHA_B = "b" * 40
DELAY_S = 0.1


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("pin"))
    files, groups = {}, []
    for i, (n_rg, rows) in enumerate(SHAPES):
        local = os.path.join(tmp, f"shard{i}.parquet")
        groups.append(write_fineweb_shard(local, n_rg, rows, seed=i + 11))
        with open(local, "rb") as f:
            files[shard_path(i)] = f.read()
    hubs = {"main": TestHub(files, sha=SHA_A), "slow": TestHub(files, sha=SHA_B, delay_s=DELAY_S),
            "moving": TestHub(files, sha=SHA_A)}      # its main moves during a test
    for hub in hubs.values():
        hub.start()
    specs = {
        "main": {"HF_ENDPOINT": hubs["main"].endpoint},
        "pinned": {"HF_ENDPOINT": hubs["main"].endpoint, "DAISY_DATA_REVISION": SHA_A},
        "unknown": {"HF_ENDPOINT": hubs["main"].endpoint, "DAISY_DATA_REVISION": "c" * 40},
        "offline": {"HF_ENDPOINT": hubs["main"].endpoint, "HF_HUB_OFFLINE": "1"},
        "slow": {"HF_ENDPOINT": hubs["slow"].endpoint},
        "before": {"HF_ENDPOINT": hubs["moving"].endpoint},
    }
    servers = {}
    try:
        for name, env in specs.items():
            servers[name] = DataServer(tmp, name, env)     # DAISY_DATA_REVISION "main" unless given
        deadline = time.monotonic() + 45
        for s in servers.values():
            s.wait_up(deadline)
        yield dict(tmp=tmp, hubs=hubs, servers=servers, groups=groups)
    finally:
        for s in servers.values():
            s.stop()
        for hub in hubs.values():
            hub.stop()


def test_revision_resolves_to_the_commit_and_every_read_uses_it(world):
    hub, server = world["hubs"]["main"], world["servers"]["main"]
    info = server.get("/data/info").json()
    assert info["source"] == "fineweb-edu", info
    assert info["revision"] == "main" and info["commit"] == SHA_A
    assert info["data_id"] == f"{DATASET}@{SHA_A}:sample-10BT:text:daisy-bytes-v1"
    r = server.get("/data/batch", seed=5, step=0, slot=0, batch=2, seq_len=16)
    assert tokens_of(r).shape == (2 * 17,) and r.headers["x-daisy-data-id"] == info["data_id"]
    # the branch name is used once, to resolve it; every listing and file read names the commit
    paths = [p for _, p, _ in hub.requests]
    assert f"/api/datasets/{DATASET}/revision/main" in paths, paths
    reads = [p for p in paths if not p.startswith(f"/api/datasets/{DATASET}/revision/")]
    assert reads and all(f"/{SHA_A}" in p for p in reads), reads
    assert sum("/main" in p for p in paths) == 1, paths               # only the resolution


def test_a_moved_branch_gives_a_new_data_id(world):
    """The same files at another commit: a server started after main moved shows another id."""
    hub, before = world["hubs"]["moving"], world["servers"]["before"]
    first = before.get("/data/info").json()
    assert first["commit"] == SHA_A, first
    hub.sha = SHA_B                                    # main moved (same bytes, new commit)
    late = DataServer(world["tmp"], "late", {"HF_ENDPOINT": hub.endpoint})
    try:
        late.wait_up(time.monotonic() + 30)
        info = late.get("/data/info").json()
        assert info["commit"] == SHA_B and SHA_B in info["data_id"], info
        assert info["data_id"] != first["data_id"]
        # the server started before the move keeps its commit and its id
        assert before.get("/data/info").json()["data_id"] == first["data_id"]
    finally:
        late.stop()


def test_a_pinned_commit_from_the_environment(world):
    info = world["servers"]["pinned"].get("/data/info").json()
    assert info["source"] == "fineweb-edu" and info["revision"] == SHA_A and info["commit"] == SHA_A
    assert SHA_A in info["data_id"]


def test_an_unknown_commit_falls_back_with_the_reason(world):
    info = world["servers"]["unknown"].get("/data/info").json()
    assert info["source"] == "builtin" and "404" in info["reason"], info
    assert info["commit"] is None and info["data_id"].startswith("builtin:")


def strings_in(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from strings_in(k)
            yield from strings_in(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings_in(v)


@pytest.mark.parametrize("name", ["main", "offline"])
def test_info_shows_no_server_paths(world, name):
    server = world["servers"][name]
    info = server.get("/data/info").json()
    leaks = [s for s in strings_in(info) if s.startswith("/") or os.sep + "tmp" in s
             or world["tmp"] in s or "daisy/corpus" in s]
    assert not leaks, json.dumps(info)
    if name == "offline":
        assert info["shard_files"] == ["builtin.txt"], info


@pytest.mark.parametrize("raw", ["--5", "1-2", "+5", "5-", "- 5", "٣", "0x10", "1e3", "--"])
def test_unparsable_integers_are_a_400_naming_the_parameter(world, raw):
    server = world["servers"]["main"]
    r = server.get("/data/window", shard=0, rg=0, offset=raw, length=4)
    assert r.status_code == 400, (raw, r.status_code, r.text)
    assert r.json()["parameter"] == "offset" and "integer" in r.json()["error"], r.json()
    assert server.get("/data/window", shard=0, rg=0, offset=0, length=4).status_code == 200


def pick(seed, step, slot):
    """(shard, rg) of a batch, by the documented rule, for SHAPES."""
    choice = prng.key(prng.PURPOSE_DATA, seed, step, slot, PICK_ROW_GROUP)
    shard = prng.draw(choice, 0) % len(SHAPES)
    return shard, prng.draw(choice, 1) % SHAPES[shard][0]


def wait_prefetch_idle(server, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = server.get("/data/info").json()["prefetch"]
        if p["pending"] == 0:
            return p
        time.sleep(0.05)
    raise AssertionError(f"prefetch still busy after {timeout} s: {p}")


def test_prefetched_next_batch_needs_no_hub_request(world):
    """A hub answering in 100 ms: batch (seed, s, slot) warms s+1 and s+2 in the background, so
    asking for s+1 next costs no hub request, and the request did not wait for the warming."""
    hub, server = world["hubs"]["slow"], world["servers"]["slow"]
    slot = 0
    # a seed whose steps 0, 1, 2 read three different row groups (so the test proves something)
    seed = next(s for s in range(1000) if len({pick(s, k, slot) for k in range(3)}) == 3)
    streams = [[rowgroup_tokens(g) for g in shard] for shard in world["groups"]]
    B, T = 4, 32

    t0 = time.monotonic()
    first = server.get("/data/batch", seed=seed, step=0, slot=slot, batch=B, seq_len=T)
    cold_s = time.monotonic() - t0
    assert first.status_code == 200, first.text
    busy = server.get("/data/info").json()["prefetch"]
    # warming two row groups needs >= 2 hub answers of 100 ms: still at it, so the request
    # above came back without waiting for it
    assert busy["pending"] >= 1 and busy["queued"] == 2, busy
    done = wait_prefetch_idle(server)
    assert done["fetched"] == 2 and done["errors"] == 0, done

    hub.reset_counts()
    t0 = time.monotonic()
    nxt = server.get("/data/batch", seed=seed, step=1, slot=slot, batch=B, seq_len=T)
    warm_s = time.monotonic() - t0
    shard, rg = pick(seed, 1, slot)
    # served from the cache: no hub read of step 1's row group (the request itself starts the
    # background warming of steps 2 and 3, whose reads may already show up here)
    step1_file = shard_path(shard).rsplit("/", 1)[-1]
    later = {shard_path(pick(seed, k, slot)[0]).rsplit("/", 1)[-1] for k in (2, 3)}
    assert step1_file in later or not any(step1_file in r[1] for r in hub.requests), hub.requests
    assert (int(nxt.headers["x-daisy-shard"]), int(nxt.headers["x-daisy-row-group"])) == (shard, rg)
    from daisy import data
    starts = data.batch_starts(len(streams[shard][rg]), seed, 1, slot, B, T)
    want = streams[shard][rg][starts[:, None] + np.arange(T + 1)[None, :]].reshape(-1)
    assert_tokens_equal(tokens_of(nxt), want)
    assert warm_s < cold_s and warm_s < DELAY_S, (warm_s, cold_s)     # no hub round trip on the way
    print(f"cold batch {cold_s * 1000:.0f} ms (hub delay {DELAY_S * 1000:.0f} ms/request), "
          f"prefetched batch {warm_s * 1000:.1f} ms, 0 hub requests")


def test_prefetch_queue_is_bounded_and_deduplicated(world, tmp_path):
    """The prefetcher of a DataSource in this process, on the 100 ms hub: a key offered while
    it is pending is queued once; past the bound, keys are dropped and counted; offering
    never waits (200 offers in well under one hub answer)."""
    from daisy.space.datastream import PREFETCH_QUEUE, DataSource
    source = DataSource(endpoint=world["hubs"]["slow"].endpoint, cache_dir=str(tmp_path / "cache"))
    assert source.info()["source"] == "fineweb-edu"
    pre = source.prefetcher
    t0 = time.monotonic()
    pre.offer((1, 0, 0))
    pre.offer((1, 0, 0))
    for step in range(1, 200):
        pre.offer((1, step, 0))
    offer_s = time.monotonic() - t0
    n = pre.counts()
    assert offer_s < DELAY_S, offer_s
    assert n["queued"] <= PREFETCH_QUEUE + 1 and n["queued"] + n["dropped"] == 200, n
    assert n["pending"] <= PREFETCH_QUEUE + 1, n
