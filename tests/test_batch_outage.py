"""daisy/batch_source.py HttpBatches against a real HTTP server on loopback that goes away and
comes back on the same port (the twin of tests/js/batch_outage.test.mjs, docs/ARCHITECTURE.md
"Server outage"): the batch arrives once it is back and the outage is reported both ways; a
proxy's 503 (no code) is waited out; past the bound the error names the outage; an answer whose
code says retrying cannot help (a changed data id, a refused parameter) is not retried, while
the app's own 503 (code data_unavailable) is retried a bounded number of times, not waited on."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from daisy.batch_source import BatchError, HttpBatches
from daisy.config import Config

CFG = Config(seed=0, batch=2, seq_len=16, steps=100)
BODY = (np.arange(CFG.batch * (CFG.seq_len + 1)) % 250).astype("<u2").tobytes()
DATA_ID = "builtin-test"


class Server:
    """A data server on `port` (0: a free one); answer() -> (status, data id, JSON body or None,
    or the batch's bytes instead of BODY)."""

    def __init__(self, port=0, answer=lambda: (200, DATA_ID, None)):
        self.calls = 0

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.calls += 1
                status, data_id, body = answer()
                payload = body if isinstance(body, bytes) else BODY if status == 200 else json.dumps(body).encode() if body is not None else b"Bad Gateway"
                self.send_response(status)
                self.send_header("X-Daisy-Data-Id", data_id)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.allow_reuse_address = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def batches(port, **opts):
    events = []
    opts = {"data_id": DATA_ID, "ahead": 0, **opts}
    return HttpBatches(CFG, base=f"http://127.0.0.1:{port}", on_outage=lambda down, why: events.append((down, why)), **opts), events


def test_the_server_stopped_and_started_again_the_batch_arrives_and_the_outage_is_reported_both_ways():
    first = Server()
    port = first.port
    source, events = batches(port)
    try:
        x, _ = source.get(0, 0)
        assert x[0, 1] == 1
        first.close()
        pending = source.pool.submit(source.get, 1, 0)
        time.sleep(1.2)                                        # down across several retries
        assert [down for down, _ in events] == [True], events
        second = Server(port)
        try:
            again, _ = pending.result(timeout=10)
            assert np.array_equal(again, x)                    # the server's one body
            assert [down for down, _ in events] == [True, False] and source.down is None, events
        finally:
            second.close()
    finally:
        source.close()


def test_a_proxy_503_without_a_code_is_waited_out_like_a_refused_connection():
    server = Server(answer=lambda: (503, "", None) if server.calls <= 3 else (200, DATA_ID, None))
    source, events = batches(server.port)
    try:
        source.get(0, 0)
        assert server.calls == 4 and events == [(True, "HTTP 503"), (False, None)], (server.calls, events)
    finally:
        source.close()
        server.close()


def test_past_the_bound_the_error_names_the_outage():
    server = Server()
    port = server.port
    server.close()
    source, _ = batches(port, outage_s=0.8)
    t0 = time.monotonic()
    try:
        with pytest.raises(BatchError, match=r"the data server did not answer for 1 s \(.+\): no batch for step 1") as e:
            source.get(0, 0)
        assert e.value.code == "unreachable" and time.monotonic() - t0 >= 0.8
    finally:
        source.close()


@pytest.mark.parametrize("answer, code, calls", [
    ((200, "builtin-other", None), "data_changed", 1),
    ((400, DATA_ID, {"error": "seq_len must be ...", "code": "bad_parameter", "parameter": "seq_len"}), "bad_parameter", 1),
    ((503, DATA_ID, {"error": "built-in corpus unreadable", "code": "data_unavailable"}), "data_unavailable", 3),
])
def test_the_answers_code_decides_the_retry_never_its_words(answer, code, calls):
    server = Server(answer=lambda: answer)
    source, events = batches(server.port)
    try:
        with pytest.raises(BatchError) as e:
            source.get(0, 0)
        assert e.value.code == code and server.calls == calls and events == [], (e.value, server.calls, events)
        if code == "data_changed":
            assert "the server now serves builtin-other, the run trains on builtin-test" in str(e.value)
    finally:
        source.close()
        server.close()


def test_a_token_outside_the_vocabulary_is_a_bad_answer():
    """The twin of batch_source.js's check, in the same words: token 257 (VOCAB_SIZE) is refused."""
    tokens = np.frombuffer(BODY, dtype="<u2").copy()
    tokens[5] = 257
    server = Server(answer=lambda: (200, DATA_ID, tokens.tobytes()))
    source, _ = batches(server.port, retries=0)
    try:
        with pytest.raises(BatchError, match=r"^the data route sent token 257, outside the vocabulary$") as e:
            source.get(0, 0)
        assert e.value.code == "bad_answer"
    finally:
        source.close()
        server.close()


def test_one_fetches_the_batch_alone_no_prefetch_no_wait_counted():
    """one(step, slot) (an audit of another slot's past step, the twin of batch_source.js's):
    exactly one request, nothing held, no wait counted; get() prefetches its slot's next steps."""
    server = Server()
    source, _ = batches(server.port, ahead=3)
    try:
        x, _ = source.one(5, 1)
        assert x.shape == (CFG.batch, CFG.seq_len)
        assert server.calls == 1 and not source.inflight and not source.waits_s
        source.get(10, 0)
        deadline = time.monotonic() + 5
        while server.calls < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.calls == 5, server.calls                 # step 10 and the next 3 of its slot
        # held: the prefetches not yet asked for; get() forgets its slot's steps at or before its own
        source.get(2, 1)
        source.get(20, 0)
        assert sorted(source.inflight) == [(3, 1), (4, 1), (5, 1), (21, 0), (22, 0), (23, 0)], sorted(source.inflight)
    finally:
        source.close()
        server.close()
