"""The WAL's two block-write engines behave alike: the compiled writer (threads that never take the GIL)
and its twin, Python threads over the Device. Each write lands where it was sent and is reported once;
a write error reaches ``done``; a failed sync fails every later one (fsyncgate); close finishes what was
submitted. Then the WAL on a file, which takes the compiled writer, stops at a write error as it does on
the fault-injecting device."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratalog.errors import WALFailedError
from stratalog.io.block_io import BlockIO, NativeBlockIO, ThreadedBlockIO
from stratalog.io.device import FileDevice, aligned_buffer
from stratalog.io.faulty import MemDevice
from stratalog.native import native
from stratalog.wal import WriteAheadLog
from waiting import wait_until
from walkit import CAPACITY_BYTES, small_config

ENGINES = ["threads", "compiled"]


class Results:
    """What ``done`` was told, token by token, and an event per count reached."""

    def __init__(self) -> None:
        self.got: dict[object, BaseException | None] = {}
        self.calls = 0
        self._changed = threading.Condition()

    def done(self, token: object, error: BaseException | None) -> None:
        with self._changed:
            assert token not in self.got, f"{token!r} reported twice"
            self.got[token] = error
            self.calls += 1
            self._changed.notify_all()

    def wait_for(self, count: int) -> dict[object, BaseException | None]:
        with self._changed:
            self._changed.wait_for(lambda: self.calls >= count)
            return dict(self.got)


def engine(kind: str, device: FileDevice, results: Results, sync_each: bool, threads: int = 2) -> BlockIO:
    if kind == "threads":
        return ThreadedBlockIO(device, threads, sync_each, results.done, "test-io")
    if native is None:
        pytest.fail("the compiled core is not built: make test builds it")
    return NativeBlockIO(device.fileno(), threads, sync_each, results.done, "test-io")


@pytest.fixture
def file_device(tmp_path: Path) -> Iterator[FileDevice]:
    device = FileDevice.open(tmp_path / "dev", size_bytes=1 << 20, create=True)
    yield device
    device.close()


@pytest.mark.parametrize("kind", ENGINES)
def test_writes_land_where_sent_and_are_reported_once(kind: str, file_device: FileDevice) -> None:
    results = Results()
    io = engine(kind, file_device, results, sync_each=True, threads=3)
    buffers = []
    for n in range(40):
        buf = aligned_buffer(8192)
        buf[:] = bytes([n]) * 8192
        buffers.append(buf)
        io.submit(buf, 4096 * (1 + n % 2), 8192 * n, n)
    assert results.wait_for(40) == {n: None for n in range(40)}
    io.close()
    check = aligned_buffer(8192)
    for n in range(40):
        file_device.pread_into(memoryview(check), 8192 * n)
        length = 4096 * (1 + n % 2)
        assert check[:length] == bytes([n]) * length, f"write {n}"
    for buf in buffers:
        buf.close()  # no export left behind: every buffer is released once reported


@pytest.mark.parametrize("kind", ENGINES)
def test_a_write_error_reaches_done(kind: str, tmp_path: Path) -> None:
    FileDevice.open(tmp_path / "dev", size_bytes=1 << 20, create=True).close()
    read_only = FileDevice.open(tmp_path / "dev", read_only=True)
    results = Results()
    io = engine(kind, read_only, results, sync_each=False)
    io.submit(aligned_buffer(4096), 4096, 0, "w")
    error = results.wait_for(1)["w"]
    assert isinstance(error, OSError) and error.errno == 9, error  # EBADF: the file is open read-only
    io.close()
    read_only.close()


@pytest.mark.parametrize("kind", ENGINES)
def test_a_failed_sync_fails_every_later_one(kind: str) -> None:
    # /dev/null takes writes and refuses fdatasync (EINVAL): a sync that fails.
    null = FileDevice(os.open("/dev/null", os.O_WRONLY | os.O_CLOEXEC), "/dev/null", 1 << 20, False, False)
    results = Results()
    io = engine(kind, null, results, sync_each=True, threads=1)
    for n in range(3):
        io.submit(b"x" * 512, 512, 0, n)
    got = results.wait_for(3)
    syncs = io.syncs()
    io.close()
    null.close()
    assert all(isinstance(e, OSError) and e.errno == 22 for e in got.values()), got
    assert syncs == 1, "after a failed sync, none is tried again"


@pytest.mark.parametrize("kind", ENGINES)
def test_one_thread_syncs_once_a_write(kind: str, file_device: FileDevice) -> None:
    results = Results()
    io = engine(kind, file_device, results, sync_each=True, threads=1)
    buf = aligned_buffer(4096)
    for n in range(10):
        io.submit(buf, 4096, 4096 * n, n)
    assert results.wait_for(10) == {n: None for n in range(10)}
    assert io.syncs() == 10  # no write finishes while a sync runs: nothing to group
    io.close()
    buf.close()


class _CountingCondition(threading.Condition):
    """A condition that knows how many threads wait on it."""

    waiting = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting += 1  # under the condition's lock
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1


def test_one_sync_covers_the_writes_that_finished_while_the_last_ran() -> None:
    device = MemDevice(1 << 20)
    results = Results()
    io = ThreadedBlockIO(device, 3, True, results.done, "test-io")
    syncs_waited = _CountingCondition()
    io._sync_done = syncs_waited  # the twin's group commit, watched
    device.stall_syncs()
    buf = aligned_buffer(4096)
    io.submit(buf, 4096, 0, "first")
    wait_until(lambda: io.syncs() == 1, "the first write's sync to start (and stall)")
    io.submit(buf, 4096, 4096, "second")
    io.submit(buf, 4096, 8192, "third")
    wait_until(lambda: syncs_waited.waiting == 2, "the later writes to wait for the running sync")
    assert device.unsynced_writes() == 3
    device.release_syncs()
    assert results.wait_for(3) == {"first": None, "second": None, "third": None}
    # The first sync may have begun before the later writes ended, so it does not cover them; one more does.
    assert io.syncs() == device.syncs == 2
    assert device.unsynced_writes() == 0
    io.close()
    buf.close()


@pytest.mark.parametrize("kind", ENGINES)
def test_close_finishes_what_was_submitted(kind: str, file_device: FileDevice) -> None:
    results = Results()
    io = engine(kind, file_device, results, sync_each=True, threads=1)
    buf = aligned_buffer(4096)  # direct I/O: an aligned buffer
    for n in range(20):
        io.submit(buf, 4096, 4096 * n, n)
    io.close()
    buf.close()
    assert results.got == {n: None for n in range(20)}


def test_the_wal_on_a_file_stops_at_a_write_error(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = WriteAheadLog.open(path, capacity_bytes=CAPACITY_BYTES, config=small_config())
    list(wal.recover())
    assert isinstance(wal._io, NativeBlockIO if native is not None else ThreadedBlockIO)
    assert wal.append(b"before").future.result() > 0
    device = wal.device
    assert isinstance(device, FileDevice)
    # From here every write of the log's file fails (EBADF), as a dying disk's would with EIO.
    read_only = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(read_only, device.fileno())
    os.close(read_only)
    with pytest.raises(WALFailedError, match="writing"):
        wal.append(b"lost").future.result()
    with pytest.raises(WALFailedError):
        wal.append(b"refused")
    wal.close()
    reopened = WriteAheadLog.open(path, config=small_config())
    assert [r.data for r in reopened.recover()] == [b"before"]
    reopened.close()


def test_compiled_io_off_takes_the_python_threads_on_a_file(tmp_path: Path) -> None:
    wal = WriteAheadLog.open(tmp_path / "wal", capacity_bytes=CAPACITY_BYTES, config=small_config(compiled_io=False))
    list(wal.recover())
    assert isinstance(wal._io, ThreadedBlockIO)
    assert wal.append(b"through python threads").future.result() > 0
    wal.close()


# Results taken by a watching thread (an event loop), the reaper thread as its backstop --------------------


def compiled(device: FileDevice, results: Results, threads: int = 1) -> NativeBlockIO:
    io = engine("compiled", device, results, sync_each=True, threads=threads)
    assert isinstance(io, NativeBlockIO)
    return io


def test_a_watching_thread_takes_the_results_itself(file_device: FileDevice) -> None:
    results = Results()
    io = compiled(file_device, results)
    watch = io.watch(backstop_s=60.0)  # the reaper thread leaves them to this thread for a minute
    callers: list[int] = []
    io._done = lambda token, error: (callers.append(threading.get_ident()), results.done(token, error))  # type: ignore[method-assign]
    buf = aligned_buffer(4096)
    for n in range(5):
        io.submit(buf, 4096, 4096 * n, n)
        while n not in results.got:
            select.select([watch.fd], [], [])  # readable once a write has finished
            watch.reap()
    assert results.got == {n: None for n in range(5)}
    assert set(callers) == {threading.get_ident()}, "a result was completed by another thread"
    watch.release()
    io.close()
    buf.close()


def test_results_the_watcher_leaves_are_taken_by_the_backstop(file_device: FileDevice) -> None:
    results = Results()
    io = compiled(file_device, results)
    io.watch(backstop_s=0.001)  # a watcher that never reaps: a blocked event loop
    buf = aligned_buffer(4096)
    for n in range(5):
        io.submit(buf, 4096, 4096 * n, n)
    assert results.wait_for(5) == {n: None for n in range(5)}
    io.close()
    buf.close()


def test_after_release_the_reaper_takes_every_result_again(file_device: FileDevice) -> None:
    results = Results()
    io = compiled(file_device, results)
    io.watch(backstop_s=60.0).release()
    buf = aligned_buffer(4096)
    io.submit(buf, 4096, 0, "after")
    assert results.wait_for(1) == {"after": None}  # not a minute later: at once, by the reaper
    io.close()
    buf.close()


@pytest.mark.parametrize("stale_s", [-1.0, 61.0, float("nan")])
def test_the_writer_refuses_a_backstop_out_of_bounds(file_device: FileDevice, stale_s: float) -> None:
    if native is None:
        pytest.fail("the compiled core is not built: make test builds it")
    writer = native.BlockWriter(file_device.fileno(), 1, True)
    with pytest.raises(ValueError, match="0 to 60 seconds"):
        writer.set_backstop(stale_s)
    writer.stop()
    assert writer.wait() is False  # stopped: nothing will come


def test_the_wal_completes_appends_in_the_watching_thread(tmp_path: Path) -> None:
    wal = WriteAheadLog.open(tmp_path / "wal", capacity_bytes=CAPACITY_BYTES, config=small_config())
    list(wal.recover())
    watch = wal.watch_completions(backstop_s=60.0)
    assert watch is not None
    result = wal.append(b"completed here")
    while not result.future.done():
        select.select([watch.fd], [], [])
        watch.reap()
    assert result.future.result() > 0
    watch.release()
    wal.close()
    with_threads = WriteAheadLog.open(tmp_path / "wal2", capacity_bytes=CAPACITY_BYTES,
                                      config=small_config(compiled_io=False))
    list(with_threads.recover())
    assert with_threads.watch_completions(backstop_s=0.005) is None  # Python threads complete their own
    with_threads.close()
