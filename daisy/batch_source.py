"""Where a slot's batch for a step comes from (twin of frontend_js/batch_source.js):
    StreamBatches(stream, cfg)    daisy.data.get_batch on a token stream (the CLI, tests)
    HttpBatches(cfg, base=..., ...)   a DaisyChain server's GET /data/batch?seed&step&slot&batch&seq_len
                                  (daisy/space/datastream/source.py): little-endian uint16, (B, T+1) row-major
get(step, slot) -> x (B, T), y (B, T) int64 token ids of the batch (cfg.seed, step, slot).

HttpBatches asks for the next `ahead` steps of a slot in the background (a pool of PREFETCH_WORKERS
threads: at most that many requests in flight; answers kept until taken, earlier steps dropped),
so a step never waits on the network once the pipeline is full. A failed fetch is retried
`retries` times, unless retrying cannot help (the BatchError's code: a changed data id, a
parameter the server refused). The server unreachable (no connection, a proxy's 502/503/504 with
no answer of the app behind it) is retried with backoff for up to `outage_s`, then fails naming
the outage; `on_outage(down, why)` is told when that starts and ends (docs/ARCHITECTURE.md
"Server outage"). Every batch must carry the run's data id (X-Daisy-Data-Id) when one is given:
a server that switched corpora mid-run stops the run instead of silently changing the data.
close() ends the pool (the JS twin has no threads; its close() only forgets what is in flight).
"""
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import data
from .tokenizer import VOCAB_SIZE

PREFETCH_STEPS = 4          # steps ahead of the one served (bench/bench_data_prefetch.py: 2 still
                            # waited ~0.2 s per 30 steps on a 100 ms hub, 4 waited ~0)
PREFETCH_WORKERS = 4        # at most this many batch requests in flight (Python only: threads)
HTTP_TIMEOUT_S = 60         # a cold FineWeb-Edu row group can take a while on a slow hub
DATA_WAIT_S = 60            # bound on waiting for an unreachable data server (= DATA_WAIT_MS)
BACKOFF_S = (0.25, 0.5, 1.0, 2.0)   # then every 2 s: peers resume within 2 s of each other
UNREACHABLE_STATUS = frozenset({502, 503, 504})

# BatchError codes (= frontend_js/batch_source.js BATCH_ERRORS); the server's answers carry the
# last two in their JSON `code` (daisy/space/datastream/errors.py ERROR_CODES)
UNREACHABLE, DATA_CHANGED, BAD_ANSWER, BAD_PARAMETER, DATA_UNAVAILABLE = (
    "unreachable", "data_changed", "bad_answer", "bad_parameter", "data_unavailable")
NOT_RETRIED = frozenset({DATA_CHANGED, BAD_PARAMETER})   # the same request gets the same answer


