"""QueueStore at small scale: the API, its errors, the million-queue race's three phases with a restart in the middle,
consumer positions and corruption. (The bench command's tests are in test_bench_queues.py.)"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import stratalog
from queuekit import one_object_per_round, small_queue_config
from stratalog.engine.store import StoreClosedError
from stratalog.io import libc
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.queues import (
    QUEUE_NAME_CHARS_MAX,
    InvalidQueueNameError,
    MessageTooLargeError,
    QueueConfig,
    QueueStore,
)
from stratalog.queues import objects as queue_objects
from stratalog.queues import reader as queue_reader
from stratalog.queues.format import U32, CorruptBulkError
from stratalog.queues.logcache import CachedRecord, LogCache
from stratalog.queues.merge_worker import MergeAnswer, MergeJob
from stratalog.queues.objects import QUEUE_PREFIX, RunObject
from stratalog.wal import WriteAheadLog
from waiting import wait_until

#: Only a bound on a hang: tests that wait for events end long before it on any machine.
BUSY_MACHINE_BOUND_S = 300.0


def _open(path: Path, **overrides: object) -> QueueStore:
    return QueueStore.open(path, config=small_queue_config(**overrides))


def _msg(q: int, r: int) -> bytes:
    return f"{q}/{r}/".encode() + bytes(40)


def test_the_package_exports_queue_store() -> None:
    assert stratalog.QueueStore is QueueStore


def test_a_closed_store_refuses_puts_at_once(tmp_path: Path) -> None:
    qs = _open(tmp_path)
    qs.put("a", b"kept")
    qs.close()
    with pytest.raises(StoreClosedError):
        qs.put("a", b"after close")
    with pytest.raises(StoreClosedError):
        qs.put("a", b"x" * 3000)      # a large message takes another path
    with pytest.raises(StoreClosedError):
        qs.put_many(["a", "b"], [b"1", b"2"])
    with pytest.raises(StoreClosedError):
        qs.flush()
    qs.close()      # again: nothing to do
    with _open(tmp_path) as again:
        assert again.get("a", 0, 10) == [b"kept"]
        assert again.get("b", 0, 10) == []


def test_queues_are_created_on_first_put_with_dense_offsets(tmp_path: Path) -> None:
    with _open(tmp_path) as qs:
        for i in range(5):
            qs.put("a", b"a%d" % i)
        qs.put("b", b"b0")

        assert qs.get("a", 0, 10) == [b"a0", b"a1", b"a2", b"a3", b"a4"]
        assert qs.get("a", 3, 1) == [b"a3"]
        assert qs.get("a", 5, 10) == []
        assert qs.get("b", 0, 10) == [b"b0"]
        assert qs.get("never", 0, 10) == []
        assert qs.get("a", 2, 0) == []


def test_a_get_waits_for_puts_the_writer_has_taken_but_not_yet_written(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The writer thread takes the pending puts, then writes them: a get in between must wait for that
    # write (once, a get in the middle of it returned only the messages of earlier writes).
    entered, release = threading.Event(), threading.Event()
    real_append = WriteAheadLog.append

    def held_append(wal: WriteAheadLog, body: Any) -> Any:
        if threading.current_thread().name == "stratalog-queue-writer":
            entered.set()
            release.wait(10)
        return real_append(wal, body)

    monkeypatch.setattr(WriteAheadLog, "append", held_append)
    with _open(tmp_path) as qs:
        qs.put_many(["x", "x"], [b"1", b"2"])
        assert entered.wait(10), "the writer never took the puts"
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.extend(qs.get("x", 0, 10)))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive(), f"the get did not wait for the write in flight: {got}"
        release.set()
        reader.join(10)
        assert got == [b"1", b"2"]


def test_put_many_takes_sequences_arrow_and_numpy(tmp_path: Path) -> None:
    with _open(tmp_path) as qs:
        qs.put_many(["x", "y", "x"], [b"1", b"2", b"3"])
        qs.put_many(pa.array(["y", "x"]), pa.array([b"4", b"5"], type=pa.binary()))
        rows = np.frombuffer(b"abcdef", np.uint8).reshape(2, 3).copy()
        qs.put_many(["x", "y"], rows)
        rows[:] = 0  # put_many copied the buffer

        qs.put_many(np.array(["x", "z"]), [b"6", b"7"])
        qs.put_many(pa.chunked_array([pa.array(["z"], pa.large_string()), pa.array(["y"], pa.large_string())]),
                    [b"8", b"9"])
        qs.put_many(pa.array(["-", "x", "-"]).slice(1, 1), [b"10"])
        qs.put_many([], [])

        assert qs.get("x", 0, 10) == [b"1", b"3", b"5", b"abc", b"6", b"10"]
        assert qs.get("y", 0, 10) == [b"2", b"4", b"def", b"9"]
        assert qs.get("z", 0, 10) == [b"7", b"8"]


@pytest.mark.parametrize("names", [[b"ok"], pa.array([b"ok"], pa.binary()), np.array([b"ok"]), "ok", [None]])
def test_put_many_takes_only_str_names_even_for_a_known_queue(tmp_path: Path, names: object) -> None:
    with _open(tmp_path) as qs:
        qs.put("ok", b"1")
        with pytest.raises(InvalidQueueNameError):
            qs.put_many(names, [b"2"])

        assert qs.get("ok", 0, 10) == [b"1"]


@pytest.mark.parametrize("name", ["", "n" * (QUEUE_NAME_CHARS_MAX + 1), "bad\udc80", 17, None, b"bytes", ["ok"]])
def test_a_bad_name_raises_and_loses_nothing_else(tmp_path: Path, name: object) -> None:
    with _open(tmp_path) as qs:
        qs.put("ok", b"1")
        with pytest.raises(InvalidQueueNameError):
            qs.put(name, b"x")  # type: ignore[arg-type]
        with pytest.raises(InvalidQueueNameError):
            qs.put_many(["ok", name], [b"2", b"3"])
        qs.put("ok", b"4")
        qs.flush()

        assert qs.get("ok", 0, 10) == [b"1", b"4"]


def test_names_at_the_bound_and_beyond_ascii_work(tmp_path: Path) -> None:
    long_name = "é" * QUEUE_NAME_CHARS_MAX
    with _open(tmp_path) as qs:
        qs.put(long_name, b"1")
        qs.put("キュー", b"2")
    with _open(tmp_path) as qs:
        assert qs.get(long_name, 0, 1) == [b"1"]
        assert qs.get("キュー", 0, 1) == [b"2"]


def test_an_oversize_message_raises_and_loses_nothing_else(tmp_path: Path) -> None:
    with _open(tmp_path, message_bytes_max=100) as qs:
        qs.put("q", b"1")
        with pytest.raises(MessageTooLargeError):
            qs.put("q", bytes(101))
        with pytest.raises(MessageTooLargeError):
            qs.put_many(["q", "q"], [b"2", bytes(101)])
        with pytest.raises(TypeError):
            qs.put("q", "not bytes")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="names for"):
            qs.put_many(["q"], [b"2", b"3"])
        qs.put("q", bytes(100))

        assert qs.get("q", 0, 10) == [b"1", bytes(100)]


def test_three_phases_with_a_restart_in_the_middle(tmp_path: Path) -> None:
    queues, rounds, threads = 3000, 12, 4
    names = [f"queue-{q}" for q in range(queues)]

    def send(qs: QueueStore, first_round: int, last_round: int) -> None:
        def producer(t: int) -> None:
            mine = range(t, queues, threads)
            for r in range(first_round, last_round):
                if r % 3 == 2:
                    qs.put_many([names[q] for q in mine], [_msg(q, r) for q in mine])
                else:
                    for q in mine:
                        qs.put(names[q], _msg(q, r))
            qs.flush()

        workers = [threading.Thread(target=producer, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    qs = _open(tmp_path)
    send(qs, 0, rounds // 2)
    qs.close()
    qs = _open(tmp_path)
    assert qs.recovery.objects >= 1, "the first half should be in objects"
    send(qs, rounds // 2, rounds)
    stats = qs.stats()
    assert stats["queues"] == queues and stats["messages"] == queues * rounds
    # The batch name index was rebuilt at the open and holds every queue, in a few dozen bytes each.
    assert len(qs.writer.names) == queues and 0 < stats["name_index_bytes"] <= 64 * queues + (64 << 10)

    rng = random.Random(4)
    for q in rng.sample(range(queues), queues):  # index check: every queue, random offsets
        off = rng.randrange(rounds)
        got = qs.get(names[q], off, 10)
        assert got == [_msg(q, r) for r in range(off, min(off + 10, rounds))]
    for q in rng.sample(range(queues), queues // 5):  # consume 20% in full
        off, seen = 0, []
        while batch := qs.get(names[q], off, 7):
            seen.extend(batch)
            off += len(batch)
        assert seen == [_msg(q, r) for r in range(rounds)]
    qs.close()


def test_reads_see_puts_before_flush_and_after_upload(tmp_path: Path) -> None:
    with _open(tmp_path, upload_idle_s=3600.0, upload_interval_s=3600.0) as qs:
        for r in range(50):
            qs.put_many([f"q{q}" for q in range(200)], [_msg(q, r) for q in range(200)])
        qs.flush()
        wait_until(lambda: qs.stats()["objects"] >= 1,
                   lambda: f"the byte threshold to start an upload: {qs.stats()}")
        qs.put_many([f"q{q}" for q in range(200)], [_msg(q, 50) for q in range(200)])
        qs.put("q7", _msg(7, 51))
        qs.flush()
        assert qs.stats()["log_cache_records"] >= 1, "the tail should still be in the log cache"
        assert qs.get("q7", 0, 100) == [_msg(7, r) for r in range(52)]
        assert qs.get("q199", 45, 100) == [_msg(199, r) for r in range(45, 51)]


@pytest.mark.parametrize("after", ["upload_idle_s", "upload_interval_s"])
def test_an_upload_by_time_comes_when_its_time_has_passed_and_not_before(tmp_path: Path, after: str) -> None:
    """What is in the log cache goes to an object once no put has come for upload_idle_s, or once its
    oldest record is upload_interval_s old; seen on a clock of the uploader's that the test sets ahead."""
    due_s = 600.0
    times = {"upload_idle_s": 7200.0, "upload_interval_s": 7200.0, after: due_s}
    ahead_s = 0.0
    with _open(tmp_path, compact_fanout=0, **times) as qs:
        qs.uploader.clock = lambda: time.monotonic() + ahead_s
        qs.put_many([f"q{q}" for q in range(20)], [_msg(q, 0) for q in range(20)])
        qs.flush()
        assert not qs.uploader.due()
        ahead_s = due_s / 2     # well short of due_s, however slowly this test runs
        assert not qs.uploader.due() and qs.stats()["objects"] == 0
        ahead_s = due_s
        wait_until(lambda: qs.stats()["objects"] == 1 and not qs.stats()["log_cache_records"],
                   lambda: f"an upload after {after}: {qs.stats()}")
        assert qs.get("q7", 0, 2) == [_msg(7, 0)]


