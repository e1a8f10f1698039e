"""The stream store with its metadata in PostgreSQL, a real server the tests start on 127.0.0.1: the same
behaviour as SQLite's (streams, uploads, trims, deletes, recovery after a crash), a commit whose answer
was lost is not applied twice, and a pg_database restart in the middle of an upload loses nothing."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from enginekit import MemoryStore, abandon, small_store_config
from stratalog.chaos.postgres import PostgresServer
from stratalog.engine import StreamStore
from stratalog.engine.metadata import Metadata, NewObject
from stratalog.engine.metadata_backends import (
    MetadataFullError,
    MetadataUnavailableError,
    PostgresBackend,
    postgres_schema,
)
from stratalog.engine.objformat import BlockEntry
from stratalog.engine.sink_markers import partition_marker_key, sink_marker_key
from stratalog.errors import OutOfSpaceError
from waiting import wait_until

pytest_plugins = ["pgkit"]


@pytest.fixture(params=["sqlite", "postgres"])
def metadata(request: pytest.FixtureRequest) -> str | None:
    """Where a store's metadata lives: None (the data directory's SQLite file) or a PostgreSQL URI."""
    if request.param == "sqlite":
        return None
    uri: str = request.getfixturevalue("pg_database")
    return uri


def _open(path: Path, objects: MemoryStore, metadata: str | None, **overrides: object) -> StreamStore:
    return StreamStore.open(path, objects, small_store_config(**overrides), metadata=metadata)


def test_schema_in_postgres_words() -> None:
    schema = postgres_schema("CREATE TABLE t (a INTEGER PRIMARY KEY, b INTEGER NOT NULL) WITHOUT ROWID;")
    assert schema == "CREATE TABLE t (a BIGINT PRIMARY KEY, b BIGINT NOT NULL);"


def test_streams_uploads_trims_and_deletes_read_back_the_same(tmp_path: Path, metadata: str | None) -> None:
    objects = MemoryStore()
    with _open(tmp_path, objects, metadata) as store:
        orders = store.create_stream("orders", retention_ms=86_400_000)
        clicks = store.create_stream("clicks")
        store.create_streams(["a", "b"])
        with pytest.raises(ValueError, match="exists already"):
            store.create_stream("orders")
        with pytest.raises(ValueError, match="exists already"):
            store.create_streams(["c", "orders"])
        for i in range(30):
            orders.append([f"o{i}".encode()]).result()
            clicks.append([f"c{i}".encode()]).result()
        store.flush()
        orders.trim(10)
        store.flush()
        store.delete_stream(clicks)
        assert [s.name for s in store.streams()] == ["orders", "a", "b"]
    with _open(tmp_path, objects, metadata) as store:
        orders = store.open_stream("orders")
        assert [r.value for r in orders.fetch(10)] == [f"o{i}".encode() for i in range(10, 30)]
        assert [s.name for s in store.streams()] == ["orders", "a", "b"]
        assert store.create_stream("d").stream_id == 5


def test_recovery_after_a_crash_replays_what_metadata_does_not_hold(tmp_path: Path, metadata: str | None) -> None:
    objects = MemoryStore()
    store = _open(tmp_path, objects, metadata)
    s = store.create_stream("s")
    for i in range(20):
        s.append([f"{i}".encode()]).result()
    store.flush()                        # 0..19 in objects and committed
    for i in range(20, 35):
        s.append([f"{i}".encode()]).result()
    abandon(store)                       # 20..34 only in the WAL
    with _open(tmp_path, objects, metadata) as store:
        assert [r.value for r in store.open_stream("s").fetch(0)] == [f"{i}".encode() for i in range(35)]


def test_a_commit_retried_after_its_answer_was_lost_is_applied_once(pg_database: str) -> None:
    meta = Metadata(pg_database)
    try:
        stream = meta.create_stream("s")
        block = BlockEntry(stream.stream_id, 0, 5, 0, 100, 5, 1, 7)
        obj = NewObject(meta.allocate_object_id(), "data/x", 100, [block])
        seq = meta.commit_objects([obj])
        assert meta.commit_objects([obj]) == seq                 # the retry finds it in and changes nothing
        assert meta.stream(stream.stream_id).committed_end_offset == 5
        assert len(meta.ranges(stream.stream_id, 0)) == 1
    finally:
        meta.close()


def test_a_database_restart_during_an_upload_loses_nothing(tmp_path: Path, pg_server: PostgresServer,
                                                           pg_database: str, caplog: pytest.LogCaptureFixture) -> None:
    objects = MemoryStore()
    # Enough attempts, backing off, to outlast a restart.
    config = {"upload_attempts_max": 12, "upload_backoff_s": 0.05}
    with _open(tmp_path, objects, pg_database, **config) as store:
        s = store.create_stream("s")
        for i in range(50):
            s.append([f"{i}".encode()]).result()
        pg_server.stop()
        flushed = threading.Event()
        failure: list[BaseException] = []

        def flush() -> None:
            try:
                store.flush()
            except BaseException as e:   # reported below
                failure.append(e)
            flushed.set()

        caplog.set_level(logging.WARNING, logger="stratalog")
        flusher = threading.Thread(target=flush)
        flusher.start()
        wait_until(lambda: "failed (attempt" in caplog.text, "an upload step failing on the stopped database")
        assert not flushed.is_set(), "nothing is committed while the pg_database is down"
        pg_server.start()
        flusher.join(timeout=120)
        assert flushed.is_set() and not failure, failure
        s.append([b"after"]).result()
    with _open(tmp_path, objects, pg_database, **config) as store:
        values = [r.value for r in store.open_stream("s").fetch(0)]
        assert values == [f"{i}".encode() for i in range(50)] + [b"after"]


def test_an_unreachable_database_is_a_clear_error_and_frees_the_directory(tmp_path: Path) -> None:
    with pytest.raises(MetadataUnavailableError, match="cannot reach the metadata database"):
        StreamStore.open(tmp_path, MemoryStore(), small_store_config(),
                         metadata="postgresql://nobody:x@127.0.0.1:9/none?connect_timeout=2")
    StreamStore.open(tmp_path, MemoryStore(), small_store_config()).close()   # the lock was let go


def test_a_full_database_disk_is_an_out_of_space_error_and_the_connection_goes_on(
        pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's "disk full" (SQLSTATE 53100) is MetadataFullError, which a store takes as "refuse
    appends until space is back" rather than as a failure that stops it; the next statement works."""
    import psycopg

    meta = Metadata(pg_database)
    try:
        backend = meta._db
        assert isinstance(backend, PostgresBackend)
        real_connect = backend._connect
        full = [True]

        def connect() -> Any:
            conn = real_connect()
            if not full[0]:
                return conn

            class Full:
                def __getattr__(self, name: str) -> Any:
                    return getattr(conn, name)

                def execute(self, *args: Any) -> Any:
                    full[0] = False
                    raise psycopg.errors.DiskFull("could not extend file: No space left on device")
            return Full()

        monkeypatch.setattr(backend, "_connect", connect)
        with pytest.raises(MetadataFullError, match="free space") as raised:
            meta.create_stream("refused")
        assert isinstance(raised.value, OutOfSpaceError)
        assert meta.create_stream("taken").name == "taken"
    finally:
        meta.close()


