"""A random get's read of a run from the page cache, compiled (``_native.read_messages_cached``) and its
twin (``queues.objects.read_messages_cached``), and a sequential get's read of the whole run
(``read_run_cached``, both ways): the same runs, whole or damaged (a flipped byte in a page, ends that do
not frame the run, page CRCs that do not reach the read), and the same bounds give the same messages (the
same run) or the same error. And the compiled core's CRC32C, taken from google-crc32c's library, against
the crc32c package."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from examples import examples
from stratalog.native import native_crc
from stratalog.queues.format import page_crcs
from stratalog.queues.objects import read_messages_cached, read_random_cached, read_run_cached

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


@settings(max_examples=examples(400), deadline=None)
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


@settings(max_examples=examples(600), deadline=None)
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


@settings(max_examples=examples(300), deadline=None)
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
    assert native_crc is not None
    args = (fd, len(runs), page_crcs(runs), "evicted", 0, 5200, 50, 0, 0, 50)

    def evicted(read: object, *read_args: object) -> Outcome:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # clean pages: dropped from the page cache
        return outcome(read, *read_args)

    for mine, twin, read_args in ((native_crc.read_messages_cached, read_messages_cached, args),
                                  (native_crc.read_run_cached, read_run_cached, args[:8])):
        # A read the page cache could not serve may start the kernel's readahead, whose pages can land
        # after the next call's eviction and serve it: tried again until the pages stay out for both.
        seen = []
        for _ in range(100):
            seen.append((evicted(mine, *read_args), evicted(twin, *read_args)))
            if seen[-1] == (("returned", None), ("returned", None)):
                break
        assert seen[-1] == (("returned", None), ("returned", None)), seen[-3:]
    os.close(fd)


@settings(max_examples=examples(300), deadline=None)
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


# A random get's whole part in the objects: read_random_cached ---------------------------------------------


def message_of(stream: int, offset: int) -> bytes:
    return b"%d:%d|" % (stream, offset) + b"m" * ((stream * 7 + offset) % 90)


@dataclass
class Objects:
    """Run objects written to files, and the RunIndex's flat matrices over them."""

    ends: memoryview
    positions: memoryview
    capacity: int
    args: tuple[tuple[int, int, Any, str], ...]
    totals: list[int]        # each stream's messages in all
    fds: list[int]


def write_objects(place: Path, counts: list[list[int]], spare: int) -> Objects:
    """Objects holding ``counts[k][s]`` messages of stream s in object k (offsets go on from object to
    object), with ``spare`` unused columns in the matrices."""
    streams = max((len(c) for c in counts), default=0)
    capacity = len(counts) + spare
    ends = np.zeros((streams, capacity), np.uint32)
    positions = np.zeros((streams + 1, capacity), np.uint32)
    totals = [0] * streams
    args, fds = [], []
    for k, per_stream in enumerate(counts):
        runs = b""
        for s in range(streams):
            positions[s, k] = len(runs)
            n = per_stream[s] if s < len(per_stream) else 0
            runs += run_bytes([message_of(s, totals[s] + i) for i in range(n)]) if n else b""
            totals[s] += n
            ends[s, k] = totals[s]
        positions[streams, k] = len(runs)
        path = place / f"object-{next(_files)}"
        path.write_bytes(runs)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        path.unlink()   # open: read until closed
        fds.append(fd)
        args.append((fd, len(runs), page_crcs(runs), path.name))
    flat = [m.reshape(-1).data.cast("B").cast("I") for m in (ends, positions)]
    return Objects(flat[0], flat[1], capacity, tuple(args), totals, fds)


def same_random_read(objects: Objects, stream_id: int, pos: int, stop: int,
                     args: tuple[tuple[int, int, Any, str], ...] | None = None) -> Outcome:
    call = (objects.ends, objects.positions, objects.capacity, objects.args if args is None else args, stream_id,
            pos, stop)
    twin = outcome(read_random_cached, *call)
    assert native_crc is not None
    assert outcome(native_crc.read_random_cached, *call) == twin, (stream_id, pos, stop)
    return twin