def test_log_cache_reads_start_at_their_offset_and_an_upload_lets_the_records_go(tmp_path: Path) -> None:
    """Gets from the log cache at any offset, from several reader threads; once the records are uploaded
    the log cache's index no longer holds them (nor their messages)."""
    with _open(tmp_path, upload_idle_s=3600.0, upload_interval_s=3600.0, upload_bytes_threshold=4 << 20) as qs:
        for r in range(30):
            qs.put_many([f"q{q}" for q in range(100)], [_msg(q, r) for q in range(100)])
            qs.flush()   # a record or more per round: a queue has runs in many records
        assert qs.stats()["objects"] == 0 and qs.stats()["log_cache_records"] >= 30
        errors: list[BaseException] = []

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(300):
                    q, off, num = rng.randrange(100), rng.randrange(35), rng.randrange(1, 12)
                    assert qs.get(f"q{q}", off, num) == [_msg(q, r) for r in range(off, min(off + num, 30))]
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert qs.log_cache.tail.records, "the reads built the log cache's index"
        uploaded = qs.log_cache.tail.records
        qs.uploader.upload(everything=True)
        assert qs.stats()["log_cache_records"] == 0
        assert not set(map(id, qs.log_cache.tail.records)) & set(map(id, uploaded))
        assert qs.get("q3", 28, 5) == [_msg(3, 28), _msg(3, 29)]