class BatchError(data.DataError):
    """A batch cannot be had; `code` says which kind (above), the message says why."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class StreamBatches:
    """Batches of a token stream in memory, by daisy.data.get_batch."""

    def __init__(self, stream: np.ndarray, cfg):
        self.stream, self.cfg = stream, cfg

    def get(self, step: int, slot: int):
        cfg = self.cfg
        return data.get_batch(self.stream, cfg.seed, step, slot, cfg.batch, cfg.seq_len)

    def one(self, step: int, slot: int):
        return self.get(step, slot)

    def close(self) -> None:
        pass


def data_info(base: str, timeout_s: float = HTTP_TIMEOUT_S) -> dict:
    """GET {base}/data/info (the CLI asks once, before a run; the page has the run's data id
    from its leader) -> the JSON; BatchError when the server cannot be reached or is not ours."""
    base = base.rstrip("/")
    try:
        with urllib.request.urlopen(base + "/data/info", timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = " ".join(e.read().decode("utf-8", "replace").split())[:200] or e.reason
        raise BatchError(BAD_ANSWER, f"the data server answered HTTP {e.code} to /data/info: {text}") from None
    except (urllib.error.URLError, OSError) as e:
        raise BatchError(UNREACHABLE, f"cannot reach the data server at {base}: "
                                      f"{getattr(e, 'reason', None) or e}") from None
    except ValueError:
        raise BatchError(BAD_ANSWER, f"{base}/data/info did not answer JSON: is it a DaisyChain "
                                     f"server?") from None


class HttpBatches:
    """The Space's keyed batches over HTTP; see the module docstring."""

    def __init__(self, cfg, *, base: str, data_id: str | None = None, ahead: int = PREFETCH_STEPS,
                 retries: int = 2, outage_s: float = DATA_WAIT_S, on_outage=None,
                 timeout_s: float = HTTP_TIMEOUT_S, workers: int = PREFETCH_WORKERS):
        self.cfg, self.base, self.data_id = cfg, base.rstrip("/"), data_id
        self.ahead, self.retries, self.outage_s, self.on_outage = ahead, retries, outage_s, on_outage
        self.timeout_s = timeout_s
        self.down: str | None = None  # why the server is unreachable now, or None
        self.closed = False
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="daisy-batch")
        self.inflight = {}            # (step, slot) -> Future of (x, y)
        self.lock = threading.Lock()
        self.waits_s: list[float] = []  # per get(): time the caller waited for its batch

    def url(self, step: int, slot: int) -> str:
        cfg = self.cfg
        q = urllib.parse.urlencode(dict(seed=cfg.seed, step=step, slot=slot, batch=cfg.batch, seq_len=cfg.seq_len))
        return f"{self.base}/data/batch?{q}"

    def set_down(self, why: str | None) -> None:
        """The server is (un)reachable: tell on_outage on each change."""
        if (why is None) == (self.down is None):
            return
        self.down = why
        if self.on_outage is not None:
            try:
                self.on_outage(why is not None, why)
            except Exception as e:    # a listener's failure is its own, never the batch's
                print(f"daisy: on_outage failed: {e!r}", file=sys.stderr)

    def _answer(self, step: int, slot: int):
        """One request -> (x, y); BatchError with its code otherwise."""
        B, T = self.cfg.batch, self.cfg.seq_len
        try:
            with urllib.request.urlopen(self.url(step, slot), timeout=self.timeout_s) as r:
                got_id, body = r.headers.get("X-Daisy-Data-Id"), r.read()
                reason = r.headers.get("X-Daisy-Fallback-Reason")
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            try:
                answer = json.loads(text)
            except ValueError:
                answer = None
            code = answer.get("code") if isinstance(answer, dict) else None
            if code is None and e.code in UNREACHABLE_STATUS:   # a proxy with no app behind it
                raise BatchError(UNREACHABLE, f"HTTP {e.code}") from None
            message = (answer.get("error") if isinstance(answer, dict) else None) or " ".join(text.split())[:200] or e.reason
            raise BatchError(code or BAD_ANSWER, f"the data server answered HTTP {e.code} to /data/batch: {message}") from None
        except (urllib.error.URLError, OSError) as e:   # no connection, a cut body, a timeout
            raise BatchError(UNREACHABLE, str(getattr(e, "reason", None) or e)) from None
        if self.data_id is not None and got_id != self.data_id:
            raise BatchError(DATA_CHANGED, f"the data changed under the run: the server now serves {got_id}, "
                                           f"the run trains on {self.data_id}" + (f" ({reason})" if reason else ""))
        if len(body) != 2 * B * (T + 1):
            raise BatchError(BAD_ANSWER, f"the data route sent {len(body)} bytes for a batch, expected {2 * B * (T + 1)}")
        tokens = np.frombuffer(body, dtype="<u2")
        outside = tokens[tokens >= VOCAB_SIZE]
        if outside.size:
            raise BatchError(BAD_ANSWER, f"the data route sent token {int(outside[0])}, outside the vocabulary")
        return data.split_rows(tokens, B, T)

    def fetch_batch(self, step: int, slot: int):
        """(x, y) of (step, slot): retries and the outage wait of the module docstring."""
        last, down_since, waits, attempt = None, None, 0, 0
        while attempt <= self.retries and not self.closed:
            try:
                out = self._answer(step, slot)
                self.set_down(None)
                return out
            except BatchError as e:
                if e.code == UNREACHABLE:
                    down_since = down_since if down_since is not None else time.monotonic()
                    self.set_down(str(e))
                    if time.monotonic() - down_since >= self.outage_s:
                        raise BatchError(UNREACHABLE, f"the data server did not answer for {round(self.outage_s)} s "
                                                      f"({e}): no batch for step {step + 1}") from None
                    time.sleep(BACKOFF_S[min(waits, len(BACKOFF_S) - 1)])
                    waits += 1
                    continue
                self.set_down(None)
                last = e
                if e.code in NOT_RETRIED:
                    break
                attempt += 1
        raise last or BatchError(UNREACHABLE, f"the batch source was closed before step {step + 1}'s batch came")

    def _request(self, step: int, slot: int):
        # callers hold self.lock
        f = self.inflight.get((step, slot))
        if f is None:
            f = self.inflight[(step, slot)] = self.pool.submit(self.fetch_batch, step, slot)
        return f

    def get(self, step: int, slot: int):
        with self.lock:
            f = self._request(step, slot)
            for k in range(1, self.ahead + 1):
                if step + k < self.cfg.steps:
                    self._request(step + k, slot)
            # batches of this slot at or before this step are never asked for again
            for key in [key for key in self.inflight if key[1] == slot and key[0] <= step]:
                del self.inflight[key]
        t0 = time.perf_counter()
        try:
            return f.result()
        finally:
            self.waits_s.append(time.perf_counter() - t0)

    def one(self, step: int, slot: int):
        """The same batch alone: no prefetch of its slot's next steps, no wait counted (an audit's
        recomputation of another slot's past step; frontend_js/run/audits.js)."""
        with self.lock:
            f = self._request(step, slot)
            self.inflight.pop((step, slot), None)
        return f.result()

    def wait_summary(self) -> str:
        w = self.waits_s
        if not w:
            return "no batches fetched"
        return (f"{len(w)} batches, waited {sum(w) * 1e3:.0f} ms in all "
                f"(max {max(w) * 1e3:.0f} ms, first {w[0] * 1e3:.0f} ms)")

    def close(self) -> None:
        self.closed = True
        self.pool.shutdown(wait=False, cancel_futures=True)
