"""The hub with the built-in corpus as its fallback.

Fallback. When the hub is offline (HF_HUB_OFFLINE=1), unreachable, answers an error, or lists
no parquet file, the source switches to the built-in corpus (daisy/corpus/builtin.txt, or env
DAISY_DATA_BUILTIN; its documents by daisy.data.corpus_documents, the CLI's rule). The switch
is sticky for the process so the whole group keeps seeing one corpus; every response says which
source served it (X-Daisy-Source, X-Daisy-Fallback-Reason, X-Daisy-Data-Id; /data/info `source`
and `reason`).
Peers must compare `data_id` before sharing batches.
"""
import threading

import numpy as np

from daisy.space.datastream.builtin_source import BuiltinSource
from daisy.space.datastream.errors import DataRequestError, DataUnavailable
from daisy.space.datastream.hub_source import HubSource


def hub_error_kind(exc: BaseException) -> str:
    """Which kind of hub failure exc is: offline, unreachable, hub_error, not_found or other."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    if isinstance(exc, OfflineModeIsEnabled):
        return "offline"
    if isinstance(exc, HfHubHTTPError):
        return "hub_error"
    if type(exc).__module__.startswith("httpx"):     # connection refused, DNS, timeouts
        return "unreachable"
    if isinstance(exc, FileNotFoundError):
        return "not_found"
    return "other"


def describe_hub_error(exc: BaseException) -> str:
    """One line saying why the hub could not serve: offline, unreachable, or an HTTP error."""
    msg = " ".join(str(exc).split())[:160]
    kind = hub_error_kind(exc)
    if kind == "offline":
        return "offline: HF_HUB_OFFLINE is set"
    if kind == "hub_error":
        return f"hub error: HTTP {exc.response.status_code}"
    if kind == "unreachable":
        return f"unreachable: {type(exc).__name__}: {msg}"
    if kind == "not_found":
        return f"not found: {msg}"
    return f"{type(exc).__name__}: {msg}"


# what a fallback means, in words for the page (/data/info `summary`); the detail is `reason`
FALLBACK_SUMMARIES = {
    "offline": "the Space runs offline (HF_HUB_OFFLINE): using the built-in corpus",
    "unreachable": "the Hub could not be reached: using the built-in corpus",
    "hub_error": "the Hub answered with an error: using the built-in corpus",
    "not_found": "FineWeb-Edu was not found on the Hub: using the built-in corpus",
    "other": "the Hub could not serve FineWeb-Edu: using the built-in corpus",
}


class Fallback:
    """The hub (HubSource) with the built-in corpus (BuiltinSource) as its fallback, a switch made
    once and kept for the process. Answers the sources' interface (data_id, num_shards,
    num_row_groups, is_cached, row_group_tokens) on whichever is active; serve(pick) runs a keyed
    request there."""

    def __init__(self, hub: HubSource, builtin: BuiltinSource):
        self.hub, self.builtin = hub, builtin
        self.active: HubSource | BuiltinSource = hub
        self.reason: str | None = None       # why it fell back, once it did (the detail)
        self.summary: str | None = None      # what that means (FALLBACK_SUMMARIES)
        self.setup_lock = threading.Lock()   # guards setup and the switch to builtin
        self.ready = False

    # -- setup and the switch ---------------------------------------------------------------
    def start(self) -> None:
        """Resolve the revision and list the shards now, in the background, so the first peer's
        request does not pay for it (requests that come earlier wait for the same setup)."""
        threading.Thread(target=self.ensure_ready, name="daisy-data-setup", daemon=True).start()

    def ensure_ready(self) -> None:
        if self.ready:
            return
        with self.setup_lock:
            if self.ready:
                return
            try:
                self.hub.open()
            except Exception as exc:        # any hub failure: serve the built-in corpus
                self._fall_back(exc, describe_hub_error(exc))
            self.ready = True

    def _fall_back(self, exc: BaseException, reason: str) -> None:
        # callers hold self.setup_lock
        self.active, self.reason = self.builtin, reason
        self.summary = FALLBACK_SUMMARIES[hub_error_kind(exc)]
        self.hub.memory.clear()              # hub arrays are no use any more

    def serve(self, pick):
        """Run pick() on the active source; on a hub failure switch to builtin and retry once."""
        self.ensure_ready()
        if self.active is self.hub:
            try:
                return pick()
            except (DataRequestError, DataUnavailable):
                raise
            except Exception as exc:
                with self.setup_lock:
                    if self.active is self.hub:
                        self._fall_back(exc, "hub failed while streaming: " + describe_hub_error(exc))
        return pick()

    # -- the active source's shape and tokens -----------------------------------------------
    @property
    def data_id(self) -> str:
        return self.active.data_id

    def num_shards(self) -> int:
        self.ensure_ready()
        return self.active.num_shards()

    def num_row_groups(self, shard: int) -> int:
        self.ensure_ready()
        return self.active.num_row_groups(shard)

    def is_cached(self, shard: int, rg: int) -> bool:
        """Whether row group rg of shard is in memory or on disk (no hub read needed)."""
        return self.active.is_cached(shard, rg)

    def row_group_tokens(self, shard: int, rg: int) -> np.ndarray:
        """The token stream of one row group (callers validate shard and rg)."""
        return self.active.row_group_tokens(shard, rg)
