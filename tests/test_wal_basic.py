"""The WAL's public behaviour: append, ordered durability, trim, wrap, limits, errors, reopen."""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from stratalog.errors import (
    CapacityMismatchError,
    CorruptHeaderError,
    OverCapacityError,
    RecordTooLargeError,
    RecoveryReadError,
    WALClosedError,
    WALFailedError,
    WALStateError,
    WriteBufferFullError,
)
from stratalog.io.faulty import FaultPlan, MemDevice
from stratalog.wal import WriteAheadLog
from stratalog.wal.format import (
    FORMAT_VERSION,
    HEADERS_BYTES,
    ShutdownType,
    WALHeader,
    crc32c,
    encode_header,
)
from waiting import WAIT_S
from walkit import CAPACITY_BYTES, RECORD_BYTES_MAX, new_wal, recover_image, small_config


def test_records_come_back_after_close_and_reopen() -> None:
    wal, device = new_wal()
    bodies = [os.urandom(n) for n in (0, 1, 100, 4000, RECORD_BYTES_MAX)]
    results = [wal.append(b) for b in bodies]
    wal.close()
    assert all(r.future.done() for r in results)
    reopened = WriteAheadLog.open(device, config=small_config())
    assert [(r.offset, r.data) for r in reopened.recover()] == [
        (res.offset, b) for res, b in zip(results, bodies, strict=True)
    ]
    assert reopened.last_shutdown is ShutdownType.GRACEFUL
    reopened.close()


def test_a_record_appended_as_parts_is_their_bytes_in_order() -> None:
    wal, device = new_wal()
    parts = [os.urandom(10), b"", memoryview(os.urandom(300)), bytearray(os.urandom(7)), memoryview(b"xy" * 50)[10:90]]
    joined = b"".join(bytes(p) for p in parts)
    gathered = wal.append(parts)
    whole = wal.append(joined)
    wal.close()
    reopened = WriteAheadLog.open(device, config=small_config())
    assert [(r.offset, r.data) for r in reopened.recover()] == [(gathered.offset, joined), (whole.offset, joined)]
    reopened.close()


def test_offsets_only_grow_and_futures_complete_in_offset_order() -> None:
    wal, _ = new_wal(io_threads=4, block_linger_s=0.0)
    completed: list[int] = []
    lock = threading.Lock()

    def done(fut: Future[int]) -> None:
        with lock:
            completed.append(fut.result())

    rng = random.Random(1)
    futures: list[Future[int]] = []
    offsets = []
    for _ in range(2000):
        res = wal.append(rng.randbytes(rng.randint(1, 2000)))
        offsets.append(res.offset)
        if not futures or futures[-1] is not res.future:
            futures.append(res.future)
            res.future.add_done_callback(done)
        if len(offsets) % 20 == 0:  # at most 25 live records: a 128 KiB ring holds them one per block
            futures[-1].result()
            wal.trim(offsets[-5])
    wal.close()
    assert offsets == sorted(set(offsets))
    assert len(completed) == len(futures) > 10
    assert completed == sorted(completed), "a later block was acknowledged before an earlier one"


def test_a_record_on_an_idle_device_is_written_without_waiting_for_the_linger() -> None:
    # A linger of an hour against a wait of a minute: only a log that waits for the linger misses it, however
    # slow the machine.
    wal, _ = new_wal(seal_when_idle=True, block_linger_s=3600.0)
    try:
        wal.append(b"alone").future.result(timeout=WAIT_S)
    except TimeoutError:
        pytest.fail("the lone record waited for the linger")
    wal.close()


def test_without_seal_when_idle_a_lone_record_waits_for_the_linger() -> None:
    wal, _ = new_wal(seal_when_idle=False, block_linger_s=0.3)
    started = time.monotonic()
    wal.append(b"alone").future.result(timeout=WAIT_S)
    assert time.monotonic() - started >= 0.25
    wal.close()


