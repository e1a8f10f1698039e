"""A random get's read of a run from the page cache, compiled (``_native.read_messages_cached``) and its
twin (``queues.objects.read_messages_cached``), and a sequential get's read of the whole run
(``read_run_cached``, both ways): the same runs, whole or damaged (a flipped byte in a page, ends that do
not frame the run, page CRCs that do not reach the read), and the same bounds give the same messages (the
same run) or the same error. And the compiled core's CRC32C, taken from google-crc32c's library, against
the crc32c package."""

from __future__ import annotations

import ctypes
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from stratalog.native import native_crc
from stratalog.queues.format import page_crcs
from stratalog.queues.objects import read_messages_cached, read_run_cached

Outcome = tuple[str, object]
_files = itertools.count()


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if native_crc is None:
        pytest.fail("the compiled core (with google-crc32c's library) is not loaded: make test builds it")
    yield tmp_path_factory.mktemp("runs")


def outcome(read: object, *args: object) -> Outcome:
    try:
        return "returned", read(*args)  # type: ignore[operator]
    except Exception as e:
        return type(e).__name__, str(e)


def run_bytes(messages: list[bytes]) -> bytes:
    """A run as a run object holds it: each message's end (u32, from the first message's start), then the
    messages."""
    ends = list(itertools.accumulate(map(len, messages)))
    return b"".join(end.to_bytes(4, "little") for end in ends) + b"".join(messages)


def same_read(place: Path, runs: bytes, pages: object, args: tuple[int, ...]) -> Outcome:
    """Both reads of one file holding ``runs`` (``args``: start, end, count, stream_id, first, stop)."""
    path = place / f"object-{next(_files)}"
    path.write_bytes(runs)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        key = path.name
        twin = outcome(read_messages_cached, fd, len(runs), pages, key, *args)
        assert native_crc is not None
        compiled = outcome(native_crc.read_messages_cached, fd, len(runs), pages, key, *args)
        run_twin = outcome(read_run_cached, fd, len(runs), pages, key, *args[:4])
        run_compiled = outcome(native_crc.read_run_cached, fd, len(runs), pages, key, *args[:4])
    finally:
        os.close(fd)
        path.unlink()
    assert compiled == twin, args
    assert run_compiled == run_twin, args
    if run_twin[0] == "returned" and run_twin[1] is not None:
        assert run_twin[1][0] == runs[args[0]:args[1]]   # (the run itself: its framing checked, not cut)
    event(twin[0] if twin[0] != "returned" or twin[1] is not None else "not read")
    return twin


MESSAGES = st.lists(st.binary(max_size=300) | st.sampled_from([b"", b"x" * 58, b"y" * 5000]), max_size=40)


@settings(max_examples=400, deadline=None)
@given(messages=MESSAGES, before=st.integers(0, 9000), after=st.integers(0, 5000), data=st.data())
def test_whole_runs_read_alike(place: Path, messages: list[bytes], before: int, after: int,
                               data: st.DataObject) -> None:
    run = run_bytes(messages)
    runs = os.urandom(before) + run + os.urandom(after)
    first = data.draw(st.integers(0, len(messages)))
    stop = data.draw(st.integers(first, len(messages)))
    got = same_read(place, runs, page_crcs(runs), (before, before + len(run), len(messages), 7, first, stop))
    read_bytes = min(len(runs), -(-(before + len(run)) // 4096) * 4096) - (before - before % 4096)
    if 0 < read_bytes <= 64 << 10:   # within one cached read (just written: in the page cache)
        assert got == ("returned", (messages[first:stop], read_bytes))
    else:
        assert got == ("returned", None)


@settings(max_examples=600, deadline=None)
@given(messages=MESSAGES, before=st.integers(0, 9000), after=st.integers(0, 5000),
       damage=st.sampled_from(["flip", "ends", "short pages", "lying count"]), data=st.data())
def test_damaged_runs_fail_alike(place: Path, messages: list[bytes], before: int, after: int, damage: str,
                                 data: st.DataObject) -> None:
    run = bytearray(run_bytes(messages))
    count = len(messages)
    if damage == "ends" and count:
        at = 4 * data.draw(st.integers(0, count - 1))
        run[at:at + 4] = data.draw(st.integers(0, 1 << 32 - 1)).to_bytes(4, "little")
    if damage == "lying count":
        count = data.draw(st.integers(0, count + 5))
    runs = bytearray(os.urandom(before) + run + os.urandom(after))
    pages = page_crcs(runs)
    if damage == "flip" and run:
        runs[before + data.draw(st.integers(0, len(run) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    if damage == "short pages":
        pages = pages[:data.draw(st.integers(0, len(pages)))]
    first = data.draw(st.integers(0, count))
    stop = data.draw(st.integers(first, count))
    same_read(place, bytes(runs), pages, (before, before + len(run), count, 3, first, stop))


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 20000), start=st.integers(-2, 20002), end=st.integers(-2, 20002),
       count=st.integers(-1, 12), first=st.integers(-1, 13), stop=st.integers(-1, 13))
def test_any_bounds_read_alike(place: Path, size: int, start: int, end: int, count: int, first: int,
                               stop: int) -> None:
    runs = os.urandom(size)
    same_read(place, runs, page_crcs(runs), (start, end, count, 1, first, stop))


def test_pages_the_page_cache_does_not_hold_are_not_read_alike(place: Path) -> None:
    runs = run_bytes([b"m" * 100] * 50) + bytes(100_000)
    path = place / "evicted"
    path.write_bytes(runs)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # clean pages: dropped from the page cache
    assert native_crc is not None
    args = (fd, len(runs), page_crcs(runs), "evicted", 0, 5200, 50, 0, 0, 50)
    assert outcome(native_crc.read_messages_cached, *args) == outcome(read_messages_cached, *args)
    assert outcome(native_crc.read_run_cached, *args[:8]) == outcome(read_run_cached, *args[:8])
    os.close(fd)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=10000), value=st.integers(0, (1 << 32) - 1))
def test_the_compiled_crc32c_is_the_packages(data: bytes, value: int) -> None:
    assert native_crc is not None
    assert native_crc.crc32c(data, value) == crc32c.crc32c(data, value)
    assert native_crc.crc32c(memoryview(data)) == crc32c.crc32c(data)


def test_a_function_that_is_not_crc32c_is_refused() -> None:
    assert native_crc is not None
    constant = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)(lambda c, p, n: 0)
    with pytest.raises(ValueError, match="does not compute CRC32C"):
        native_crc._use_crc32c(ctypes.cast(constant, ctypes.c_void_p).value)
    assert native_crc.crc32c(b"123456789") == 0xE3069283   # the library handed over before is kept