def _six_records_in_the_log_cache(path: Path) -> QueueStore:
    """A store whose log cache holds six rounds to 20 queues, one or more records each, none uploaded."""
    qs = _open(path, upload_idle_s=3600.0, upload_interval_s=3600.0, upload_bytes_threshold=4 << 20)
    for r in range(6):
        qs.put_many([f"q{q}" for q in range(20)], [_msg(q, r) for q in range(20)])
        qs.flush()
    assert len(qs.log_cache.view.records) >= 6
    return qs


def _log_cache_of(records: tuple[CachedRecord, ...]) -> LogCache:
    """A log cache holding ``records`` (a store's), for reads through its public calls."""
    cache = LogCache(QueueConfig())
    for rec in records:
        cache.add(rec)
    return cache


def _upload_of(cache: LogCache, taken: tuple[CachedRecord, ...]) -> None:
    """``taken`` leave the log cache as an upload's records do (the object itself plays no part here)."""
    streams = taken[-1].stream_count
    obj = RunObject(1, "queues/0000000000000001.slq", None, 0, np.zeros(0, U32), 0)
    cache.uploaded(taken, obj, np.zeros(streams, U32), np.zeros(streams + 1, U32))


def test_a_get_with_an_older_view_than_the_tail_index_reads_every_record(tmp_path: Path) -> None:
    """A get holds the view it started with; if meanwhile an upload took records and another reader built
    the log cache's index from the later view, that index lacks records this get still reads: it must
    look them up itself, never start a run at the wrong offset."""
    with _six_records_in_the_log_cache(tmp_path) as qs:
        records = qs.log_cache.view.records
        stream_id = qs.writer.ids["q5"]
    cache = _log_cache_of(records)
    out: list[bytes] = []
    cache.read(records[2:], stream_id, 2, 10, out)   # a reader whose view had lost two records builds it
    assert out == [_msg(5, r) for r in range(2, 6)]
    built = cache.tail
    assert built.first_seq == records[2].seq and built.last_seq == records[-1].seq
    out = []
    cache.read(records, stream_id, 0, 10, out)
    assert out == [_msg(5, r) for r in range(6)] and cache.tail is built