def test_records_gather_into_one_block_while_every_io_thread_is_busy() -> None:
    wal, device = new_wal(seal_when_idle=True, block_linger_s=3600.0, io_threads=2)
    device.stall_syncs()
    first = wal.append(b"a")  # each takes a free I/O thread at once, then waits in sync
    second = wal.append(b"b")
    assert first.future is not second.future
    gathered = [wal.append(bytes([i]) * 10) for i in range(8)]
    assert len({r.future for r in gathered}) == 1, "records sealed one by one while no thread was free"
    assert gathered[0].future is not second.future
    device.release_syncs()
    # Sealed when a thread came free, long before the hour's linger (a wait for it times out here).
    assert gathered[-1].future.result(timeout=WAIT_S) >= gathered[-1].offset
    assert first.future.result(timeout=WAIT_S) < second.future.result(timeout=WAIT_S)
    wal.close()


def test_future_result_is_the_durable_offset() -> None:
    wal, _ = new_wal()
    res = wal.append(b"x" * 100)
    durable = res.future.result(timeout=WAIT_S)
    assert durable > res.offset
    assert wal.durable_offset >= durable
    wal.close()


def test_trim_hides_records_and_backwards_trim_is_a_no_op() -> None:
    wal, device = new_wal()
    results = [wal.append(bytes([i]) * 50) for i in range(10)]
    results[-1].future.result()
    wal.trim(results[4].offset)
    wal.trim(results[2].offset)  # backwards: ignored
    assert wal.trim_offset == results[4].offset
    image = device.durable_image()  # a power cut right after trim returned
    assert [r.offset for r in recover_image(image)] == [r.offset for r in results[5:]]
    wal.close()


def test_trim_to_anything_but_a_durable_record_is_an_error() -> None:
    wal, _ = new_wal(block_linger_s=10.0)
    first = wal.append(b"a" * 100)
    pending = wal.append(b"b" * 100)  # not sealed for 10 s: not durable
    with pytest.raises(ValueError, match="only durable records"):
        wal.trim(pending.offset)
    wal.close()
    wal, _ = new_wal()
    first = wal.append(b"a" * 100)
    second = wal.append(b"b" * 100)
    second.future.result()
    with pytest.raises(ValueError, match="no record starts there"):
        wal.trim(first.offset + 10)  # inside a record: recovery could not find its way from there
    wal.trim(first.offset)
    assert wal.trim_offset == first.offset
    wal.close()


def test_newer_format_version_is_a_clear_error() -> None:
    image = bytearray(CAPACITY_BYTES)
    header = bytearray(encode_header(WALHeader(1, CAPACITY_BYTES, -1, 64 << 10, ShutdownType.UNCLEAN)))
    header[4:6] = (FORMAT_VERSION + 1).to_bytes(2, "little")
    header[40:44] = crc32c(bytes(header[:40])).to_bytes(4, "little")
    image[:len(header)] = header
    with pytest.raises(CorruptHeaderError, match="upgrade stratalog"):
        WriteAheadLog.open(MemDevice(len(image), image=image), config=small_config())


def test_formatting_a_device_with_blank_headers_clears_an_older_log() -> None:
    old, device = new_wal()
    for _ in range(20):  # one block each: they sit at the offsets the new log writes first
        old.append(b"from an older log").future.result()
    old.close()
    image = device.durable_image()
    image[:HEADERS_BYTES] = bytes(HEADERS_BYTES)  # headers wiped, ring intact
    fresh_device = MemDevice(len(image), image=image)
    wal = WriteAheadLog.open(fresh_device, capacity_bytes=CAPACITY_BYTES, config=small_config())
    assert list(wal.recover()) == []
    wal.append(b"new").future.result()
    wal.close()
    assert [r.data for r in recover_image(fresh_device.durable_image())] == [b"new"]


def test_ring_wraps_many_laps_with_padding() -> None:
    wal, device = new_wal()
    rng = random.Random(7)
    kept: list[tuple[int, bytes]] = []
    for _ in range(3000):
        body = rng.randbytes(rng.randint(100, 3000))
        res = wal.append(body)
        kept.append((res.offset, body))
        if len(kept) % 20 == 0:
            wal.append(b"")  # an empty record is a record too
            res.future.result()
            wal.trim(kept[-10][0])
            kept = kept[-9:]
    last = wal.append(b"last")
    last.future.result()
    wal.close()
    assert last.offset > 10 * CAPACITY_BYTES, "the test did not wrap the ring"
    recovered = [(r.offset, r.data) for r in recover_image(device.durable_image())]
    assert [x for x in recovered if x[1]][: len(kept)] == kept
    assert recovered[-1] == (last.offset, b"last")


