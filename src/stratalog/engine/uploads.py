"""Uploads: the log cache's durable batches into objects, their ranges committed in metadata, the manifest
published, the batches dropped from memory and the WAL trimmed behind them.

The uploader thread uploads when asked (an appender found no room), when the log cache holds
``upload_bytes_threshold`` or its oldest batch is ``upload_interval_s`` old; it also applies retention
and checks free space. An upload that runs out of room does not stop the store: appends are refused
(SpaceGuard) and the upload is tried again every ``free_space_check_interval_s`` until it goes through.
Any other failure stops the store.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

from stratalog.engine.core import StoreCore
from stratalog.engine.errors import StoreFailedError
from stratalog.engine.log_cache import Taken
from stratalog.engine.metadata import NewObject
from stratalog.engine.objformat import ObjectBuilder, StreamBatch
from stratalog.errors import OutOfSpaceError, WALFailedError
from stratalog.objects.store import put_parts

DATA_PREFIX = "data/"

#: ``upload(everything=True)``: a WAL offset past any, so every batch in the log cache is taken.
_EVERY_WAL_OFFSET = 1 << 63


def object_key(object_id: int) -> str:
    return f"{DATA_PREFIX}{object_id:016x}.slo"


class Uploads:
    """The store's uploads and its uploader thread (see the module's docstring)."""

    def __init__(self, core: StoreCore, apply_retention: Callable[[], object]) -> None:
        self._core = core
        self._apply_retention = apply_retention
        self._last_retention = time.monotonic()
        #: After an upload ran out of room: no upload is tried before this (monotonic seconds).
        self._retry_at = 0.0
        self._thread = threading.Thread(target=self._loop, name="stratalog-uploader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        """Wait for the uploader thread, told to stop by ``core.closing``."""
        self._thread.join()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def flush(self) -> None:
        """Upload everything appended so far, commit it, and trim the WAL behind it."""
        core = self._core
        core.check_open()
        last = core.last_wal_future
        try:
            if last is not None:
                last.result()
            self.upload(trim_wal=True)
        except WALFailedError as e:
            core.fail(e)
            raise StoreFailedError(f"the store stopped after an error: {e}") from e

    def upload(self, *, trim_wal: bool, everything: bool = False) -> int:
        """Upload what the WAL holds durably; return the bytes uploaded. Serialized by ``upload_lock``."""
        with self._core.upload_lock:
            return self.upload_held(trim_wal=trim_wal, everything=everything)

    def upload_held(self, *, trim_wal: bool, everything: bool = False) -> int:
        """:meth:`upload`, with ``upload_lock`` held by the caller."""
        core = self._core
        with core.lock:
            durable = _EVERY_WAL_OFFSET if everything else core.wal.durable_offset
            cached = list(core.cache.streams.values())
            taken_at = time.monotonic()
        taken = core.cache.durable_prefixes(cached, durable)
        if not taken:
            return 0
        objects = self._write_objects(taken)
        with core.commit_lock:
            core.with_retries("committing the upload", lambda: core.meta.commit_objects(objects))
            self._after_commit(taken, objects)
        with core.cond:
            uploaded = core.cache.drop_uploaded(taken, taken_at)
            core.cond.notify_all()
        if trim_wal:
            last_wal = max(entries[-1].wal_offset for _, entries in taken)
            if last_wal > core.wal.trim_offset:
                core.wal.trim(last_wal)
                with core.cond:
                    core.cond.notify_all()  # appenders waiting for WAL room
        return uploaded

    def _write_objects(self, taken: Taken) -> list[NewObject]:
        """One object for each stream with ``stream_object_bytes_min`` or more, one for all the others."""
        core = self._core
        groups: list[Taken] = []
        shared: Taken = []
        for st, entries in taken:
            if sum(len(e.data) for e in entries) >= core.config.stream_object_bytes_min:
                groups.append([(st, entries)])
            else:
                shared.append((st, entries))
        if shared:
            groups.append(shared)
        written: list[NewObject] = []
        for group in groups:
            builder = ObjectBuilder()
            for st, entries in group:
                builder.add_stream(st.stream_id, [StreamBatch(e.base_offset, e.count, e.max_timestamp_ms, e.data)
                                                  for e in entries])
            parts = builder.finish_parts()
            size_bytes = sum(len(part) for part in parts)
            object_id = core.with_retries("allocating an object id", core.meta.allocate_object_id)
            key = object_key(object_id)
            core.with_retries(f"writing object {key}", functools.partial(put_parts, core.objects, key, parts))
            written.append(NewObject(object_id, key, size_bytes, builder.entries))
        return written

    def _after_commit(self, taken: Taken, objects: list[NewObject]) -> None:
        core = self._core
        # Data trimmed while it waited for upload is now in objects below the start: drop it at once.
        for st, _ in taken:
            if st.start_offset > st.committed_end:
                core.meta.trim_stream(st.stream_id, st.start_offset)
        core.publish(core.meta.streams_by_id([st.stream_id for st, _ in taken]), objects)

    # The uploader thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        core = self._core
        config = core.config
        space_check_s = config.free_space_check_interval_s
        next_space_check = time.monotonic() + space_check_s
        while True:
            with core.cond:
                while not core.closing:
                    now = time.monotonic()
                    upload_at = max(self._due_at(now), self._retry_at)
                    if now >= min(upload_at, next_space_check):
                        break
                    core.cond.wait(min(upload_at, next_space_check) - now)
                if core.closing:
                    return
                upload = time.monotonic() >= upload_at
                if upload:
                    core.upload_wanted = False
            if time.monotonic() >= next_space_check:
                core.space.check()
                next_space_check = time.monotonic() + space_check_s
            if not upload:
                continue
            try:
                self.upload(trim_wal=True)
                core.space.objects_ok()
                if time.monotonic() - self._last_retention >= config.retention_interval_s:
                    self._last_retention = time.monotonic()
                    self._apply_retention()
            except OutOfSpaceError as e:
                core.space.objects_full(e)
                self._retry_at = time.monotonic() + space_check_s
            except BaseException as e:
                core.fail(e)
                return

    def _due_at(self, now: float) -> float:
        """When the uploader should upload next (lock held): now when asked or when the log cache holds
        upload_bytes_threshold; else when its oldest entry is upload_interval_s old, or retention is due,
        whichever comes first."""
        core = self._core
        config = core.config
        cache = core.cache
        if core.upload_wanted or cache.size_bytes >= config.upload_bytes_threshold:
            return now
        due = self._last_retention + config.retention_interval_s
        if cache.streams and cache.oldest is not None:
            due = min(due, cache.oldest + config.upload_interval_s)
        return due
