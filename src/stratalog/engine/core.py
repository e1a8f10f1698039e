"""What the stream store's parts share: its locks, its streams, the log cache, the WAL, the metadata, and
the steps every part takes (the open/closed checks, stopping on a failure, retries, publishing a manifest).

The parts (appends.py, reads.py, uploads.py, retention.py, external_commit.py, recovery.py) each hold
the one ``StoreCore`` the facade (store.py) makes; none holds another part except where it calls it.

Locks, always taken in this order: ``upload_lock`` (one upload at a time, and what must not overlap one),
``commit_lock`` (a metadata commit through its manifest's publication, so manifests go out in commit
order), ``lock`` (the streams' offsets and the log cache; ``cond`` wakes appenders and the uploader).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

from stratalog.engine.blockcache import BlockCache
from stratalog.engine.cold_reads import RangeRowCache
from stratalog.engine.config import StoreConfig
from stratalog.engine.errors import StoreClosedError, StoreFailedError
from stratalog.engine.log_cache import LogCache, StreamState
from stratalog.engine.manifest import ManifestPublisher
from stratalog.engine.metadata import Metadata, NewObject, StreamMeta
from stratalog.engine.upkeep import with_retries
from stratalog.errors import OutOfSpaceError, StratalogError
from stratalog.free_space import SpaceGuard
from stratalog.objects.store import ObjectStore
from stratalog.wal.protocol import WAL

log = logging.getLogger("stratalog.engine")

_T = TypeVar("_T")


class StoreCore:
    """The state the store's parts share (see the module's docstring for its locks)."""

    def __init__(self, config: StoreConfig, meta: Metadata, objects: ObjectStore, wal: WAL, blocks: BlockCache,
                 space: SpaceGuard, manifest: ManifestPublisher, *, manifest_stale: bool,
                 shared_objects: bool) -> None:
        self.config = config
        self.meta = meta
        self.objects = objects
        self.wal = wal
        self.blocks = blocks
        self.space = space
        #: Other writers share the object store and the metadata (a broker of a cluster): objects unknown
        #: to metadata may be theirs, and the metadata's fence refuses changes to streams led elsewhere.
        self.shared_objects = shared_objects
        self.cold_rows = RangeRowCache(meta, config.range_rows_streams_max, config.range_rows_per_query)
        self.upload_lock = threading.Lock()
        self.commit_lock = threading.RLock()
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.streams: dict[int, StreamState] = {}
        self.by_name: dict[str, int] = {}
        self.cache = LogCache()
        #: An appender asked for an upload now (the log cache or the WAL is full).
        self.upload_wanted = False
        self.closing = False
        self.closed = False
        self.failure: BaseException | None = None
        #: The newest append's WAL future: once it completes, everything appended before is durable.
        self.last_wal_future: Future[int] | None = None
        self._manifest = manifest
        # After a failed publication the chain of deltas has a hole: the next one is a snapshot.
        self._manifest_stale = manifest_stale

    def add_state(self, sm: StreamMeta) -> StreamState:
        """Serve the stream ``sm`` from its committed end (lock held, or before the store is shared)."""
        st = StreamState(sm.stream_id, sm.name, sm.start_offset, sm.committed_end_offset,
                         sm.committed_end_offset, sm.committed_end_offset)
        self.streams[sm.stream_id] = st
        if sm.name is not None:
            self.by_name[sm.name] = sm.stream_id
        return st

    # Open, closed, failed ---------------------------------------------------------------------------

    def check_not_closed(self) -> None:
        if self.closed:
            raise StoreClosedError("the store is closed")

    def check_open(self) -> None:
        if self.failure is not None:
            raise StoreFailedError(f"the store stopped after an error: {self.failure}") from self.failure
        if self.closing or self.closed:
            raise StoreClosedError("the store is closed")

    def fail(self, error: BaseException) -> None:
        log.error("the store stopped: %s", str(error))
        with self.cond:
            self.stop_locked(error)

    def stop_locked(self, error: BaseException) -> None:
        """Record the first failure and wake every waiter (lock held)."""
        if self.failure is None:
            self.failure = error
        self.cond.notify_all()

    # Steps around object storage --------------------------------------------------------------------

    def with_retries(self, what: str, step: Callable[[], _T]) -> _T:
        """``step()`` retried with backoff; a step out of room fails at once (see uploads.py)."""
        config = self.config
        return with_retries(what, step, attempts=config.upload_attempts_max, backoff_s=config.upload_backoff_s,
                            log=log, retry_s_min=config.upload_retry_s_min, backoff_s_max=config.upload_backoff_s_max,
                            never_on=(OutOfSpaceError,))

    @property
    def manifest_stale(self) -> bool:
        return self._manifest_stale

    def publish(self, streams: Sequence[StreamMeta], objects: Sequence[NewObject] = (),
                snapshot: bool = False) -> None:
        """Publish the manifest for the latest commit: a delta, or a snapshot when one is due (commit_lock
        held, since the commit).

        Best effort: the commit already stands in metadata. After a failed publication the chain of
        deltas has a hole, so the next publication is a snapshot, which readers start from.
        """
        seq = self.meta.commit_seq
        snapshot = snapshot or self._manifest_stale or seq % self.config.manifest_snapshot_every == 0
        try:
            if snapshot:
                self.with_retries("publishing a manifest snapshot", lambda: self._manifest.snapshot(seq, self.meta))
            else:
                self.with_retries("publishing a manifest delta",
                                  lambda: self._manifest.delta(seq, streams, objects))
            self._manifest_stale = False
        except StratalogError as e:
            self._manifest_stale = True
            log.warning("publishing manifest %d failed; the next one will be a snapshot: %s", seq, str(e))