def test_full_ring_raises_over_capacity_until_trimmed() -> None:
    wal, _ = new_wal()
    results = []
    with pytest.raises(OverCapacityError, match="ring is full"):
        for _ in range(1000):
            results.append(wal.append(b"z" * 4000))
    results[-1].future.result()
    wal.trim(results[-1].offset)
    wal.append(b"room again").future.result()
    wal.close()


def test_oversize_record_is_refused_and_nothing_else_changes() -> None:
    wal, _ = new_wal()
    first = wal.append(b"ok")
    with pytest.raises(RecordTooLargeError, match="record_bytes_max"):
        wal.append(b"x" * (RECORD_BYTES_MAX + 1))
    with pytest.raises(RecordTooLargeError, match="record_bytes_max"):
        wal.append([b"x" * RECORD_BYTES_MAX, b"y"])     # the parts together
    second = wal.append(b"ok2")
    second.future.result()
    wal.close()
    assert second.offset > first.offset


def test_append_before_recover_is_refused() -> None:
    wal, device = new_wal()
    wal.append(b"a").future.result()
    wal.close()
    reopened = WriteAheadLog.open(device, config=small_config())
    with pytest.raises(WALStateError, match="recover"):
        reopened.append(b"b")
    list(reopened.recover())
    reopened.append(b"b").future.result()
    reopened.close()
    with pytest.raises(WALClosedError):
        reopened.append(b"c")


def test_write_error_stops_the_log_and_acknowledges_nothing_after() -> None:
    wal, _ = new_wal(faults=FaultPlan(fail_writes={6}), block_linger_s=0.0)
    results = []
    with pytest.raises(WALFailedError, match="I/O error"):
        for i in range(10_000):
            results.append(wal.append(bytes([i % 256]) * 500))
            if i % 7 == 0:
                results[-1].future.exception()
    outcomes = [r.future.exception(timeout=5) for r in results]
    first_error = next(i for i, e in enumerate(outcomes) if e is not None)
    assert all(isinstance(e, WALFailedError) for e in outcomes[first_error:]), "acknowledged after an error"
    assert wal.failure is not None
    with pytest.raises(WALFailedError):
        wal.trim(results[0].offset)
    wal.close()


def test_sync_error_stops_the_log() -> None:
    wal, device = new_wal(faults=FaultPlan(fail_syncs={4}))
    results = [wal.append(b"s" * 300) for _ in range(3)]
    acked_before = []
    for _ in range(50):
        res = wal.append(b"s" * 300)
        results.append(res)
        if res.future.exception(timeout=5) is not None:
            break
        acked_before.append(res.offset)
    assert isinstance(results[-1].future.exception(), WALFailedError)
    with pytest.raises(WALFailedError):
        wal.append(b"after")
    wal.close()
    survivors = {r.offset for r in recover_image(device.durable_image())}
    assert set(acked_before) <= survivors


def test_read_error_during_recovery_is_raised_not_taken_for_the_end() -> None:
    wal, device = new_wal()
    wal.append(b"r" * 100).future.result()
    wal.close()
    image = device.durable_image()
    faulty = MemDevice(len(image), image=image, faults=FaultPlan(fail_reads={2}))  # 1: headers, 2: ring
    reopened = WriteAheadLog.open(faulty, config=small_config())
    with pytest.raises(RecoveryReadError, match="recovery stopped"):
        list(reopened.recover())


