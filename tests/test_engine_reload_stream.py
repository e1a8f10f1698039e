"""StreamStore.reload_stream, against a real PostgreSQL: two stores share metadata and objects, as the
brokers of a cluster do, and a stream led by one and then by the other is served from the committed end
the metadata holds, whatever the second store held of it before."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from enginekit import MemoryStore, small_store_config
from stratalog.engine import StreamStore
from stratalog.engine.metadata import UnknownStreamError
from stratalog.engine.metadata_backends import Backend
from stratalog.engine.store import UnflushedStreamError
from stratalog.errors import StratalogError

pytest_plugins = ["pgkit"]


def _anyone(db: Backend, stream_ids: Sequence[int]) -> None:
    """A fence that lets every commit through: the stores share objects, so neither deletes the other's."""


def _open(path: Path, objects: MemoryStore, pg_database: str) -> StreamStore:
    return StreamStore.open(path, objects, small_store_config(), metadata=pg_database, fence=_anyone)


def _values(store: StreamStore, name: str) -> list[bytes]:
    return [r.value for r in store.open_stream(name).fetch(0, max_bytes=1 << 30)]


def test_a_stream_moves_between_stores_and_each_serves_it_from_the_committed_end(
        tmp_path: Path, pg_database: str) -> None:
    objects = MemoryStore()
    first = _open(tmp_path / "a", objects, pg_database)
    second = _open(tmp_path / "b", objects, pg_database)
    try:
        first.create_streams(["t/0"])
        with pytest.raises(UnknownStreamError):
            second.open_stream("t/0")          # made after the second store opened: unknown there
        first.open_stream("t/0").append([b"a0", b"a1"]).result()
        first.flush()

        moved = second.reload_stream("t/0")
        assert (moved.start_offset, moved.end_offset) == (0, 2)
        assert moved.append([b"b2"]).result() == 2
        second.flush()

        held = first.open_stream("t/0")          # a handle opened before the reload sees the new state
        assert held.end_offset == 2              # stale: the first store does not know of b2 yet
        back = first.reload_stream("t/0")
        assert held.end_offset == back.end_offset == 3
        assert back.append([b"a3"]).result() == 3
        first.flush()
        assert _values(first, "t/0") == [b"a0", b"a1", b"b2", b"a3"]
        second.reload_stream("t/0")
        assert _values(second, "t/0") == [b"a0", b"a1", b"b2", b"a3"]
    finally:
        first.close()
        second.close()


def test_a_stream_with_appends_not_committed_here_is_not_reloaded(tmp_path: Path, pg_database: str) -> None:
    objects = MemoryStore()
    store = _open(tmp_path / "a", objects, pg_database)
    try:
        stream = store.create_streams(["t/0"])[0]
        stream.append([b"only in the log cache"]).result()
        with pytest.raises(UnflushedStreamError):
            store.reload_stream("t/0")
        assert stream.end_offset == 1             # left as it was
        store.flush()
        assert store.reload_stream("t/0").end_offset == 1
    finally:
        store.close()


class _NotYoursError(StratalogError):
    pass


def test_retention_of_a_stream_another_writer_leads_is_left_to_it(tmp_path: Path, pg_database: str) -> None:
    objects = MemoryStore()
    leads: dict[str, set[int]] = {"a": set(), "b": set()}

    def fence(who: str) -> Callable[[Backend, Sequence[int]], None]:
        def check(db: Backend, stream_ids: Sequence[int]) -> None:
            if not set(stream_ids) <= leads[who]:
                raise _NotYoursError(f"{who} does not lead {sorted(stream_ids)}")
        return check

    first = StreamStore.open(tmp_path / "a", objects, small_store_config(), metadata=pg_database, fence=fence("a"))
    try:
        stream = first.create_streams(["t/0"])[0]
        leads["a"].add(stream.stream_id)
        first.set_retention(stream, retention_ms=None, retention_bytes=1)
        for i in range(3):
            stream.append([b"x" * 100, str(i).encode()]).result()
            first.flush()
        second = StreamStore.open(tmp_path / "b", objects, small_store_config(), metadata=pg_database,
                                  fence=fence("b"))
        try:
            second.apply_retention()                       # refused by the fence: left alone, store still up
            assert second.open_stream("t/0").start_offset == 0
            own = second.create_streams(["t/1"])[0]
            leads["b"].add(own.stream_id)
            own.append([b"still appending"]).result()
            second.flush()
            first.apply_retention()
            assert stream.start_offset == 6                # the leader applies it: every uploaded block goes
        finally:
            second.close()
    finally:
        first.close()