def test_a_deleted_stream_takes_its_sinks_markers_and_no_others(tmp_path: Path, metadata: str | None) -> None:
    """Names that a LIKE pattern could confuse with "a_b/1" (an underscore matches any character, SQLite's
    LIKE ignores case, a longer topic ends the same way) keep their markers."""
    names = ["a_b/1", "aXb/1", "A_B/1", "xa_b/1", "a_b/10"]
    with _open(tmp_path, MemoryStore(), metadata) as store:
        streams = {n: store.create_stream(n) for n in names}
        for sink in ("copy", "c:9"):
            for batch, name in enumerate(names):
                store.metadata.set_meta(partition_marker_key(sink, name), batch)
        store.metadata.set_meta(sink_marker_key("copy"), 7)
        store.delete_stream(streams["a_b/1"])
        assert store.metadata.get_meta(partition_marker_key("copy", "a_b/1"), -1) == -1
        assert store.metadata.get_meta(partition_marker_key("c:9", "a_b/1"), -1) == -1
        kept = {(sink, n): store.metadata.get_meta(partition_marker_key(sink, n), -1)
                for sink in ("copy", "c:9") for n in names[1:]}
        assert kept == {(sink, n): i + 1 for sink in ("copy", "c:9") for i, n in enumerate(names[1:])}
        assert store.metadata.get_meta(sink_marker_key("copy"), -1) == 7
        again = store.create_stream("a_b/1")   # made again under the same name: no sink's batch counts as done
        assert again.stream_id != streams["a_b/1"].stream_id
        assert store.metadata.get_meta(partition_marker_key("copy", "a_b/1"), -1) == -1
