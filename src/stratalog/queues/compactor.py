"""The compactor: which run objects merge and when, the merge's I/O and commit, and the deletion of what
it replaced once no get can be reading it. How a merge lays out its pieces is compaction.py's; where it
runs (a worker process with a local object store, else a thread of the store) is merge_worker.py's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Iterator

import numpy as np

from stratalog.engine.metadata import Metadata, NewObject
from stratalog.errors import OutOfSpaceError, StratalogError
from stratalog.io import libc
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStore, put_parts
from stratalog.queues.compaction import (
    MergePlan,
    MergeResult,
    MergeSource,
    idle_merge_start,
    merge_piece,
    plan_merge,
    tier_merge_start,
)
from stratalog.queues.config import QueueConfig
from stratalog.queues.format import U32, U32s
from stratalog.queues.lifecycle import Lifecycle
from stratalog.queues.logcache import LogCache
from stratalog.queues.merge_worker import MergeCancelledError, MergeJob, run_merge_job
from stratalog.queues.objects import RunObject, object_order, queue_object_key
from stratalog.queues.pending import PendingPuts
from stratalog.queues.reader import Reader
from stratalog.queues.uploader import Uploader
from stratalog.queues.writer import Writer

log = logging.getLogger("stratalog.queues")


class CompactionCancelledError(Exception):
    """The store is closing: a merge in progress stops (its object is never committed)."""


class Compactor:
    """Merges of the store's objects, one at a time, from one thread (the store's compactor thread)."""

    def __init__(self, *, config: QueueConfig, objects: ObjectStore, meta: Metadata, log_cache: LogCache,
                 uploader: Uploader, writer: Writer, reader: Reader, pending: PendingPuts,
                 lifecycle: Lifecycle) -> None:
        self._config = config
        self._objects = objects
        self._meta = meta
        self._cache = log_cache
        self._uploader = uploader
        self._writer = writer
        self._reader = reader
        self._pending = pending
        self._lifecycle = lifecycle
        self._in_worker = config.compact_in_worker and type(objects) is LocalDirStore
        # Merged-away objects wait here (monotonic time retired, object) until no get can hold them; under
        # the log cache's lock.
        self._retired: list[tuple[float, RunObject]] = []
        #: The time the idle decisions (:meth:`writing`, a store at rest) compare the writer's times
        #: (time.monotonic) with: a test sets a clock that stands still or runs ahead, to see the store
        #: busy or idle whatever the machine's load makes of real time.
        self.clock: Callable[[], float] = time.monotonic
        self._rest_gets = 0             # the reader's count of gets when the compactor last saw it change
        self._rest_since = self.clock()
        #: A close stopped a merge: its worker's temp file is left behind.
        self.merge_cancelled = False
        self.compactions = 0
        #: Of them, merges a store at rest made (QueueConfig.compact_idle_s).
        self.compactions_at_rest = 0
        self.compacted_bytes = 0
        self.merge_worker_peak_rss_bytes = 0
        #: What stopped merging (the objects stay as they are and reads go on), or None.
        self.compaction_error: BaseException | None = None
        #: Whether a merge may start now (the store says no while its disk is low).
        self.may_merge: Callable[[], bool] = lambda: True
        #: Looks the compactor has finished (returns of :meth:`work`): whoever must know that it has looked at
        #: the store since some moment waits for this to go up by two (a look may be under way at that moment).
        self.looks = 0

    @property
    def retiring(self) -> int:
        """Merged-away objects not yet deleted (a get in flight may still read them)."""
        return len(self._retired)

    def work(self) -> None:
        """What one wake of the compactor thread does: delete what is due, merge while a merge is due, and
        drop the spare files once nothing is being written. CompactionCancelledError once closing."""
        self.retire_due()
        while self.compaction_error is None and not self._lifecycle.closing:
            # A merge in a thread goes one at a time with uploads: their working sets (each a few hundred
            # MiB at a million queues) never add up, and producers wait for a merge that has fallen behind.
            # Merges in a thread beside uploads were measured: beside busy producers a merge gets the GIL a
            # few milliseconds at a time and falls behind (several times the objects after a long send).
            # A merge in the worker process has its own.
            self.let_uploads_go_first()
            if not self.may_merge() or not self.merge_once():
                break
            self.retire_due()
        if not self.writing():
            self.drop_spares()
        self.looks += 1

    def let_uploads_go_first(self) -> None:
        """Wait while an upload is due, until one is done: uploads and merges take turns. The upload lock is
        not fair: a compactor taking it again right after a merge kept a waiting uploader out for a whole
        read phase (368 MiB left in the log cache, every get of it through the log cache's index); and
        waiting for no upload to be due at all starved merges beside a busy writer."""
        cache = self._cache
        lifecycle = self._lifecycle
        with cache.lock:
            uploads = cache.uploads
            while self._uploader.due() and cache.uploads == uploads and not lifecycle.closing \
                    and lifecycle.failure is None:
                cache.lock.wait(0.1)

    def plan(self, objects: tuple[RunObject, ...]) -> tuple[int, int, bool] | None:
        """Objects ``first .. stop - 1`` and whether the store is at rest: ``compact_fanout`` consecutive
        merge units of one size tier within ``compact_merge_bytes_max`` (see tier_merge_start); but when the
        store is at rest, the newest units if there are two that may merge (see QueueConfig.compact_idle_s).
        A unit is an upload, or the pieces one merge made (they share its place), sized by their sum."""
        config = self._config
        fanout = config.compact_fanout
        if not fanout:
            return None
        units: list[tuple[int, int]] = []     # (first object, bytes)
        place = -1
        for k, obj in enumerate(objects):
            obj_place = object_order(obj.key, obj.object_id)[0]
            if obj_place != place:
                units.append((k, 0))
                place = obj_place
            units[-1] = (units[-1][0], units[-1][1] + obj.size_bytes)
        if self._at_rest():
            # First: a merge of the tiers' newest units would often be part of it, written twice.
            first = idle_merge_start([size for _, size in units], fanout, config.compact_idle_bytes_max)
            if first is not None:
                return units[first][0], len(objects), True
        u = tier_merge_start([size for _, size in units], config.upload_bytes_threshold, fanout,
                             config.compact_merge_bytes_max)
        if u is None:
            return None
        stop = units[u + fanout][0] if u + fanout < len(units) else len(objects)
        return units[u][0], stop, False

    def _at_rest(self) -> bool:
        """No put and no get for compact_idle_s, and everything put is in objects. (A merge beside busy
        readers takes the CPU they are using, and at a million queues it does not end before they do.)"""
        now = self.clock()
        gets = self._reader.gets
        if gets != self._rest_gets:
            self._rest_gets, self._rest_since = gets, now
            return False
        idle = self._config.compact_idle_s
        return not self._cache.view.records and self._pending.empty() \
            and now - self._writer.last_write >= idle and now - self._rest_since >= idle

    def merge_once(self) -> bool:
        """Merge the objects the plan picks; False when there is nothing to merge. A merge in a thread
        holds the upload lock throughout; one in the worker process only to publish its result.

        The merged runs are cut by stream range into pieces of at most ``compact_object_bytes_max`` bytes
        (run positions are u32), each an object of its own, committed in one metadata transaction."""
        if not self._in_worker:
            with self._uploader.lock:
                return self._merge(in_worker=False)
        return self._merge(in_worker=True)

    def _merge(self, *, in_worker: bool) -> bool:
        # Only this thread removes objects from the view; uploads add them after the ones planned here.
        view = self._cache.view
        objects, index = view.objects, view.index
        plan = self.plan(objects)
        if plan is None:
            return False
        first, stop, at_rest = plan
        replaced = objects[first:stop]
        prev_ends = index.ends[:index.stream_counts[first - 1], first - 1].copy() if first else np.zeros(0, U32)
        sources = [MergeSource.open(o.key, functools.partial(o.read, self._objects), o.size_bytes) for o in replaced]
        merge = plan_merge(sources, prev_ends, self._config.compact_object_bytes_max)
        place = object_order(replaced[0].key, replaced[0].object_id)[0]
        started = time.monotonic()
        uploader = self._uploader
        keys: list[tuple[int, str]] = []
        for _ in merge.pieces:
            object_id = uploader.with_retries("allocating an object id", self._meta.allocate_object_id)
            keys.append((object_id, queue_object_key(object_id, place)))
        try:
            results = self._merge_in_worker(replaced, prev_ends, keys) if in_worker else self._merge_here(merge, keys)
        except (CompactionCancelledError, OutOfSpaceError):
            # The store is closing, or the merge's output did not fit. Pieces already written are committed
            # nowhere: they go now rather than at the next open (each may be gigabytes, and a store's size
            # read after close would count them; a full disk wants their room back).
            for _, key in keys:
                with contextlib.suppress(StratalogError):    # what stays goes at the next open
                    self._objects.delete(key)
            raise
        pieces = [(object_id, key, r) for (object_id, key), r in zip(keys, results, strict=True)]
        with uploader.lock if in_worker else contextlib.nullcontext():
            uploader.with_retries("committing the merge", lambda: self._meta.replace_objects(
                [o.object_id for o in replaced], [NewObject(i, key, r.size_bytes, []) for i, key, r in pieces]))
            merged = tuple(RunObject(object_id, key, uploader.open_reader(key), r.size_bytes, r.pages,
                                     int(r.positions[-1])) for object_id, key, r in pieces)
            self._cache.merged(first, stop, replaced, merged, [(r.ends, r.positions) for _, _, r in pieces])
            with self._cache.lock:
                now = time.monotonic()
                self._retired.extend((now, o) for o in replaced)
            # Readers planned on the previous manifest may still get the replaced objects for compact_retire_s.
            uploader.publish_manifest()
        self.compactions += 1
        self.compactions_at_rest += at_rest
        self.compacted_bytes += sum(r.size_bytes for _, _, r in pieces)
        log.info("merged %d queue objects (%d MiB) into %d in %.1f s%s%s", len(replaced),
                 sum(r.size_bytes for _, _, r in pieces) >> 20, len(pieces), time.monotonic() - started,
                 " (worker process)" if in_worker else "", " at rest" if at_rest else "")
        libc.return_freed_memory()
        return True

    def _merge_here(self, merge: MergePlan, keys: list[tuple[int, str]]) -> list[MergeResult]:
        results = []
        for p, (_, key) in enumerate(keys):
            result = MergeResult()

            def write(piece: int = p, key: str = key) -> None:
                nonlocal result
                result = MergeResult()
                put_parts(self._objects, key, self._unless_closing(
                    merge_piece(merge, piece, self._config.compact_slice_bytes, result)),
                    sync_every_bytes=self._config.upload_sync_bytes, size_hint=merge.piece_runs_bytes(piece))

            self._uploader.with_retries(f"writing merged object {key}", write)
            results.append(result)
        return results

    def _merge_in_worker(self, replaced: tuple[RunObject, ...], prev_ends: U32s,
                         keys: list[tuple[int, str]]) -> list[MergeResult]:
        assert isinstance(self._objects, LocalDirStore)
        config = self._config
        job = MergeJob(str(self._objects.root), tuple((o.key, o.size_bytes) for o in replaced), prev_ends,
                       tuple(key for _, key in keys), config.compact_object_bytes_max, config.compact_slice_bytes,
                       config.upload_sync_bytes)
        lifecycle = self._lifecycle
        try:
            answer = self._uploader.with_retries(f"merging into {keys[0][1]} in the worker process",
                                                 lambda: run_merge_job(job, lambda: lifecycle.closing))
        except MergeCancelledError:
            raise CompactionCancelledError from None
        self.merge_worker_peak_rss_bytes = max(self.merge_worker_peak_rss_bytes, answer.peak_rss_bytes)
        return answer.results

    def _unless_closing(self, parts: Iterator[bytes | memoryview]) -> Iterator[bytes | memoryview]:
        for part in parts:
            if self._lifecycle.closing:
                raise CompactionCancelledError
            yield part

    def retire_due(self, *, everything: bool = False) -> None:
        """Close and delete merged-away objects once no get can still be reading them: after
        compact_retire_s, or as soon as no get is in flight (every get then holds a newer view). A writer
        with no readers gets its spares at once (waiting compact_retire_s, half as many uploads found a
        spare to write over)."""
        quiet = everything or self._reader.no_get_in_flight()
        cutoff = math.inf if quiet else time.monotonic() - self._config.compact_retire_s
        with self._cache.lock:
            due = [o for t, o in self._retired if t <= cutoff]
            self._retired = [(t, o) for t, o in self._retired if t > cutoff]
        for obj in due:
            if obj.reader is not None:
                obj.reader.close()
            if isinstance(self._objects, LocalDirStore) and self._config.spare_bytes_max and self.writing():
                delete = functools.partial(self._objects.recycle, obj.key, self._config.spare_bytes_max)
            else:
                delete = functools.partial(self._objects.delete, obj.key)
            self._uploader.with_retries(f"deleting merged-away object {obj.key}", delete)
            self._meta.forget_object(obj.object_id)

    def writing(self) -> bool:
        """A put came within compact_idle_s: uploads and merges will follow, and spare files serve them."""
        return self.clock() - self._writer.last_write < self._config.compact_idle_s \
            and not self._lifecycle.closing

    def drop_spares(self) -> None:
        """Delete the spare files (see QueueConfig.spare_bytes_max): a store that is not being written needs
        none, and they take disk space."""
        if isinstance(self._objects, LocalDirStore):
            self._objects.drop_spares()

