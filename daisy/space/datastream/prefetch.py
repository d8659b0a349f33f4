"""The server's prefetch of the next steps' row groups.

Prefetch. Serving batch (seed, step, slot, ...) queues the same (seed, slot) at steps
step+1..step+PREFETCH_STEPS (env DAISY_DATA_PREFETCH_STEPS, 0 = off) for one background worker
thread, which reads the row groups those batches need into the caches. The queue is bounded
(PREFETCH_QUEUE keys; when full, new keys are dropped and counted), keys already queued are not
queued twice, and a request never waits for the worker: it only enqueues. A peer that asks for
its batches in step order thus finds the next step's row group cached. Fetches lock per row
group (cache.py KeyLocks), so different row groups download in parallel (a peer's own prefetch
of its next batches, HttpBatches, thereby overlaps several hub round trips).
"""
import queue
import threading
from typing import Callable

from daisy.space.datastream.fallback import Fallback, describe_hub_error
from daisy.space.datastream.keys import U32_MAX

PREFETCH_STEPS = 2                # steps ahead whose row groups a batch request warms
PREFETCH_QUEUE = 64               # most batch keys waiting for the prefetch worker


class Prefetcher:
    """One background thread that reads the row groups of the next steps' batches into the
    caches (this module's docstring). Bounded queue, no key queued twice, never blocks.
    pick_row_group(seed, step, slot) -> (shard, rg) is the batch rule (DataSource's)."""

    def __init__(self, sources: Fallback, pick_row_group: Callable[[int, int, int], tuple[int, int]], steps: int):
        self.sources, self.pick_row_group, self.steps = sources, pick_row_group, steps
        self.queue: queue.Queue = queue.Queue(PREFETCH_QUEUE)
        self.pending: set = set()            # keys queued or being warmed
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.n = {"queued": 0, "fetched": 0, "cached": 0, "dropped": 0, "errors": 0}
        self.last_error: str | None = None

    def after_batch(self, seed: int, step: int, slot: int) -> None:
        """Batch (seed, step, slot) was served: warm the same slot's next steps."""
        for ahead in range(1, self.steps + 1):
            if step + ahead <= U32_MAX:
                self.offer((seed, step + ahead, slot))

    def offer(self, key: tuple) -> None:
        with self.lock:
            if key in self.pending:
                return
            try:
                self.queue.put_nowait(key)
            except queue.Full:
                self.n["dropped"] += 1           # a slow hub: the request path fetches it later
                return
            self.pending.add(key)
            self.n["queued"] += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="daisy-data-prefetch", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            key = self.queue.get()
            try:
                self._warm(key)
            except Exception as exc:     # the request path falls back; here we only count it
                with self.lock:
                    self.n["errors"] += 1
                    self.last_error = describe_hub_error(exc)
            finally:
                with self.lock:
                    self.pending.discard(key)
                self.queue.task_done()

    def _warm(self, key: tuple) -> None:
        sources = self.sources
        if not sources.active.remote:
            return
        shard, rg = self.pick_row_group(*key)
        if sources.is_cached(shard, rg):
            outcome = "cached"
        else:
            sources.row_group_tokens(shard, rg)
            outcome = "fetched"
        with self.lock:
            self.n[outcome] += 1

    def idle(self) -> bool:
        with self.lock:
            return not self.pending

    def counts(self) -> dict:
        with self.lock:
            return {"steps": self.steps, "pending": len(self.pending), **self.n,
                    "last_error": self.last_error}
