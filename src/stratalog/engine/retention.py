"""Trims, retention and the replacement of objects: what removes data from a stream's start, and what
deletes objects once nothing has referred to them for ``object_grace_s``."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from stratalog.engine.core import StoreCore
from stratalog.engine.errors import OffsetOutOfRangeError
from stratalog.engine.log_cache import StreamState
from stratalog.engine.metadata import NewObject
from stratalog.errors import StratalogError

log = logging.getLogger("stratalog.engine")


class Retention:
    """The store's trims, retention, object replacement (compaction's primitive) and object deletion."""

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        #: For /metrics: compactions committed here, and the objects they replaced.
        self.compactions = 0
        self.objects_compacted = 0

    def trim(self, st: StreamState, new_start: int) -> None:
        core = self._core
        core.check_open()
        if new_start > st.durable_end:
            raise OffsetOutOfRangeError(f"cannot trim stream {st.stream_id} to {new_start}: its end is "
                                        f"{st.durable_end}")
        if new_start <= st.start_offset:
            return
        with core.commit_lock:
            core.meta.trim_stream(st.stream_id, new_start)
            with core.lock:
                st.start_offset = max(st.start_offset, new_start)
            core.publish([core.meta.stream(st.stream_id)])

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Apply each stream's time and byte retention to uploaded data, then delete objects past their
        grace. Returns the number of objects deleted."""
        core = self._core
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        for sm in core.meta.streams():
            if sm.retention_ms is None and sm.retention_bytes is None:
                continue
            new_start = sm.start_offset
            blocks = [b for b in core.meta.ranges_by_time(sm.stream_id) if b[0] > sm.start_offset]
            kept_bytes = sum(b[2] for b in blocks)
            for end, max_ts, size in blocks:
                too_old = sm.retention_ms is not None and max_ts < now_ms - sm.retention_ms
                too_big = sm.retention_bytes is not None and kept_bytes > sm.retention_bytes
                if not (too_old or too_big):
                    break
                new_start = end
                kept_bytes -= size
            st = core.streams.get(sm.stream_id)
            if st is not None and new_start > sm.start_offset:
                self._trim_retained(st, new_start)
        return self.delete_unreferenced(now_ms)

    def _trim_retained(self, st: StreamState, new_start: int) -> None:
        if not self._core.shared_objects:
            self.trim(st, new_start)
            return
        try:
            self.trim(st, new_start)
        except StratalogError as e:
            # Shared metadata: the fence lets each writer trim only the streams it leads (a broker of a
            # cluster, its partitions); the others' retention is theirs to apply.
            log.debug("retention of stream %d left to its writer: %s", st.stream_id, e)

    def delete_unreferenced(self, now_ms: int | None = None) -> int:
        """Delete objects that nothing has referred to for ``object_grace_s``."""
        core = self._core
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        gone = core.meta.collect_unreferenced(now_ms - int(core.config.object_grace_s * 1000))
        for obj in gone:
            core.objects.delete(obj.key)  # metadata first (already done), object after
            core.blocks.drop_object(obj.key)
            core.meta.forget_object(obj.object_id)
        return len(gone)

    def replace_objects(self, old_object_ids: Sequence[int], new_objects: Sequence[NewObject]) -> int:
        """Compaction's primitive: swap objects in metadata atomically; old ones go after the grace period."""
        core = self._core
        with core.commit_lock:
            seq = core.meta.replace_objects(old_object_ids, new_objects)
            core.cold_rows.invalidate()
            core.publish([], snapshot=True)
            self.compactions += 1
            self.objects_compacted += len(old_object_ids)
        return seq