def test_real_file_roundtrip_and_capacity_checks(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = WriteAheadLog.open(path, capacity_bytes=CAPACITY_BYTES, config=small_config())
    list(wal.recover())
    res = wal.append(b"on disk")
    res.future.result()
    wal.close()
    assert path.stat().st_size == CAPACITY_BYTES
    with pytest.raises(CapacityMismatchError, match="capacity_bytes="):
        WriteAheadLog.open(path, capacity_bytes=2 * CAPACITY_BYTES, config=small_config())
    reopened = WriteAheadLog.open(path, config=small_config())
    assert [(r.offset, r.data) for r in reopened.recover()] == [(res.offset, b"on disk")]
    reopened.close()
    os.truncate(path, CAPACITY_BYTES - 4096)
    with pytest.raises(CapacityMismatchError, match="truncated"):
        WriteAheadLog.open(path, config=small_config())


def test_missing_file_without_create_and_foreign_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        WriteAheadLog.open(tmp_path / "absent", capacity_bytes=CAPACITY_BYTES, create=False)
    foreign = tmp_path / "foreign"
    foreign.write_bytes(os.urandom(CAPACITY_BYTES))
    with pytest.raises(CorruptHeaderError):
        WriteAheadLog.open(foreign, config=small_config())


def test_recovery_after_hole_positions_the_writer_after_recovered_records() -> None:
    wal, device = new_wal()
    first = [wal.append(b"1" * 200) for _ in range(5)]
    first[-1].future.result()
    wal.close()
    records, reopened = recover_and_keep(device.durable_image())
    assert [r.offset for r in records] == [r.offset for r in first]
    res = reopened.append(b"after recovery")
    assert res.offset > first[-1].offset
    res.future.result()
    reopened.close()


def recover_and_keep(image: bytearray) -> tuple[list[object], WriteAheadLog]:
    device = MemDevice(len(image), image=image)
    wal = WriteAheadLog.open(device, config=small_config())
    return list(wal.recover()), wal


def test_config_rejects_a_window_smaller_than_a_block() -> None:
    with pytest.raises(ValueError, match="window_bytes_max"):
        small_config(window_bytes_max=4096).validate()


def _fill_write_buffer(wal: WriteAheadLog) -> list[Future[int]]:
    """Appends until the write buffer (64 KiB: four blocks of 16 KiB) has no room for another block; their
    futures."""
    futures = []
    while True:
        try:
            futures.append(wal.append(bytes(6 << 10), wait_s_max=0).future)
        except WriteBufferFullError:
            return futures


def test_an_append_that_may_not_wait_is_refused_at_once_while_the_buffer_is_full() -> None:
    wal, device = new_wal(seal_when_idle=True)
    device.stall_syncs()   # nothing is acknowledged: the buffer stays full
    futures = _fill_write_buffer(wal)
    assert 4 <= len(futures) <= 8   # 4 blocks, each of one or two records
    with pytest.raises(WriteBufferFullError, match="slower than the appends"):
        wal.append(b"one more", wait_s_max=0)
    assert wal.wait_for_room(100, timeout_s=0.05) is False
    device.release_syncs()
    assert wal.wait_for_room(100, timeout_s=WAIT_S) is True
    wal.append(b"one more", wait_s_max=0).future.result(timeout=WAIT_S)
    assert all(f.done() and f.exception() is None for f in futures)
    wal.close()


def test_an_append_that_may_wait_takes_the_room_a_completion_frees() -> None:
    wal, device = new_wal(seal_when_idle=True)
    device.stall_syncs()
    _fill_write_buffer(wal)
    appended: list[int] = []
    waiter = threading.Thread(target=lambda: appended.append(wal.append(b"waits", wait_s_max=WAIT_S).offset))
    waiter.start()
    assert wal.wait_for_room(100, timeout_s=0.05) is False   # still full: the waiter waits too
    device.release_syncs()
    waiter.join(timeout=WAIT_S)
    assert len(appended) == 1
    wal.close()


def test_a_record_larger_than_the_write_buffer_goes_alone() -> None:
    """buffered_bytes_max bounds what waits for the device; a record larger than it (up to record_bytes_max)
    is written once nothing else is buffered, rather than refused."""
    wal, _ = new_wal(seal_when_idle=True, block_bytes_soft_max=4096, buffered_bytes_max=8192)
    small = wal.append(b"first")
    large = wal.append(bytes(RECORD_BYTES_MAX))   # a block of 12 KiB, over the 8 KiB bound
    assert large.future.result(timeout=WAIT_S) > large.offset
    assert small.future.done()
    wal.close()


def test_closing_ends_a_wait_for_room() -> None:
    wal, device = new_wal(seal_when_idle=True)
    device.stall_syncs()
    _fill_write_buffer(wal)
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(wal.wait_for_room(100, timeout_s=3600)))
    waiter.start()
    device.release_syncs()
    wal.close()
    waiter.join(timeout=WAIT_S)
    assert waited and not waiter.is_alive()