def test_a_record_of_names_already_uploaded_but_still_in_the_wal_is_not_a_hole(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash after an upload's commit and before its WAL trim is durable leaves the uploaded records in
    the WAL; the replay must skip them, a record of new queues' names too. That one was taken for a hole,
    and every record after it, flushed ones too, was dropped (a power-cut test found it: about 1 run in
    200)."""
    import shutil

    live, image = tmp_path / "live", tmp_path / "image"
    with _open(live, upload_idle_s=3600.0, upload_interval_s=3600.0, compact_fanout=0) as qs:
        qs.put_many([f"q{q}" for q in range(30)], [_msg(q, 0) for q in range(30)])     # names, then round 0
        qs.flush()
        monkeypatch.setattr(WriteAheadLog, "trim", lambda wal, offset: None)   # the trim never became durable
        assert qs.uploader.upload() == 30
        for r in (1, 2):
            qs.put_many([f"q{q}" for q in range(30)], [_msg(q, r) for q in range(30)])
        qs.flush()
        shutil.copytree(live, image)    # a crash here: everything flushed is on disk
    with _open(image) as reopened:
        assert reopened.recovery.records_dropped == 0
        assert reopened.recovery.records_in_objects >= 2      # the names and round 0
        for q in range(30):
            assert reopened.get(f"q{q}", 0, 10) == [_msg(q, r) for r in range(3)]


def test_an_upload_drops_its_records_from_the_tail_index_and_keeps_the_rest(tmp_path: Path) -> None:
    """After a send the log cache is uploaded under its readers: an upload drops the records it took from
    the log cache's index (their messages go) and the readers of the rest go on with it, no rebuild; a
    get whose view still has the uploaded records looks them up itself."""
    from stratalog.queues.index import TailIndex

    with _six_records_in_the_log_cache(tmp_path) as qs:
        records = qs.log_cache.view.records
        sid = qs.writer.ids["q5"]
    built = TailIndex.build(records)
    kept = built.without_through(records[2].seq)
    assert kept.records[:3] == (None, None, None) and kept.records[3:] == records[3:]
    assert kept.starts is built.starts and kept.run_end is built.run_end     # nothing rebuilt
    assert built.without_through(records[-1].seq).records == ()

    cache = _log_cache_of(records)
    out: list[bytes] = []
    cache.read(records, sid, 0, 10, out)                 # builds the index of all six
    assert out == [_msg(5, r) for r in range(6)]
    built = cache.tail
    _upload_of(cache, records[:3])
    kept = cache.tail
    assert kept.records[:3] == (None, None, None) and kept.records[3:] == records[3:]
    assert kept.starts is built.starts and kept.run_end is built.run_end     # nothing rebuilt
    out = []
    cache.read(records[3:], sid, 3, 10, out)             # a view after the upload: rounds 3 .. 5 here
    assert out == [_msg(5, r) for r in range(3, 6)] and cache.tail is kept
    out = []
    cache.read(records, sid, 0, 10, out)                 # a view from before it: 0 .. 2 looked up one by one
    assert out == [_msg(5, r) for r in range(6)] and cache.tail is kept

    # A rebuild from a view older than the log cache's drops what was uploaded since that view.
    cache = _log_cache_of(records)
    _upload_of(cache, records[:3])
    out = []
    cache.read(records, sid, 0, 10, out)
    assert out == [_msg(5, r) for r in range(6)]
    assert cache.tail.records[:3] == (None, None, None) and cache.tail.records[3:] == records[3:]


def test_readers_beside_a_writer_uploads_and_merges_get_exactly_what_was_put(tmp_path: Path) -> None:
    """Four reader threads get random ranges of what has been put so far while a writer puts round after
    round and small bounds make uploads, tail-index rebuilds and merges happen every few milliseconds:
    every message read is the one put at that offset of that queue."""
    queues = 40
    written = [0] * queues    # rounds put to every queue (each round fully put before it counts)
    stop = threading.Event()
    errors: list[BaseException] = []
    checked = [0]
    with _open(tmp_path, upload_bytes_threshold=8 << 10, upload_idle_s=0.005, compact_fanout=2,
               compact_object_bytes_max=256 << 10) as qs:

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            try:
                while not stop.is_set():
                    q = rng.randrange(queues)
                    rounds = written[q]
                    if not rounds:
                        continue
                    off = rng.randrange(rounds)
                    got = qs.get(f"q{q}", off, rng.randrange(1, 30))
                    assert got[:rounds - off] == [_msg(q, r) for r in range(off, min(off + len(got), rounds))], q
                    checked[0] += 1
                    time.sleep(0.0002)   # leave the GIL to the writer, the uploader and the compactor too
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        # Puts until merges have run under the readers and the readers have read plenty, however slow the
        # machine (a busy one once ran 3 s of puts without a merge): events, with a bound only on a hang.
        def enough() -> bool:
            return r > 100 and checked[0] > 1000 and qs.stats()["compactions"] >= 1

        deadline = time.monotonic() + BUSY_MACHINE_BOUND_S
        r = 0
        while not errors and not (r % 5 == 0 and enough()):
            assert time.monotonic() < deadline, (qs.stats(), qs.compaction_error, checked[0], r)
            for q in range(queues):
                qs.put(f"q{q}", _msg(q, r))
            r += 1
            written[:] = [r] * queues
            if r % 5 == 0:
                qs.flush()
        stop.set()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert all(qs.get(f"q{q}", 0, r + 1) == [_msg(q, i) for i in range(r)] for q in range(queues))


def test_committed_positions_are_durable(tmp_path: Path) -> None:
    with _open(tmp_path) as qs:
        qs.put("q", b"1")
        assert qs.committed("billing", "q") is None
        qs.commit("billing", "q", 1)
        qs.commit("audit", "q", 0)
        with pytest.raises(ValueError):
            qs.commit("billing", "q", -1)
        with pytest.raises(InvalidQueueNameError):
            qs.commit("", "q", 1)
    with _open(tmp_path) as qs:
        assert qs.committed("billing", "q") == 1
        assert qs.committed("audit", "q") == 0
        assert qs.committed("billing", "other") is None


def _miss_the_page_cache(monkeypatch: pytest.MonkeyPatch,
                         probe: Callable[[int, int, int], memoryview | None] = lambda fd, size, offset: None) -> None:
    """Every read of the page cache misses (``probe`` answers for it): a random get's compiled reads give way
    to their twins, which ask ``libc.cached_view``, here ``probe``."""
    monkeypatch.setattr(queue_reader, "read_random_get", queue_objects.read_random_cached)
    monkeypatch.setattr(libc, "cached_view", probe)


@pytest.mark.parametrize("page_cache", [True, False], ids=["read-from-page-cache", "read-waiting-for-disk"])
def test_a_damaged_run_is_detected_never_returned(tmp_path: Path, page_cache: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:

    if not page_cache:    # every read takes the path of one that must wait for the disk
        _miss_the_page_cache(monkeypatch)
    with _open(tmp_path) as qs:
        for r in range(20):
            qs.put_many([f"q{q}" for q in range(50)], [_msg(q, r) for q in range(50)])
    objects = sorted((tmp_path / LOCAL_DIR_NAME / QUEUE_PREFIX).glob("*.slq"))
    assert objects
    raw = bytearray(objects[0].read_bytes())
    at = raw.find(b"17/3/")
    assert at > 0
    raw[at] ^= 0xFF
    objects[0].write_bytes(bytes(raw))
    with _open(tmp_path) as qs:
        # Runs are checked by 4 KiB pages: runs in other pages than the damaged one read as ever.
        assert qs.get("q0", 0, 20) == [_msg(0, r) for r in range(20)]
        assert qs.get("q49", 0, 20) == [_msg(49, r) for r in range(20)]
        with pytest.raises(CorruptBulkError, match="CRC"):
            qs.get("q17", 0, 20)
        with pytest.raises(CorruptBulkError, match="CRC"):
            qs.get("q17", 5, 1)


def _three_objects_of(tmp_path: Path, queues: int) -> None:
    """Rounds 0, 1, 2 of ``queues`` queues, one object each."""
    one_object_per_round(tmp_path, [range(queues)] * 3, _msg)


@pytest.mark.parametrize("ahead", [0, 64 << 10], ids=["each-run-alone", "read-ahead"])
def test_consumers_walking_the_queues_in_order_read_ahead_of_them(tmp_path: Path, ahead: int) -> None:
    queues = 3000
    _three_objects_of(tmp_path, queues)
    with _open(tmp_path, compact_fanout=0, read_ahead_bytes=ahead) as qs:
        assert len(qs.log_cache.view.objects) == 3
        before = qs.stats()["object_reads"]
        for q in range(0, queues, 2):      # every other queue, in order, as a consumer of many would
            assert qs.get(f"q{q}", 0, 10) == [_msg(q, r) for r in range(3)]
        reads = qs.stats()["object_reads"] - before
        # A run is ~50 bytes, so an object's runs ~150 KiB: three chunks of 64 KiB, or four or five as a
        # chunk starts at the page of the first run the last one did not hold whole.
        assert reads == 3 * (queues // 2) if not ahead else reads <= 3 * 5, reads
        held = qs.stats()["read_ahead_bytes"]
        assert held == 0 if not ahead else 0 < held <= 3 * (queues * 60 // ahead + 1) * ahead
        # Random readers never read ahead: their runs are far apart.
        before = qs.stats()["object_reads"]
        for q in (2999, 5, 1500, 17, 2500):
            assert qs.get(f"q{q}", 1, 1) == [_msg(q, 1)]
        assert qs.stats()["object_reads"] - before == 5


def test_gets_the_page_cache_cannot_serve_read_once_and_are_counted(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _three_objects_of(tmp_path, 500)
    with _open(tmp_path, compact_fanout=0) as qs:
        assert qs.get("q7", 0, 3) == [_msg(7, r) for r in range(3)]
        assert qs.stats()["object_reads_waited"] == 0       # just written: in the page cache
        tried: list[int] = []

        def missed(fd: int, size: int, offset: int) -> memoryview | None:
            tried.append(offset)
            return None      # as if the page cache held none of it

        _miss_the_page_cache(monkeypatch, missed)
        before = qs.stats()
        # At offset 1: a random reader's (a consumer's from 0 would be served from read-ahead chunks).
        assert qs.get("q300", 1, 2) == [_msg(300, r) for r in (1, 2)]     # a run in each of two objects
        after = qs.stats()
        assert after["object_reads"] - before["object_reads"] == 2
        assert after["object_reads_waited"] - before["object_reads_waited"] == 2
        # The page cache is tried up to the first run it does not hold; from there on the get reads as one
        # that waits for the disk (the later runs hinted first), trying no run twice.
        assert len(tried) == 1


def test_read_ahead_keeps_its_bound_while_threads_add_chunks_at_once(tmp_path: Path) -> None:
    """Consumer threads walking the same objects add and evict chunks at once (once, one of them walked the
    chunks while another added one and raised "dictionary changed size"): every get is right and no
    object ever holds more chunks than its bound."""
    queues = 3000
    _three_objects_of(tmp_path, queues)
    with _open(tmp_path, compact_fanout=0, read_ahead_bytes=4096, read_ahead_cache_bytes=0,
               read_ahead_chunks_per_object_min=1) as qs:
        objects = qs.log_cache.view.objects
        errors: list[BaseException] = []
        most = 0
        done = threading.Event()

        def consume(first: int) -> None:
            try:
                for q in range(first, queues, 4):
                    assert qs.get(f"q{q}", 0, 10) == [_msg(q, r) for r in range(3)]
            except BaseException as e:
                errors.append(e)

        def watch() -> None:
            nonlocal most
            while not done.is_set():
                most = max([most, *(len(obj.chunks) for obj in objects)])

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=consume, args=(first,)) for first in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        assert not errors, errors[0]
        assert qs.stats()["read_ahead_bytes"] > 0, "the consumers read ahead"
        assert most == 1 and all(len(obj.chunks) == 1 for obj in objects)


@pytest.mark.parametrize(("budget_chunks", "per_object"),
                         [(0, QueueConfig().read_ahead_chunks_per_object_min), (24 * 3, 24)])
def test_read_ahead_keeps_the_chunks_its_budget_allows(tmp_path: Path, budget_chunks: int, per_object: int) -> None:
    queues = 3000       # ~38 chunks of 4 KiB an object
    _three_objects_of(tmp_path, queues)
    with _open(tmp_path, compact_fanout=0, read_ahead_bytes=4096, read_ahead_cache_bytes=budget_chunks * 4096) as qs:
        for q in range(queues):
            assert qs.get(f"q{q}", 0, 10) == [_msg(q, r) for r in range(3)]
            assert qs.stats()["read_ahead_bytes"] <= 3 * per_object * 4096
        # Each of the three objects its share (at least the minimum): the walk over every queue filled it.
        assert [len(obj.chunks) for obj in qs.log_cache.view.objects] == [per_object] * 3


@pytest.mark.parametrize("ahead", [-4096, 1000, (64 << 10) + 4096, 1 << 20])
def test_read_ahead_bytes_must_be_whole_pages_the_page_cache_read_can_take(tmp_path: Path, ahead: int) -> None:
    with pytest.raises(ValueError, match="read_ahead_bytes"):
        _open(tmp_path, read_ahead_bytes=ahead)


def test_a_damaged_page_read_ahead_fails_only_the_runs_in_it(tmp_path: Path) -> None:
    queues = 3000
    _three_objects_of(tmp_path, queues)
    damaged = sorted((tmp_path / LOCAL_DIR_NAME / QUEUE_PREFIX).glob("*.slq"))[1]
    raw = bytearray(damaged.read_bytes())
    at = raw.find(b"1234/1/")
    assert at > 0
    raw[at] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    with _open(tmp_path, compact_fanout=0) as qs:
        failed = []
        for q in range(queues):
            try:
                assert qs.get(f"q{q}", 0, 10) == [_msg(q, r) for r in range(3)]
            except CorruptBulkError as exc:
                assert "CRC" in str(exc)
                failed.append(q)
        # The damaged page holds ~60 runs (4 KiB of ~60 bytes): only their queues fail.
        assert 1234 in failed and len(failed) <= 4096 // 50
        assert failed == list(range(failed[0], failed[-1] + 1))


def test_a_damaged_index_stops_the_open(tmp_path: Path) -> None:
    with _open(tmp_path) as qs:
        qs.put_many([f"q{q}" for q in range(50)], [_msg(q, 0) for q in range(50)])
    obj = next((tmp_path / LOCAL_DIR_NAME / QUEUE_PREFIX).glob("*.slq"))
    raw = bytearray(obj.read_bytes())
    raw[-40] ^= 1  # inside the index
    obj.write_bytes(bytes(raw))
    with pytest.raises(CorruptBulkError):
        _open(tmp_path)



def test_a_get_spanning_objects_asks_for_the_later_runs_at_once(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from stratalog.objects.local import LocalObjectReader

    _three_objects_of(tmp_path, 10)
    hinted: list[tuple[str, int, int]] = []
    monkeypatch.setattr(LocalObjectReader, "will_need",
                        lambda self, start, end: hinted.append((self._key, start, end)))
    with _open(tmp_path, compact_fanout=0) as qs:
        view = qs.log_cache.view
        objects, index = view.objects, view.index
        assert len(objects) == 3
        _, starts, stops = index.lookup(3)
        # Everything is in the page cache (just written): no read waits for the disk, so none hints.
        assert qs.get("q3", 0, 3) == [_msg(3, r) for r in range(3)]
        assert hinted == [], "reads served by the page cache hint nothing"
        # The page cache misses from here on: the first read that waits for the disk hints the later runs.
        _miss_the_page_cache(monkeypatch)
        assert qs.get("q4", 1, 1) == [_msg(4, 1)]
        assert hinted == [], "a get inside one run reads ahead nothing"
        assert qs.get("q3", 0, 3) == [_msg(3, r) for r in range(3)]
        assert hinted == [(objects[k].key, starts[k], stops[k]) for k in (1, 2)]


def test_a_consumer_at_the_end_of_a_run_hints_the_next_run_with_messages(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from stratalog.objects.local import LocalObjectReader

    # q3 has messages in the first and third objects only: its run in the second is empty.
    one_object_per_round(tmp_path, [range(10), [q for q in range(10) if q != 3], range(10)], _msg)
    hinted: list[tuple[str, int, int]] = []
    monkeypatch.setattr(LocalObjectReader, "will_need",
                        lambda self, start, end: hinted.append((self._key, start, end)))
    with _open(tmp_path, compact_fanout=0) as qs:
        view = qs.log_cache.view
        objects, index = view.objects, view.index
        _, starts, stops = index.lookup(3)
        assert len(objects) == 3 and starts[1] == stops[1] and stops[2] > starts[2]
        assert qs.get("q3", 0, 1) == [_msg(3, 0)]
        assert hinted == [(objects[2].key, starts[2], stops[2])], "the empty run is skipped"
        assert qs.get("q3", 1, 1) == [_msg(3, 2)]


@pytest.mark.parametrize("in_worker", [False, True], ids=["merge-in-thread", "merge-in-worker"])
def test_uploads_and_merges_write_objects_in_pieces_of_upload_sync_bytes(tmp_path: Path, in_worker: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from stratalog.queues import compactor as compactor_module
    from stratalog.queues import uploader as uploader_module

    steps: list[int | None] = []
    real_put_parts = uploader_module.put_parts
    real_run_merge_job = compactor_module.run_merge_job

    def recording_put_parts(store: object, key: str, parts: object, *, sync_every_bytes: int | None = None,
                            size_hint: int | None = None) -> None:
        steps.append(sync_every_bytes)
        real_put_parts(store, key, parts, sync_every_bytes=sync_every_bytes,  # type: ignore[arg-type]
                       size_hint=size_hint)

    def recording_run_merge_job(job: MergeJob, cancelled: Callable[[], bool]) -> MergeAnswer:
        steps.append(job.sync_every_bytes)     # the worker passes it to put_parts
        return real_run_merge_job(job, cancelled)

    monkeypatch.setattr(uploader_module, "put_parts", recording_put_parts)     # uploads
    monkeypatch.setattr(compactor_module, "put_parts", recording_put_parts)    # merges in a thread
    monkeypatch.setattr(compactor_module, "run_merge_job", recording_run_merge_job)
    with _open(tmp_path, upload_sync_bytes=12345, compact_fanout=2, compact_in_worker=in_worker,
               upload_idle_s=3600.0) as qs:     # uploads when this test asks: one per round
        for r in range(2):
            qs.put_many([f"q{q}" for q in range(20)], [_msg(q, r) for q in range(20)])
            qs.flush()
            qs.uploader.upload()
        wait_until(lambda: qs.stats()["compactions"] >= 1, lambda: f"two uploads' merge: {qs.stats()}")
        assert qs.stats()["compactions"] == 1
    assert len(steps) >= 3 and set(steps) == {12345}    # two uploads and a merge
    with pytest.raises(ValueError, match="upload_sync_bytes"):
        QueueStore.open(tmp_path / "bad", config=small_queue_config(upload_sync_bytes=0))


def _name_dict_bytes(ids: dict[str, int]) -> int:
    """What the names' dict takes, every name and id counted (as stats() reports it, kept as names come)."""
    return sys.getsizeof(ids) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in ids.items())


