"""Log compaction of a stream (engine/cleaner.py): the latest record of each key kept at its offset,
tombstones kept for delete_retention_ms, the tail and young records left alone, bounded passes, and a
pass cut short by a crash or a trim losing nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from enginekit import MemoryStore, abandon, small_store_config
from stratalog.engine import NewRecord, Stream, StreamStore
from stratalog.engine.batch import is_control_batch
from stratalog.engine.cleaner import OBJECT_RESERVATION_MS, CleanPolicy
from stratalog.engine.config import CleanerBounds
from stratalog.engine.store import DATA_PREFIX
from stratalog.kafka.records import encode_batch

T0_MS = 1_700_000_000_000
#: When the tests' passes run: after every record they write (all older than min_compaction_lag_ms, 0).
NOW_MS = T0_MS + 10_000
#: Clean whenever anything is dirty, keep tombstones an hour.
EAGER = CleanPolicy(delete_retention_ms=3_600_000, min_cleanable_dirty_ratio=0.0)


def open_store(path: Path, mem: MemoryStore, **overrides: object) -> StreamStore:
    return StreamStore.open(path, mem, small_store_config(**overrides))


def produce(stream: Stream, pairs: list[tuple[bytes | None, bytes | None]], *, per_batch: int = 5,
            t0_ms: int = T0_MS) -> None:
    """Kafka batches of ``per_batch`` (key, value) records, timestamps one ms apart from ``t0_ms``."""
    for i in range(0, len(pairs), per_batch):
        chunk = pairs[i:i + per_batch]
        fields = [(k, v, (), t0_ms + i + j) for j, (k, v) in enumerate(chunk)]
        batch = encode_batch(fields, base_offset=0)
        stream.append_kafka(batch, len(chunk), t0_ms + i + len(chunk) - 1).result()


def everything(stream: Stream) -> list[tuple[int, bytes | None, bytes]]:
    """Every record kept, of any transaction: the store has no broker's view of which were aborted."""
    out = []
    pos = stream.start_offset
    while pos < stream.end_offset:
        got = stream.fetch(pos, isolation="read_uncommitted")
        if not got:
            break
        out += [(r.offset, r.key, r.value) for r in got]
        pos = got[-1].offset + 1
    return out


def rounds(keys: int, times: int) -> list[tuple[bytes | None, bytes | None]]:
    return [(f"k{k}".encode(), f"v{t}-{k}".encode()) for t in range(times) for k in range(keys)]


