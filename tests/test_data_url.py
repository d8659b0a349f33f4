"""`python -m daisy.train --data-url`: the reference trainer on the Space's keyed batches
(GET /data/batch), against real `python -m daisy.space.datastream` servers.

On the built-in corpus the data route's batch IS daisy.data.get_batch, so a --data-url run prints
exactly the lines of the plain run. On FineWeb-style shards (tests/testhub.py through the real
huggingface_hub client) it equals a run that calls DataSource.batch in this process."""
import json
import os
import time

import pytest

from daisy import data
from daisy.config import Config
from daisy.space.datastream import DataSource
from daisy.batch_source import HttpBatches
from daisy.train import Group
from tests.bits import assert_same_bits
from tests.reference import train_cli
from tests.app_server import free_port
from tests.test_data import DataServer
from tests.testhub import TestHub, shard_path, write_fineweb_shard

SMALL = ["--width", "16", "--heads", "2", "--seq-len", "16", "--batch", "2", "--layers", "1"]
SMALL_CFG = Config(width=16, heads=2, seq_len=16, batch=2, layers=1)
STEPS = 4


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("url"))
    files = {}
    for i, (n_rg, rows) in enumerate([(4, 60), (3, 50)]):
        local = os.path.join(tmp, f"shard{i}.parquet")
        write_fineweb_shard(local, n_rg, rows, seed=i + 21)
        with open(local, "rb") as f:
            files[shard_path(i)] = f.read()
    hub = TestHub(files)
    hub.start()
    broken = TestHub(files)                  # lists fine, then every file read answers 404
    broken.fail_resolve_status = 404
    broken.start()
    tiny = os.path.join(tmp, "tiny.txt")
    with open(tiny, "w", encoding="utf-8") as f:
        f.write("Too short.\n")
    specs = {
        # the real corpus (daisy/corpus/builtin.txt): HF_HUB_OFFLINE makes the route serve it
        "builtin": {"HF_HUB_OFFLINE": "1"},
        "fineweb": {"HF_ENDPOINT": hub.endpoint},
        "tiny": {"HF_HUB_OFFLINE": "1", "DAISY_DATA_BUILTIN": tiny},
        "broken": {"HF_ENDPOINT": broken.endpoint},
    }
    servers = {}
    try:
        for name, env in specs.items():
            servers[name] = DataServer(tmp, name, env)
        deadline = time.monotonic() + 45
        for s in servers.values():
            s.wait_up(deadline)
        yield dict(tmp=tmp, hub=hub, servers=servers)
    finally:
        for s in servers.values():
            s.stop()
        hub.stop()
        broken.stop()


def json_lines(r):
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.parametrize("peers", ["2", "3"])
def test_builtin_batches_over_http_print_the_same_lines(world, peers):
    server = world["servers"]["builtin"]
    plain = train_cli("--peers", peers, "--stop-after", str(STEPS), *SMALL, "--json")
    remote = train_cli("--peers", peers, "--stop-after", str(STEPS), *SMALL, "--json", "--data-url", server.url)
    assert remote.returncode == 0, remote.stderr
    assert len(plain.stdout.splitlines()) == STEPS
    assert remote.stdout == plain.stdout, (remote.stdout, plain.stdout)
    info = server.get("/data/info").json()
    assert info["data_id"].startswith("builtin:")
    assert f"data: {info['data_id']} from {server.url}" in remote.stderr, remote.stderr


def test_human_output_is_the_same_too(world):
    server = world["servers"]["builtin"]
    plain = train_cli("--stop-after", "2", *SMALL)
    remote = train_cli("--stop-after", "2", *SMALL, "--data-url", server.url + "/")
    assert plain.returncode == remote.returncode == 0, remote.stderr
    assert remote.stdout == plain.stdout


class SourceBatches:
    """A BatchSource that calls DataSource.batch in this process (no HTTP)."""

    def __init__(self, source: DataSource, cfg: Config):
        self.source, self.cfg = source, cfg

    def get(self, step, slot):
        cfg = self.cfg
        return data.split_rows(self.source.batch(cfg.seed, step, slot, cfg.batch, cfg.seq_len).tokens, cfg.batch, cfg.seq_len)