def test_stats_count_the_bytes_of_every_queue_name_kept_and_recovered(tmp_path: Path) -> None:
    with _open(tmp_path) as qs:
        assert qs.stats()["name_dict_bytes"] == _name_dict_bytes(qs.writer.ids)
        qs.put("first", b"x")
        qs.put_many([f"queue-{i}" for i in range(300)] + ["first"], [b"y"] * 301)
        qs.flush()
        assert len(qs.writer.ids) == 301
        assert qs.stats()["name_dict_bytes"] == _name_dict_bytes(qs.writer.ids)
    with _open(tmp_path) as qs:   # names recovered from the WAL
        assert len(qs.writer.ids) == 301
        assert qs.stats()["name_dict_bytes"] == _name_dict_bytes(qs.writer.ids)
        qs.put("after-recovery", b"z")
        qs.flush()
        assert qs.stats()["name_dict_bytes"] == _name_dict_bytes(qs.writer.ids)


def test_a_non_ascii_name_counts_as_it_was_added(tmp_path: Path) -> None:
    # Python keeps a UTF-8 copy of a non-ASCII str once something asks for one (writing the name does):
    # the name's size grows after it was counted, by that copy at most.
    name = "ü" * 40
    with _open(tmp_path) as qs:
        before = qs.stats()["name_dict_bytes"]
        qs.put(name, b"x")
        qs.flush()
        counted = qs.stats()["name_dict_bytes"]
        assert counted - before >= sys.getsizeof("ü" * 40) + sys.getsizeof(0)
        assert counted <= _name_dict_bytes(qs.writer.ids) <= counted + len(name.encode()) + 1