def test_the_latest_record_of_each_key_is_kept_at_its_offset(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        produce(s, rounds(10, 10))
        store.flush()
        report = store.clean_stream(s, EAGER, now_ms=NOW_MS)
        assert (report.records_read >= 100, report.records_kept, report.clean_end_offset) == (True, 10, 100)
        assert everything(s) == [(90 + k, f"k{k}".encode(), f"v9-{k}".encode()) for k in range(10)]
        assert (s.start_offset, s.end_offset) == (0, 100), "compaction moves no offsets"
        # A reader positioned in a gap reads on from the next record kept.
        assert [r.offset for r in s.fetch(37)] == list(range(90, 100))
        # Batches still tile the stream: the first batch a reader of whole batches gets holds its offset.
        first = s.fetch_batches(37)[0]
        assert first.base_offset <= 37 < first.end_offset
        assert s.offset_for_timestamp(T0_MS + 50) == 90, "the first record kept at or after the time"
    with open_store(tmp_path, mem) as store:   # and so after a restart
        assert everything(store.open_stream("s"))[0] == (90, b"k0", b"v9-0")


def test_tombstones_stay_for_delete_retention_then_go(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        produce(s, [(b"a", b"1"), (b"b", b"1"), (b"a", None), (b"c", b"1")])
        store.flush()
        store.clean_stream(s, EAGER, now_ms=T0_MS + 1000)
        assert [(o, k, v) for o, k, v in everything(s)] == [(1, b"b", b"1"), (2, b"a", b""), (3, b"c", b"1")]
        produce(s, [(b"d", b"1")], t0_ms=T0_MS + 5000)
        store.flush()
        store.clean_stream(s, EAGER, now_ms=T0_MS + 3_600_000 + 10)   # the tombstone is past its retention
        assert [k for _, k, _ in everything(s)] == [b"b", b"c", b"d"]


def test_a_second_pass_cleans_batches_that_have_gaps_already(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        produce(s, rounds(20, 3), per_batch=7)
        store.flush()
        store.clean_stream(s, EAGER, now_ms=NOW_MS)
        produce(s, rounds(5, 1), t0_ms=T0_MS + 1000)   # k0..k4 again: their earlier records go
        store.flush()
        report = store.clean_stream(s, EAGER, now_ms=T0_MS + 2000)
        assert report.clean_end_offset == 65
        got = everything(s)
        assert [o for o, _, _ in got] == list(range(45, 65))
        assert [v for _, _, v in got][-5:] == [f"v0-{k}".encode() for k in range(5)]


def test_records_appended_through_the_python_api_are_compacted_too(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        for t in range(3):
            s.append([NewRecord(f"v{t}".encode(), key=b"k", timestamp_ms=T0_MS + t,
                                headers=(("h", b"x"),)), NewRecord(b"free", timestamp_ms=T0_MS)]).result()
        store.flush()
        store.clean_stream(s, EAGER, now_ms=NOW_MS)
        got = s.fetch(0)
        assert [(r.offset, r.key, r.value) for r in got] == [(1, None, b"free"), (3, None, b"free"), (4, b"k", b"v2"),
                                                             (5, None, b"free")]
        assert got[2].headers == (("h", b"x"),) and got[2].timestamp_ms == T0_MS + 2


def test_the_tail_and_young_records_are_not_cleaned(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        produce(s, rounds(2, 5))
        store.flush()
        produce(s, rounds(2, 5), t0_ms=T0_MS + 60_000)   # in the log cache: the active tail
        lagging = CleanPolicy(min_compaction_lag_ms=30_000, min_cleanable_dirty_ratio=0.0)
        assert store.clean_stream(s, lagging, now_ms=T0_MS + 10_000).records_kept == 0, "all too young"
        report = store.clean_stream(s, lagging, now_ms=T0_MS + 40_000)
        assert report.clean_end_offset == 10
        assert [o for o, _, _ in everything(s)] == [8, 9, *range(10, 20)]


def test_a_small_key_map_cleans_in_several_passes(tmp_path: Path) -> None:
    mem = MemoryStore()
    config = {"cleaner": CleanerBounds(key_map_entries_max=10, rewrite_bytes_max=4096, read_bytes_per_s_max=None),
              "stream_object_bytes_min": 1}
    with open_store(tmp_path, mem, **config) as store:
        s = store.create_stream("s")
        for part in range(4):   # four blocks, of 10 records each, 10 keys each
            produce(s, [(f"k{part}-{i % 5}".encode(), f"{i}".encode()) for i in range(10)], per_batch=10)
            store.flush()
        ends = [store.clean_stream(s, EAGER, now_ms=NOW_MS).clean_end_offset for _ in range(5)]
        assert ends == [10, 20, 30, 40, 40], "a pass ends where its key map filled; the next goes on"
        assert len(everything(s)) == 20


def test_a_pass_that_finds_the_stream_trimmed_stops_and_leaves_no_object(tmp_path: Path) -> None:
    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        for _ in range(2):   # two blocks: [0, 6) and [6, 12)
            produce(s, rounds(3, 2))
            store.flush()
        objects_before = set(mem.objects)
        meta = store.metadata
        replace = meta.replace_stream_blocks

        def trim_first(*args: object, **kwargs: object) -> int:
            meta.trim_stream(s.stream_id, 6)   # a retention pass got there between the read and the commit
            return replace(*args, **kwargs)  # type: ignore[arg-type]

        meta.replace_stream_blocks = trim_first  # type: ignore[method-assign]
        report = store.clean_stream(s, EAGER, now_ms=NOW_MS)
        assert report.objects_written == 0
        assert {k for k in mem.objects if k.startswith(DATA_PREFIX)} <= objects_before, "its object was deleted"
        assert [o for o, _, _ in everything(s)] == list(range(6, 12)), "the trim stands, nothing else changed"
        meta.replace_stream_blocks = replace  # type: ignore[method-assign]
        assert store.clean_stream(s, EAGER, now_ms=NOW_MS).clean_end_offset == 12, "the next pass goes on"
        assert [o for o, _, _ in everything(s)] == [9, 10, 11]


def test_a_crash_before_the_commit_loses_nothing_and_its_object_goes_after_its_reservation(tmp_path: Path) -> None:
    mem = MemoryStore()
    store = open_store(tmp_path, mem)
    s = store.create_stream("s")
    produce(s, rounds(4, 3))
    store.flush()
    before = everything(s)

    def crash(*args: object, **kwargs: object) -> int:
        raise RuntimeError("killed")

    store.metadata.replace_stream_blocks = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        store.clean_stream(s, EAGER, now_ms=NOW_MS)
    abandon(store)
    written = {k for k in mem.objects if k.startswith(DATA_PREFIX)}
    with open_store(tmp_path, mem) as store:
        assert store.recovery.orphan_objects_deleted == 0, "reserved in metadata: not an orphan"
        s = store.open_stream("s")
        assert everything(s) == before
        assert store.delete_unreferenced() == 0, "still reserved"
        later_ms = int(time.time() * 1000) + OBJECT_RESERVATION_MS + 1
        assert store.delete_unreferenced(now_ms=later_ms) == 1, "the dead pass's object, once its reservation ended"
        assert {k for k in mem.objects if k.startswith(DATA_PREFIX)} < written
        assert everything(s) == before
        store.clean_stream(s, EAGER, now_ms=NOW_MS)
        assert [o for o, _, _ in everything(s)] == [8, 9, 10, 11]


def test_transactions_batches_and_markers_are_kept_whole_and_supersede_nothing(tmp_path: Path) -> None:
    from stratalog.kafka.control_batch import MarkerType, marker_batch

    mem = MemoryStore()
    with open_store(tmp_path, mem) as store:
        s = store.create_stream("s")
        produce(s, [(f"k{i}".encode(), b"plain-0") for i in range(5)])                        # offsets 0-4
        txn = encode_batch([(f"k{i}".encode(), b"txn", (), T0_MS) for i in range(5)], base_offset=0,
                           producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True)
        s.append_kafka(txn, 5, T0_MS).result()                                                # offsets 5-9
        s.append_kafka(marker_batch(7, 0, MarkerType.ABORT, coordinator_epoch=0, timestamp_ms=T0_MS), 1,
                       T0_MS).result()                                                        # offset 10
        produce(s, [(f"k{i}".encode(), b"plain-1") for i in range(3)])                        # offsets 11-13
        s.append_kafka(marker_batch(7, 1, MarkerType.COMMIT, coordinator_epoch=0, timestamp_ms=T0_MS), 1,
                       T0_MS).result()                                                        # offset 14
        store.flush()
        store.clean_stream(s, EAGER, now_ms=NOW_MS)
        kept = [o for o, _, _ in everything(s)]
        markers = [b.base_offset for b in s.fetch_batches(0, 1 << 20) if is_control_batch(b.body)]
    assert kept == [3, 4, *range(5, 10), 11, 12, 13], "k0-k2 of plain-0 superseded by plain-1 only"
    assert markers == [10, 14], "the markers stay (Stream.fetch returns no record for them)"