def test_fineweb_batches_over_http_equal_the_in_process_source(world, tmp_path):
    hub, server = world["hub"], world["servers"]["fineweb"]
    remote = json_lines(r := train_cli("--peers", "2", "--stop-after", str(STEPS), *SMALL, "--json",
                                 "--data-url", server.url))
    source = DataSource(endpoint=hub.endpoint, cache_dir=str(tmp_path / "cache"), prefetch_steps=0)
    assert source.info()["source"] == "fineweb-edu"
    assert f"data: {source.data_id} from {server.url} (source fineweb-edu)" in r.stderr, r.stderr
    group = Group(SMALL_CFG, 2, SourceBatches(source, SMALL_CFG))
    local = [dict(zip(("step", "loss", "hashes"), group.step())) for _ in range(STEPS)]
    assert len(remote) == STEPS
    for want, got in zip(local, remote):
        assert got == want, f"step {want['step']}: --data-url {got} != in-process {want}"
    builtin = json_lines(train_cli("--peers", "2", "--stop-after", str(STEPS), *SMALL, "--json"))
    assert builtin[0]["hashes"] != remote[0]["hashes"]            # it did read other data


def test_http_batches_prefetch_and_equal_get_batch(world):
    """HttpBatches gives get_batch's bits; after serving step s it has asked for s+1, s+2."""
    stream = data.builtin_stream()
    cfg = Config(seed=1234, batch=4, seq_len=16)
    batches = HttpBatches(cfg, base=world["servers"]["builtin"].url, ahead=2)
    try:
        for step in range(3):
            for slot in range(2):
                x, y = batches.get(step, slot)
                wx, wy = data.get_batch(stream, 1234, step, slot, 4, 16)
                assert_same_bits(x, wx, f"x step {step} slot {slot}")
                assert_same_bits(y, wy, f"y step {step} slot {slot}")
        ahead = sorted(batches.inflight)
        assert ahead == [(3, 0), (3, 1), (4, 0), (4, 1)], ahead         # bounded: 2 steps x 2 slots
    finally:
        batches.close()


def test_unreachable_server_exits_2(world):
    r = train_cli("--stop-after", "1", *SMALL, "--data-url", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 2 and "cannot reach the data server at http://127.0.0.1:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_http_error_shows_the_servers_message(world):
    # a corpus too short for one row: the route answers 503 with its reason; the CLI says it
    r = train_cli("--stop-after", "1", *SMALL, "--data-url", world["servers"]["tiny"].url)
    assert r.returncode == 2, r.stdout
    assert "the data server answered HTTP 503 to /data/batch" in r.stderr, r.stderr
    assert "at least seq_len+1 = 17 needed" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # not a DaisyChain server at that path
    r = train_cli("--stop-after", "1", *SMALL, "--data-url", world["servers"]["builtin"].url + "/nothing")
    assert r.returncode == 2 and "answered HTTP 404 to /data/info" in r.stderr, r.stderr


def test_data_id_mismatch_and_flag_errors(world):
    url = world["servers"]["builtin"].url
    r = train_cli("--stop-after", "1", *SMALL, "--data-url", url, "--data-id", "HuggingFaceFW/other@x")
    assert r.returncode == 2 and "not HuggingFaceFW/other@x (--data-id)" in r.stderr, r.stderr
    info = world["servers"]["builtin"].get("/data/info").json()
    r = train_cli("--stop-after", "1", *SMALL, "--data-url", url, "--data-id", info["data_id"], "--json")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r.stderr
    for args, needle in ((["--data", "x.parquet", "--data-url", url], "not both"),
                         (["--data-id", "x"], "give --data-url too"),
                         (["--data-url", "127.0.0.1:7860"], "must be an http:// or https:// URL")):
        r = train_cli("--stop-after", "1", *args)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)


def test_a_server_that_switches_data_mid_run_stops_the_run(world):
    """The hub fails after the listing: the server falls back to the built-in corpus while the
    run started on the FineWeb-Edu data id. The run stops (exit 2) instead of mixing corpora."""
    server = world["servers"]["broken"]
    r = train_cli("--stop-after", "2", *SMALL, "--json", "--data-url", server.url)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "the data changed under the run" in r.stderr, r.stderr
    assert "hub failed while streaming" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""
