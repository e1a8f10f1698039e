"""The uploader: durable records of the log cache become one run object, then the WAL is trimmed.

Two halves: :func:`plan_upload`, pure, says how the taken records' messages lay out as an object (each
queue's messages contiguous, queues in id order: docs/formats/queues.md); :class:`Uploader` does the I/O
(allocating the object's id, writing it a slice at a time, committing it in metadata, publishing the
queue manifest, trimming the WAL), each step retried with backoff before the store stops.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from stratalog.engine.metadata import Metadata, NewObject
from stratalog.engine.store import StoreFailedError
from stratalog.engine.upkeep import with_retries
from stratalog.errors import OutOfSpaceError
from stratalog.invariant import invariant
from stratalog.io import libc
from stratalog.objects.store import ObjectStore, made_ahead, put_parts
from stratalog.queues.config import QueueConfig
from stratalog.queues.format import I64, Ids, ObjectParts, U32s, lay_out_object
from stratalog.queues.logcache import CachedRecord, LogCache
from stratalog.queues.manifest import QueueObjectRef, last_manifest_seq, publish_manifest
from stratalog.queues.objects import RunObject, queue_object_key
from stratalog.queues.writer import Writer
from stratalog.wal import WriteAheadLog

log = logging.getLogger("stratalog.queues")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class UploadPlan:
    """How records' messages lay out as one run object (see :func:`lay_out_object`)."""

    prev_ends: U32s                   # the streams' ends in the objects before it
    stream_count: int
    first_stream: int                 # the first stream the object names
    names: list[tuple[int, str]]      # (id, name) of streams first_stream .. stream_count - 1
    streams: Ids                      # the streams with messages here, ascending
    counts: Ids                       # each one's messages here
    order: Ids                        # the messages (of the records joined) in the object's order
    messages: Any                     # the records' messages, one Arrow chunk per record


def plan_upload(taken: Sequence[CachedRecord], prev_ends: U32s) -> UploadPlan:
    """The layout of ``taken`` (consecutive records of the log cache, oldest first) as the object after
    those whose streams' ends are ``prev_ends``. No I/O."""
    # The records' runs in stream order. At a million queues a run is about one message, so each of these
    # arrays is as long as the upload's messages and fresh memory: each goes once done with (together
    # they set an upload's peak beside the log cache).
    stream_ids = np.concatenate([r.stream_ids for r in taken])
    order = np.argsort(stream_ids, kind="stable")
    s_ids = stream_ids[order]
    del stream_ids
    s_counts = np.concatenate([r.counts for r in taken])[order]
    shift = np.cumsum([0] + [len(r.message_at) - 1 for r in taken[:-1]])
    run_starts = np.concatenate([r.first_msg[:-1] + s for r, s in zip(taken, shift, strict=True)])[order]
    total = int(s_counts.sum())
    ahead = np.zeros(len(s_counts), I64)
    np.cumsum(s_counts[:-1], out=ahead[1:])
    run_starts -= ahead
    del ahead
    perm = np.repeat(run_starts, s_counts)
    del run_starts
    perm += np.arange(total, dtype=I64)     # (in place: each message-long temporary is fresh memory)
    groups = np.flatnonzero(np.concatenate(([True], s_ids[1:] != s_ids[:-1]))) if total else np.zeros(0, I64)
    unique = s_ids[groups]
    del s_ids
    per_stream = np.add.reduceat(s_counts, groups) if len(groups) else s_counts
    del s_counts
    first_runs = order[groups]
    del order, groups
    stream_count = taken[-1].stream_count
    prev = np.zeros(stream_count, I64)
    prev[:len(prev_ends)] = prev_ends
    before = prev[unique]
    bases = np.concatenate([r.base_offsets for r in taken])[first_runs]
    invariant(bool(np.all(bases == before)), "a queue's runs must follow its uploaded end")
    del bases, before, first_runs, prev
    names = list(itertools.chain.from_iterable(r.names for r in taken))
    first_stream = len(prev_ends)
    invariant(list(map(_first, names)) == list(range(first_stream, stream_count)), "names cover new streams")
    # A take per slice of streams gathers straight from the records into the object's runs: no merged copy
    # first, and at most a slice of the object in memory at once.
    messages = pa.chunked_array([r.messages() for r in taken], type=pa.binary())
    return UploadPlan(prev_ends, stream_count, first_stream, names, unique, per_stream, perm, messages)


