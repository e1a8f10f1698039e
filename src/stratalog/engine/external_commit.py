"""The commit of objects written outside the store (a Spark write's staged objects) at the ends of its
streams, while appends to other streams go on: see :meth:`StreamStore.commit_external_objects`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stratalog.engine.core import StoreCore
from stratalog.engine.errors import StoreFailedError
from stratalog.engine.log_cache import StreamState
from stratalog.engine.metadata import NewObject
from stratalog.engine.uploads import Uploads
from stratalog.errors import WALFailedError
from stratalog.invariant import invariant


def commit_external_objects(core: StoreCore, uploads: Uploads, stream_ids: Sequence[int],
                            place: Callable[[dict[int, int]], Sequence[NewObject]],
                            marker: tuple[str, int] | None) -> int | None:
    """Fence the streams (their appends wait), upload what they hold, place the objects at their ends in
    one metadata transaction, publish, and let appends go on after them."""
    core.check_open()
    with core.upload_lock, core.commit_lock:
        with core.cond:
            fenced = [core.streams[i] for i in sorted(set(stream_ids)) if i in core.streams]
            if len(fenced) != len(set(stream_ids)):
                raise ValueError(f"unknown streams {sorted(set(stream_ids) - core.streams.keys())}")
            for st in fenced:
                st.fenced = True
            last = core.last_wal_future
        try:
            if last is not None:
                last.result()  # everything appended before the fence is durable...
            uploads.upload_held(trim_wal=True)  # ...and now in objects
            return _place(core, fenced, place, marker)
        except WALFailedError as e:
            core.fail(e)
            raise StoreFailedError(f"the store stopped after an error: {e}") from e
        finally:
            with core.cond:
                for st in fenced:
                    st.fenced = False
                core.cond.notify_all()


def _place(core: StoreCore, fenced: list[StreamState], place: Callable[[dict[int, int]], Sequence[NewObject]],
           marker: tuple[str, int] | None) -> int | None:
    """The commit itself, with the fenced streams' log caches empty (upload_lock and commit_lock held)."""
    marker_key, marker_value = marker if marker is not None else (None, 0)
    if marker_key is not None and core.meta.get_meta(marker_key, -1) >= marker_value:
        return None
    with core.lock:
        for st in fenced:
            invariant(not st.cache and st.next_offset == st.committed_end,
                      "a fenced stream holds appends that were not uploaded")
        ends = {st.stream_id: st.next_offset for st in fenced}
    objects = place(ends)
    touched = {b.stream_id for o in objects for b in o.blocks}
    if not touched <= ends.keys():
        raise ValueError(f"objects place blocks in streams {sorted(touched - ends.keys())}, which "
                         "were not fenced")
    seq = core.meta.commit_external_objects(objects, marker_key, marker_value)
    if seq is None:
        return None
    metas = core.meta.streams_by_id(sorted(touched))
    with core.lock:
        for sm in metas:
            st = core.streams[sm.stream_id]
            st.committed_end = st.next_offset = st.durable_end = sm.committed_end_offset
    core.cold_rows.invalidate()
    core.publish(metas, objects)
    return seq
