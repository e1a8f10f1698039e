"""The stream engine through its public API: append, fetch, upload, reopen, trim, retention, crash points."""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginekit import MemoryStore, abandon, small_store_config
from stratalog.datadir import StoreLockedError
from stratalog.engine.blockcache import BlockCache
from stratalog.engine.manifest import read_manifest
from stratalog.engine.metadata import NewObject, UnknownStreamError
from stratalog.engine.objformat import ObjectBuilder, StreamBatch
from stratalog.engine.store import (
    DATA_PREFIX,
    BackpressureError,
    OffsetOutOfRangeError,
    StoreFailedError,
    StreamStore,
)
from stratalog.engine.uploads import Uploads
from stratalog.errors import StratalogError
from stratalog.io.faulty import MemDevice
from stratalog.kafka.records import encode_batch
from stratalog.records import NewRecord
from stratalog.wal.config import WALConfig
from waiting import WAIT_S, wait_until


def open_store(path: Path, mem: MemoryStore, **overrides: object) -> StreamStore:
    return StreamStore.open(path, mem, small_store_config(**overrides))


def values(records: list) -> list[bytes]:
    return [r.value for r in records]


def test_offsets_are_dense_per_stream_and_tail_reads_come_from_memory(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        a, b = store.create_stream("a"), store.create_stream("b")
        fa = [a.append([b"a%d" % i, b"a%d'" % i]) for i in range(50)]
        fb = [b.append([b"b%d" % i]) for i in range(30)]
        assert [f.result() for f in fa] == list(range(0, 100, 2))
        assert [f.result() for f in fb] == list(range(30))
        assert a.end_offset == 100 and b.end_offset == 30
        got = a.fetch(0, max_bytes=1 << 30)
        assert [r.offset for r in got] == list(range(100))
        assert got[3].value == b"a1'"
        assert mem.gets == 0, "tail reads touched object storage"


def test_flush_moves_data_to_objects_and_cold_reads_match(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        for i in range(200):
            s.append([NewRecord(b"v%d" % i, key=b"k%d" % i, timestamp_ms=1000 + i, headers=[("h", b"x")])])
        store.flush()
        assert any(k.startswith(DATA_PREFIX) for k in mem.objects)
        assert store.stats()["log_cache_bytes"] == 0
        got = s.fetch(150, 155)
        assert [(r.offset, r.key, r.value, r.timestamp_ms, r.headers) for r in got] == [
            (i, b"k%d" % i, b"v%d" % i, 1000 + i, (("h", b"x"),)) for i in range(150, 155)]
        assert mem.gets > 0


def _fetched_records(s: Any, pos: int) -> tuple[list[int], int]:
    """Stream.fetch from ``pos``: each record's number (its first 4 bytes) and the next offset to read."""
    batch = s.fetch(pos, max_bytes=200 << 10)
    assert all(r.value[4:] == bytes(range(256)) * 256 for r in batch)
    return [int.from_bytes(r.value[:4], "big") for r in batch], batch[-1].offset + 1


def _fetched_batches(s: Any, pos: int) -> tuple[list[int], int]:
    """The same through fetch_batches (the Kafka Fetch path): whole batches of one record each here."""
    batches = s.fetch_batches(pos, max_bytes=200 << 10)
    return [b.base_offset for b in batches], batches[-1].end_offset


@pytest.mark.parametrize("read", [_fetched_records, _fetched_batches], ids=["fetch", "fetch_batches"])
def test_sequential_cold_reads_read_ahead_within_the_block_cache_bound(tmp_path: Path, read: Any) -> None:
    mem = MemoryStore()
    cache_max = 5 << 19  # 2.5 MiB: two of the ~1 MiB data blocks and a bit
    with open_store(tmp_path, mem, block_cache_bytes_max=cache_max) as store:
        s = store.create_stream("s")
        value = bytes(range(256)) * 256  # 64 KiB
        for i in range(128):
            s.append([i.to_bytes(4, "big") + value])
            if i % 16 == 15:
                store.flush()
        data_bytes = sum(len(v) for k, v in mem.objects.items() if k.startswith(DATA_PREFIX))
        got: list[int] = []
        pos = 0
        while pos < s.end_offset:
            numbers, pos = read(s, pos)
            got.extend(numbers)
            assert store.stats()["block_cache_bytes"] <= cache_max
        assert got == list(range(128))  # record i is at offset i
        stats = store._core.blocks.stats
        assert stats.readahead_blocks > 0, "a sequential reader got no readahead"
        assert stats.fetched_bytes <= data_bytes * 1.1, "blocks fetched ahead were evicted before they were read"


def test_cold_reads_are_held_to_cold_read_bytes_per_s_max(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem, cold_read_bytes_per_s_max=4 << 20) as store:
        s = store.create_stream("s")
        for _ in range(16):
            s.append([b"x" * (128 << 10)])
        store.flush()
        s.fetch(0, max_bytes=1)  # the first fetch is never held: it starts the clock
        started = time.monotonic()
        pos, fetches = 1, 0
        while pos < s.end_offset:
            pos = s.fetch(pos, max_bytes=256 << 10)[-1].offset + 1
            fetches += 1
        # 15 x 128 KiB at 4 MiB/s: at least 0.47 s however fast the reads themselves are.
        assert fetches >= 7
        assert time.monotonic() - started >= 15 * (128 << 10) / (4 << 20) * 0.9
    with pytest.raises(ValueError, match="cold_read_bytes_per_s_max"):
        small_store_config(cold_read_bytes_per_s_max=0).validate()


def test_blocks_read_to_the_end_are_evicted_first(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        for i in range(4):
            s.append([bytes([i]) * (200 << 10)])
            store.flush()
        rows = store.metadata.ranges(s.stream_id, 0, limit=4)
        assert len(rows) == 4
        cache = BlockCache(mem, bytes_max=sum(r.size_bytes for r in rows[:3]))
        cache.get(rows[0])
        cache.get(rows[1])
        cache.release(rows[1])  # read to its end: goes before rows[0], although rows[0] is older
        cache.get(rows[2])
        cache.get(rows[3])
        gets = mem.gets
        cache.get(rows[0])
        assert mem.gets == gets, "an unread block was evicted before a released one"
        cache.get(rows[1])
        assert mem.gets == gets + 1
        cache.close()


def uploader_parked(store: StreamStore) -> bool:
    """Whether the store's uploader waits in its loop for something to come due: the innermost Python frame
    of its thread is Condition.wait (blocked on the lock inside it), called from the loop."""
    frame = sys._current_frames().get(store._uploads.thread.ident or -1)
    return (frame is not None and frame.f_code is threading.Condition.wait.__code__
            and frame.f_back is not None and frame.f_back.f_code is Uploads._loop.__code__)


def test_a_quiet_store_uploads_after_upload_interval(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem, upload_interval_s=0.2) as store:
        s = store.create_stream("s")
        # The uploader goes to sleep with nothing cached (until retention is due, an hour away): the first
        # append must wake it.
        wait_until(lambda: uploader_parked(store), "the uploader to wait with nothing cached")
        s.append([b"lonely"]).result()
        wait_until(lambda: not store.stats()["log_cache_bytes"], "a quiet store to upload its data")
        assert any(k.startswith(DATA_PREFIX) for k in mem.objects)


def test_fetch_respects_max_bytes_but_returns_at_least_one_record(tmp_path: Path) -> None:
    with open_store(tmp_path, MemoryStore()) as store:
        s = store.create_stream()
        s.append([b"x" * 1000] * 10).result()
        assert len(s.fetch(0, max_bytes=1)) == 1
        assert len(s.fetch(0, max_bytes=2500)) == 3
        store.flush()
        assert len(s.fetch(0, max_bytes=1)) == 1
        assert len(s.fetch(2, max_bytes=2500)) == 3


def test_fetch_batches_fit_max_bytes_whole_and_only_the_first_may_go_over(tmp_path: Path) -> None:
    # Batches of mixed sizes, the older half in objects and the rest in memory: whatever the start and
    # the bound, the batches returned are the longest run from the start's batch that fits max_bytes, or
    # that one batch alone when nothing fits and at_least_one asks for progress (Kafka's fetch rule).
    rng = random.Random(7)
    with open_store(tmp_path, MemoryStore()) as store:
        s = store.create_stream()
        for i in range(60):
            s.append([b"x" * rng.choice((10, 300, 2000, 9000))] * rng.randint(1, 3)).result()
            if i == 30:
                store.flush()
        every = s.fetch_batches(0, 1 << 30)
        sizes = [len(b.body) for b in every]
        assert len(every) == 60

        @settings(max_examples=300, deadline=None)
        @given(start=st.integers(0, s.end_offset - 1), max_bytes=st.integers(0, 40_000), at_least_one=st.booleans())
        def longest_run_that_fits(start: int, max_bytes: int, at_least_one: bool) -> None:
            first = next(i for i, b in enumerate(every) if b.end_offset > start)
            expected, used = [], 0
            for i in range(first, len(every)):
                used += sizes[i]
                if used > max_bytes and (expected or not at_least_one):
                    break
                expected.append(every[i].base_offset)
            got = s.fetch_batches(start, max_bytes, at_least_one=at_least_one)
            assert [b.base_offset for b in got] == expected

        longest_run_that_fits()


def test_fetch_outside_the_stream_is_a_clear_error(tmp_path: Path) -> None:
    with open_store(tmp_path, MemoryStore()) as store:
        s = store.create_stream()
        s.append([b"a", b"b"]).result()
        assert s.fetch(2) == []
        with pytest.raises(OffsetOutOfRangeError, match="outside"):
            s.fetch(3)
        with pytest.raises(UnknownStreamError):
            store.open_stream("missing")
        store.create_stream("x")
        with pytest.raises(ValueError, match="exists already"):
            store.create_stream("x")
        with pytest.raises(ValueError, match="at least one record"):
            s.append([])


def test_offset_for_timestamp_in_objects_and_in_memory(tmp_path: Path) -> None:
    with open_store(tmp_path, MemoryStore()) as store:
        s = store.create_stream()
        s.append([NewRecord(b"%d" % t, timestamp_ms=t) for t in (10, 20, 30)]).result()
        store.flush()
        s.append([NewRecord(b"%d" % t, timestamp_ms=t) for t in (40, 50)]).result()
        assert s.offset_for_timestamp(0) == 0
        assert s.offset_for_timestamp(20) == 1
        assert s.offset_for_timestamp(21) == 2
        assert s.offset_for_timestamp(45) == 4
        assert s.offset_for_timestamp(51) is None


def test_records_survive_reopen_with_and_without_upload(tmp_path: Path) -> None:
    mem = MemoryStore()
    store = open_store(tmp_path, mem)
    s = store.create_stream("s")
    s.append([b"uploaded"]).result()
    store.flush()
    s.append([b"in wal only"]).result()
    abandon(store)  # like a crash: the tail was never uploaded and is only in the WAL
    reopened = open_store(tmp_path, mem)
    assert reopened.recovery.batches_replayed == 1
    assert values(reopened.open_stream("s").fetch(0)) == [b"uploaded", b"in wal only"]
    reopened.close()


def test_a_second_process_cannot_open_the_same_directory(tmp_path: Path) -> None:
    with open_store(tmp_path, MemoryStore()), pytest.raises(StoreLockedError, match="another process"):
        open_store(tmp_path, MemoryStore())


def test_trim_hides_records_and_unreferenced_objects_are_deleted(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream()
        s.append([b"old"] * 10).result()
        store.flush()
        first_objects = {k for k in mem.objects if k.startswith(DATA_PREFIX)}
        s.append([b"new"] * 10).result()
        store.flush()
        s.trim(10)
        assert s.start_offset == 10
        with pytest.raises(OffsetOutOfRangeError):
            s.fetch(5)
        assert values(s.fetch(10, 12)) == [b"new", b"new"]
        assert store.delete_unreferenced() == 1
        assert not first_objects & set(mem.objects), "the trimmed object is still in the store"
        with pytest.raises(OffsetOutOfRangeError, match="its end"):
            s.trim(100)


def test_retention_by_bytes_and_time(tmp_path: Path) -> None:
    with open_store(tmp_path, MemoryStore()) as store:
        by_bytes = store.create_stream("bytes", retention_bytes=3300)  # three 1058-byte blocks
        by_time = store.create_stream("time", retention_ms=1000)
        for i in range(5):
            by_bytes.append([b"x" * 1000]).result()
            by_time.append([NewRecord(b"t", timestamp_ms=i * 1000)]).result()
            store.flush()  # one block per upload
        store.apply_retention(now_ms=4500)
        assert by_bytes.start_offset == 2, "kept more than retention_bytes"
        assert by_time.start_offset == 4, "kept records older than retention_ms"
        assert values(by_bytes.fetch(by_bytes.start_offset)) == [b"x" * 1000] * 3


def test_backpressure_when_uploads_fail(tmp_path: Path) -> None:
    class BrokenStore(MemoryStore):
        def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
            if key.startswith(DATA_PREFIX):
                raise StratalogError("object storage is down")
            super().put(key, data)

    store = open_store(tmp_path, BrokenStore(), append_wait_s_max=0.5, upload_attempts_max=1)
    s = store.create_stream()
    with pytest.raises((BackpressureError, StoreFailedError)):
        for _ in range(1000):
            s.append([b"x" * 10_000])
    store.close()


def test_crash_between_upload_and_commit_leaves_no_orphan_and_loses_nothing(tmp_path: Path) -> None:
    mem = MemoryStore()
    store = open_store(tmp_path, mem, upload_attempts_max=1)
    s = store.create_stream("s")
    offsets = [s.append([b"r%d" % i]).result() for i in range(20)]

    def crash(*_: object) -> int:
        raise StratalogError("killed between the object put and the metadata commit")

    store._core.meta.commit_objects = crash  # type: ignore[method-assign]
    with pytest.raises(StratalogError):
        store.flush()
    assert any(k.startswith(DATA_PREFIX) for k in mem.objects), "the object should have been written"
    store._core.failure = RuntimeError("crashed")
    store.close()
    reopened = open_store(tmp_path, mem)
    assert reopened.recovery.orphan_objects_deleted == 1
    assert values(reopened.open_stream("s").fetch(0)) == [b"r%d" % i for i in offsets]
    known = {o.key for o in reopened.metadata.objects()}
    assert {k for k in mem.objects if k.startswith(DATA_PREFIX)} == known
    reopened.close()


def test_crash_between_commit_and_wal_trim_replays_nothing_twice(tmp_path: Path) -> None:
    mem = MemoryStore()
    store = open_store(tmp_path, mem)
    s = store.create_stream("s")
    for i in range(20):
        s.append([b"r%d" % i]).result()

    def crash(_: int) -> None:
        raise StratalogError("killed after the commit, before the WAL trim")

    store._core.wal.trim = crash  # type: ignore[method-assign]
    with pytest.raises(StratalogError):
        store.flush()
    store._core.failure = RuntimeError("crashed")
    store.close()
    reopened = open_store(tmp_path, mem)
    assert reopened.recovery.batches_already_in_objects == 20
    assert reopened.recovery.batches_replayed == 0
    got = reopened.open_stream("s").fetch(0)
    assert [r.offset for r in got] == list(range(20)), "duplicates or gaps after replay"
    reopened.close()


def test_manifest_lets_a_store_less_reader_find_every_committed_block(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        a, b = store.create_stream("a"), store.create_stream("b")
        for i in range(3):
            a.append([b"a%d" % i]).result()
            b.append([b"b%d" % i] * 2).result()
            store.flush()
        manifest = read_manifest(mem)
        assert {s.name: (s.start_offset, s.end_offset) for s in manifest.streams.values()} == {
            "a": (0, 3), "b": (0, 6)}
        spans = [(r.entry.start_offset, r.entry.end_offset) for r in manifest.blocks[a.stream_id]]
        assert spans == [(0, 1), (1, 2), (2, 3)]
        a.trim(2)
        assert [r.entry.start_offset for r in read_manifest(mem).blocks[a.stream_id]] == [2]


def test_reopening_continues_the_manifest_chain_and_snapshots_only_when_it_is_short(tmp_path: Path) -> None:
    mem = MemoryStore()

    def snapshots() -> list[str]:
        return sorted(k for k in mem.objects if k.endswith(".snapshot.json"))

    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        s.append([b"a"]).result()
        store.flush()
    first = snapshots()
    assert len(first) == 1  # the new store's
    with open_store(tmp_path, mem) as store:
        assert snapshots() == first, "a clean reopen wrote a snapshot"
        store.open_stream("s").append([b"b"]).result()
        store.flush()
    assert read_manifest(mem).streams[s.stream_id].end_offset == 2  # the delta chains to the old snapshot
    # A crash between a commit and its manifest: the newest manifest is missing.
    newest = max(k for k in mem.objects if k.startswith("manifest/"))
    del mem.objects[newest]
    with open_store(tmp_path, mem):
        assert len(snapshots()) == 2
    assert read_manifest(mem).streams[s.stream_id].end_offset == 2


def test_replace_objects_swaps_atomically_and_old_readers_finish(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem, object_grace_s=3600.0) as store:
        s = store.create_stream("s")
        for i in range(4):
            s.append([b"r%d" % i]).result()
            store.flush()
        old = store.metadata.objects()
        builder = ObjectBuilder()
        batches = []
        for rec in s.fetch(0):
            from stratalog.engine.batch import encode_batch

            data, ts = encode_batch(s.stream_id, rec.offset, [NewRecord(rec.value, timestamp_ms=rec.timestamp_ms)])
            batches.append(StreamBatch(rec.offset, 1, ts, data))
        builder.add_stream(s.stream_id, batches)
        object_id = store.metadata.allocate_object_id()
        key = f"{DATA_PREFIX}compacted-{object_id}"
        mem.put(key, builder.finish())
        with pytest.raises(ValueError, match="cover exactly"):
            store.replace_objects([o.object_id for o in old[:2]], [NewObject(object_id, key, 0, builder.entries)])
        store.replace_objects([o.object_id for o in old], [NewObject(object_id, key, 0, builder.entries)])
        assert (store.stats()["compactions"], store.stats()["objects_compacted"]) == (1, 4), "the refused one not"
        assert values(s.fetch(0)) == [b"r0", b"r1", b"r2", b"r3"]
        assert all(o.key in mem.objects for o in old), "old objects must outlive their grace period"
        assert store.delete_unreferenced(now_ms=int(time.time() * 1000) + 3_600_001) == 4
        assert values(s.fetch(0)) == [b"r0", b"r1", b"r2", b"r3"]


def test_a_full_wal_makes_appends_wait_for_the_uploader_not_fail(tmp_path: Path) -> None:
    # A 2 MiB ring with a large cache: the WAL fills before the cache does, and only the uploader's
    # trims make room.
    with open_store(tmp_path, MemoryStore(), wal_capacity_bytes=8192 + (2 << 20),
                    log_cache_bytes_max=8 << 20, upload_bytes_threshold=4 << 20, append_wait_s_max=2.0) as store:
        s = store.create_stream()
        futures = [s.append([b"w" * 4000]) for _ in range(2000)]  # 8 MB through a 2 MiB ring
        assert futures[-1].result(timeout=30) == 1999
        assert len(s.fetch(0, max_bytes=1 << 30)) == 2000


def test_concurrent_commits_keep_the_manifest_chain_whole(tmp_path: Path) -> None:
    import threading

    mem = MemoryStore()
    with open_store(tmp_path, mem, manifest_snapshot_every=1000) as store:
        a = store.create_stream("a")
        for round_ in range(20):
            for _ in range(3):
                a.append([b"r"]).result()
            barrier = threading.Barrier(2)

            def flush(barrier: threading.Barrier) -> None:
                barrier.wait()
                store.flush()

            thread = threading.Thread(target=flush, args=(barrier,))
            thread.start()
            barrier.wait()
            a.trim(round_)
            thread.join()
        manifest = read_manifest(mem)
        assert manifest.seq == store.metadata.commit_seq, "the chain of deltas broke"
        info = manifest.streams[a.stream_id]
        assert (info.start_offset, info.end_offset) == (a.start_offset, 60)


def test_old_manifests_are_pruned(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem, manifest_snapshot_every=4) as store:
        s = store.create_stream("s")
        for _ in range(40):
            s.append([b"x"]).result()
            store.flush()
        manifests = [k for k in mem.objects if k.startswith("manifest/")]
        assert sum(k.endswith(".snapshot.json") for k in manifests) == 2
        assert len(manifests) <= 2 + 2 * 4
        assert read_manifest(mem).streams[s.stream_id].end_offset == 40


def _stalled_store(tmp_path: Path) -> tuple[StreamStore, MemDevice]:
    """A store whose WAL device never finishes a sync until released, with a write buffer of 1 MiB (four
    blocks of 256 KiB). The WAL's own wait for room is an hour: the store must never wait in it."""
    config = small_store_config(wal=WALConfig(record_bytes_max=256 << 10, window_bytes_max=1 << 20,
                                              buffered_bytes_max=1 << 20, append_wait_s_max=3600.0))
    device = MemDevice(config.wal_capacity_bytes)
    store = StreamStore.open(tmp_path / "s", MemoryStore(), config, wal_device=device)
    device.stall_syncs()
    return store, device


def test_an_append_finding_the_wal_buffer_full_waits_without_the_stores_lock(tmp_path: Path) -> None:
    store, device = _stalled_store(tmp_path)
    stream = store.create_stream("s")
    first = stream.append([b"first"])
    appended: list[int] = []

    def append_until_released() -> None:
        for _ in range(8):   # each its own block: the buffer holds four
            stream.append([bytes(200 << 10)])
            appended.append(1)

    appender = threading.Thread(target=append_until_released)
    appender.start()
    wait_until(lambda: len(appended) >= 3, "appends up to the write buffer's bound")
    # The appender now waits for room; reads of the store go on meanwhile (and find nothing durable yet).
    read: list[int] = []
    reader = threading.Thread(target=lambda: read.append(len(stream.fetch(0, max_bytes=64))))
    reader.start()
    reader.join(timeout=WAIT_S)
    assert read == [0] and appender.is_alive()
    device.release_syncs()
    appender.join(timeout=WAIT_S)
    assert len(appended) == 8 and first.result(timeout=WAIT_S) == 0
    store.close()


def test_an_append_that_may_not_wait_for_the_wal_is_refused_at_once(tmp_path: Path) -> None:
    store, device = _stalled_store(tmp_path)
    stream = store.create_stream("s")
    futures = [stream.append([bytes(200 << 10)]) for _ in range(4)]
    batch = encode_batch([(None, b"v", (), 0)], base_offset=0)
    started = time.monotonic()
    with pytest.raises(BackpressureError, match="WAL's write buffer"):
        stream.append_kafka(batch, 1, 0, wait_s_max=0)
    assert time.monotonic() - started < WAIT_S
    device.release_syncs()
    assert stream.append_kafka(batch, 1, 0, wait_s_max=WAIT_S).result(timeout=WAIT_S) == 4
    assert [f.result(timeout=WAIT_S) for f in futures] == [0, 1, 2, 3]
    store.close()