class Uploader:
    """Uploads of the log cache; the queue manifest. :attr:`lock` (the upload lock) serializes every change
    of the objects: uploads, a merge's commit, and each manifest publish after one."""

    def __init__(self, config: QueueConfig, objects: ObjectStore, meta: Metadata, wal: WriteAheadLog,
                 log_cache: LogCache, writer: Writer, uploaded: threading.Event) -> None:
        self._config = config
        self._objects = objects
        self._meta = meta
        self._wal = wal
        self._cache = log_cache
        self._writer = writer
        self._uploaded = uploaded
        self.lock = threading.Lock()
        #: The time :meth:`due` compares the writer's times (time.monotonic) with: a test sets a clock that
        #: runs ahead, to see uploads by time come when they should without waiting for them.
        self.clock: Callable[[], float] = time.monotonic
        # The queue manifest readers without this process use (Spark); published under the lock.
        self._manifest_seq = last_manifest_seq(objects)

    def due(self) -> bool:
        """Whether the log cache should go to an object now: enough of it, a pause in the puts, its oldest
        record old enough, or a writer waiting for room."""
        config = self._config
        cache = self._cache
        records = cache.view.records
        now = self.clock()
        return bool(records) and (cache.upload_wanted or cache.cache_bytes >= config.upload_bytes_threshold
                                  or now - self._writer.last_write >= config.upload_idle_s
                                  or now - records[0].written_at >= config.upload_interval_s)

    def upload(self, *, everything: bool = False) -> int:
        """Merge the durable records of the log cache (``everything``: all of them, and keep the WAL) into
        one object; return the messages uploaded."""
        with self.lock:
            view = self._cache.view
            taken: list[CachedRecord] = []
            for rec in view.records:
                if not everything and not rec.future.done():
                    break
                if rec.future.done() and rec.future.exception() is not None:
                    raise StoreFailedError(f"a WAL write failed: {rec.future.exception()}")
                taken.append(rec)
            if not taken:
                return 0
            obj, ends, positions = self._write_object(plan_upload(taken, view.index.last_ends()))
            self._cache.uploaded(taken, obj, ends, positions)
            self.publish_manifest()
            self._uploaded.set()
            last = taken[-1].wal_offset
            if last > self._wal.trim_offset and not everything:
                self._wal.trim(last)
            return int(sum(int(r.counts.sum()) for r in taken))

    def _write_object(self, plan: UploadPlan) -> tuple[RunObject, U32s, U32s]:
        object_id = self.with_retries("allocating an object id", self._meta.allocate_object_id)
        key = queue_object_key(object_id)
        config = self._config

        def write() -> ObjectParts:
            # Laid out again on a retry: a failed write may have taken some of the parts.
            laid = lay_out_object(plan.prev_ends, plan.stream_count, plan.first_stream, plan.names, plan.streams,
                                  plan.counts, plan.messages, plan.order, config.upload_slice_bytes)
            # Each slice laid out while the one before is written; on a failed write the slice being made
            # is waited for and the rest given up here, before a retry lays the object out again.
            with contextlib.closing(made_ahead(laid.parts, "stratalog-queue-lay-out")) as parts:
                put_parts(self._objects, key, parts, sync_every_bytes=config.upload_sync_bytes,
                          size_hint=laid.size_bytes)
            return laid

        laid = self.with_retries(f"writing object {key}", write)
        size = laid.size_bytes
        ends, positions, pages = laid.ends, laid.positions, laid.pages
        if pages is None:
            raise AssertionError("an object's page CRCs are known once its parts are written")
        del laid
        self.with_retries("committing the upload",
                          lambda: self._meta.commit_objects([NewObject(object_id, key, size, [])]))
        libc.return_freed_memory()
        return RunObject(object_id, key, self.open_reader(key), size, pages, int(positions[-1])), ends, positions

    def publish_manifest(self) -> None:
        """Publish the live objects as the queue manifest. Called under :attr:`lock` (uploads and merges, the
        only changes to the objects, hold it) after the view changed, so manifests go out in the order of
        the changes. A few dozen keys per publish: cheap next to the upload it follows."""
        view = self._cache.view
        self._manifest_seq += 1
        seq = self._manifest_seq
        stream_count = view.index.stream_counts[-1] if view.index.stream_counts else 0
        refs = [QueueObjectRef(o.key, o.size_bytes) for o in view.objects]
        self.with_retries("publishing the queue manifest",
                          lambda: publish_manifest(self._objects, seq, stream_count, refs))

    def open_reader(self, key: str) -> Any:
        """A reader of the object's file (a local object store), or None: ranged gets through the store."""
        opener = getattr(self._objects, "open_reader", None)
        return opener(key) if callable(opener) else None

    def with_retries(self, what: str, step: Callable[[], _T]) -> _T:
        """``step()`` retried with backoff; a step out of room fails at once (the store refuses puts and
        tries the upload again later: QueueStore._uploader_loop)."""
        return with_retries(what, step, attempts=self._config.upload_attempts_max,
                            backoff_s=self._config.upload_backoff_s, log=log, never_on=(OutOfSpaceError,))


_first = operator.itemgetter(0)