COUNTS = st.lists(st.lists(st.integers(0, 120), max_size=6), max_size=5)


@settings(max_examples=examples(300), deadline=None)
@given(counts=COUNTS, spare=st.integers(0, 3), data=st.data())
def test_random_gets_across_objects_read_alike_and_right(place: Path, counts: list[list[int]], spare: int,
                                                         data: st.DataObject) -> None:
    objects = write_objects(place, counts, spare)
    try:
        stream_id = data.draw(st.integers(0, len(objects.totals) + 1))
        pos = data.draw(st.integers(0, 400))
        stop = data.draw(st.integers(pos, 420))
        got = same_random_read(objects, stream_id, pos, stop)
        total = objects.totals[stream_id] if stream_id < len(objects.totals) else 0
        reached = max(pos, min(stop, total))
        assert got[0] == "returned"
        messages, at, reads, read_bytes = got[1]   # type: ignore[misc]
        # Every run was just written: the page cache holds it, so the get reads all it can.
        assert (messages, at) == ([message_of(stream_id, o) for o in range(pos, reached)], reached)
        assert (reads == 0) == (reached == pos) and (read_bytes == 0) == (reads == 0)
    finally:
        for fd in objects.fds:
            os.close(fd)


def test_a_get_stops_at_an_object_without_a_local_file_and_at_pages_not_cached(place: Path) -> None:
    objects = write_objects(place, [[30, 5], [30, 5], [30, 5]], 1)
    try:
        # Object 1 has no local file: the get stops where its run begins.
        remote = (objects.args[0], (-1, *objects.args[1][1:]), objects.args[2])
        got = same_random_read(objects, 0, 10, 80, remote)
        assert got == ("returned", ([message_of(0, o) for o in range(10, 30)], 30, 1, objects.args[0][1]))
        # Object 0's pages dropped from the page cache: nothing read, the get stays where it began.
        fd = objects.fds[0]
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        got = same_random_read(objects, 0, 10, 80)
        assert got[0] == "returned" and got[1][1] in (10, 80)   # type: ignore[index]
    finally:
        for fd in objects.fds:
            os.close(fd)


@pytest.mark.parametrize("damage", ["capacity", "positions", "offsets", "falling ends", "flip"])
def test_matrices_that_do_not_fit_and_damaged_runs_fail_alike(place: Path, damage: str) -> None:
    objects = write_objects(place, [[40, 3], [40, 3]], 0)
    try:
        if damage == "capacity":
            got = same_random_read(dataclasses.replace(objects, capacity=1), 0, 0, 10)
            assert got[0] == "ValueError" and "do not fit together" in str(got[1])
        elif damage == "positions":
            short = dataclasses.replace(objects, positions=objects.positions[:-1])
            assert same_random_read(short, 0, 0, 10)[0] == "ValueError"
        elif damage == "offsets":
            assert same_random_read(objects, 0, 10, 5)[0] == "ValueError"
        elif damage == "falling ends":
            ends = np.frombuffer(objects.ends, np.uint32).copy()
            ends[0], ends[1] = 60, 10   # stream 0: 60 after object 0, then 10
            flat = ends.data.cast("B").cast("I")
            # Offset 5 is then in object 0's run, which is said to hold 60 messages (it holds 40).
            got = same_random_read(dataclasses.replace(objects, ends=flat), 0, 5, 50)
            assert got[0] == "CorruptBulkError" and "message ends do not match" in str(got[1])
        else:
            fd, runs_bytes, pages, key = objects.args[0]
            damaged = pages.copy()
            damaged[0] ^= 1
            got = same_random_read(objects, 0, 0, 10, ((fd, runs_bytes, damaged, key), objects.args[1]))
            assert got[0] == "CorruptBulkError" and "failed its CRC" in str(got[1])
    finally:
        for fd in objects.fds:
            os.close(fd)

