"""The run objects of a queue store: their keys, and how a get reads a queue's run from one of them.

A run object (docs/formats/queues.md) holds a run for each of its queues, one after another in queue order,
and a CRC for each 4 KiB page of the runs. Where a queue's run lies is the store's RunIndex's to say; this
module reads it: the pages it lies in with one ranged read, each checked against its CRC before any
message is taken from it. Three readers: a random one (an index check) takes its messages straight from
the pages read; a sequential one (a consumer) may read the run from a chunk read ahead for consumers
walking the queues in order, or keep it for its next get; and either waits for the disk (or the object
store) only when the page cache does not hold the pages.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from stratalog.caching import BoundedCache
from stratalog.io import libc
from stratalog.io.libc import CACHED_READ_BYTES_MAX
from stratalog.native import native_crc
from stratalog.objects.store import ObjectStore
from stratalog.queues.format import (
    PAGE_BYTES,
    CorruptBulkError,
    U32s,
    check_pages,
    frame_run,
    page_span,
    run_messages,
)
from stratalog.wal.format import crc32c

#: What a random get needs of one object to read from it: ``(fd or -1, runs_bytes, pages, key)`` (-1: no
#: local file; its runs come through the object store).
ReadArgs = tuple[int, int, U32s, str]
#: Every queue object's key starts so (an upload's and a merge's).
QUEUE_PREFIX = "queues/"
#: What the compiled twins take (a message count is a uint32, a file descriptor a C int): the reads check
#: the same bounds.
COUNT_LIMIT, FD_LIMIT = 0xFFFF_FFFF, 0x7FFF_FFFF


def queue_object_key(object_id: int, first_id: int | None = None) -> str:
    """An uploaded object's key; a merged object's also names the first object it replaces, which is its
    place in the order of objects (the order recovery reads them in)."""
    if first_id is None:
        return f"{QUEUE_PREFIX}{object_id:016x}.slq"
    return f"{QUEUE_PREFIX}{first_id:016x}-{object_id:016x}.slq"


def object_order(key: str, object_id: int) -> tuple[int, int]:
    """Where an object stands among the queue objects: uploads in id order, a merged object in the place
    of the first object it replaced."""
    name = key[len(QUEUE_PREFIX):].split(".", 1)[0]
    first = name.split("-", 1)[0]
    try:
        return int(first, 16), object_id
    except ValueError:
        raise CorruptBulkError(f"queue object key {key!r} does not name its place") from None


#: Read-ahead across queues (see RunObject.read_run_ahead; its bounds are QueueConfig's read_ahead_*): a
#: walk starts where a sequential reader's run starts near where the last sequential read in its object
#: ended, and goes on into the next chunk while the last one served enough runs. Each object keeps its
#: last chunks, for reader threads that drift apart. docs/formats/queues.md says how.


@dataclass(slots=True, eq=False)
class RunObject:
    """One run object (an upload, or a merge of several); where its runs lie is in the RunIndex, in the
    column of its place in the view's objects."""

    object_id: int
    key: str
    reader: Any              # LocalObjectReader, or None: ranged gets through the ObjectStore
    size_bytes: int
    pages: U32s              # the CRC of each page of its runs
    runs_bytes: int
    #: Where the last run a sequential reader read here ended, and the chunks read ahead for readers walking
    #: this object's runs in order: chunk c is bytes ``c * read_ahead_bytes ..`` of the runs, its pages
    #: checked, with the runs it has served (``[bytes, runs]``), oldest out first, counted against the
    #: object's share of QueueConfig.read_ahead_cache_bytes. Shared by reader threads: a lost update of a
    #: chunk's count of runs costs a read, never a wrong answer.
    walk_end: int = -1
    chunks: BoundedCache[int, list[Any]] = field(default_factory=lambda: BoundedCache(0, _one_chunk, lru=False))

    def read_run_ahead(self, store: ObjectStore, start: int, end: int, count: int, stream_id: int,
                       ahead_bytes: int, chunks_max: int, walk_span: int, walk_runs_min: int
                       ) -> tuple[bytes, int] | None:
        """Bytes ``start .. end`` of the runs (one run of ``count`` messages of ``stream_id``) for a sequential
        reader, checked and framed, and the bytes read: from a chunk read ahead if one holds them; else,
        if readers are walking this object's runs in order, read with the rest of its chunk (keeping at
        most ``chunks_max``): consumers of neighbouring queues then read their runs from memory, as the
        queues share this object's pages. None: neither (read just the run). A walk starts where the run
        starts within ``ahead_bytes / walk_span`` of where the last sequential read here ended, and goes on
        while the chunk before served at least ``walk_runs_min`` runs."""
        c = start // ahead_bytes
        chunks = self.chunks
        if chunks.size:
            held = chunks.get(c)
            if held is not None and end <= (c + 1) * ahead_bytes:
                held[1] += 1
                lo = c * ahead_bytes
                raw = held[0][start - lo:end - lo]
                frame_run(raw, count, self.key, stream_id)
                return raw, 0
        walked = self.walk_end
        self.walk_end = end
        if not -ahead_bytes <= walk_span * (start - walked) <= ahead_bytes:
            before = chunks.get(c - 1) if chunks.size else None
            if before is None or before[1] < walk_runs_min:
                return None
        if (end - 1) // ahead_bytes != c:
            return None    # across two chunks (rare: a run is a few KiB at most here)
        lo = c * ahead_bytes
        hi = min(lo + ahead_bytes, self.runs_bytes)
        view = self.reader.peek(lo, hi) if self.reader is not None else None
        data = view if view is not None else self.read(store, lo, hi)
        try:
            if len(data) != hi - lo:
                raise CorruptBulkError(f"object {self.key} is shorter than its index says")
            check_pages(data, lo, self.pages, self.key)
        except CorruptBulkError:
            return None    # a damaged page, maybe not this run's: the run is read and checked alone
        data = data.tobytes() if isinstance(data, memoryview) else data
        # The bound is the object's share of the read-ahead budget, which changes with the number of objects.
        chunks.size_max = chunks_max
        chunks.put(c, [data, 1])
        raw = data[start - lo:end - lo]
        frame_run(raw, count, self.key, stream_id)
        return raw, hi - lo

    @property
    def read_args(self) -> ReadArgs:
        """What :func:`read_random_cached` reads this object with."""
        return (-1 if self.reader is None else self.reader.random_fd, self.runs_bytes, self.pages, self.key)

    def read(self, store: ObjectStore, start: int, end: int, random_access: bool = False) -> bytes:
        if self.reader is None:
            return store.get(self.key, start, end)
        data: bytes = self.reader.read(start, end, random_access=random_access)
        return data

    def read_run_cached(self, start: int, end: int, count: int, stream_id: int) -> tuple[bytes, int] | None:
        """Bytes ``start .. end`` of the runs (one run of ``count`` messages of ``stream_id``), checked
        against their pages' CRCs and framed, and the bytes of pages read, if the page cache holds the
        pages; None if the read would wait for the disk (or the object is not local). A sequential
        reader's path (it may keep the run): one system call, the pages checked where they were read, only
        the run copied out. One compiled call where the core is built (:func:`read_run_cached` is its twin)."""
        reader = self.reader
        if reader is None:
            return None
        return _read_run_cached(reader.fd, self.runs_bytes, self.pages, self.key, start, end, count, stream_id)

    def read_run(self, store: ObjectStore, start: int, end: int, count: int, stream_id: int,
                 random_access: bool) -> tuple[bytes, int]:
        """What :meth:`read_run_cached` reads, waiting for the disk or the object store if need be."""
        lo, hi = page_span(start, end, self.runs_bytes)
        reader = self.reader
        pages: bytes = store.get(self.key, lo, hi) if reader is None else reader.read(
            lo, hi, random_access=random_access, cached_first=False)
        if len(pages) != hi - lo:
            raise CorruptBulkError(f"object {self.key} is shorter than its index says")
        check_pages(pages, lo, self.pages, self.key)
        raw = pages[start - lo:end - lo] if hi - lo != end - start else pages
        frame_run(raw, count, self.key, stream_id)
        return raw, hi - lo


def read_messages_cached(fd: int, runs_bytes: int, pages: U32s, key: str, start: int, end: int, count: int,
                         stream_id: int, first: int, stop: int) -> tuple[list[bytes], int] | None:
    """Messages ``first .. stop - 1`` of the run at bytes ``start .. end`` of the runs of object ``key``
    (open as ``fd``, whose runs take ``runs_bytes`` and whose pages have the CRCs ``pages``), ``count``
    messages of ``stream_id``; and the bytes of the pages read. None where the page cache does not hold
    them all (the read keeps the GIL and would not wait: libc.cached_view). Raises CorruptBulkError
    where a page fails its CRC or the run's ends do not frame it; ValueError for a run or messages out
    of bounds. The twin of ``stratalog._native.read_messages_cached``."""
    if not (0 <= start <= end <= runs_bytes and 0 <= first <= stop <= count <= COUNT_LIMIT and 0 <= fd <= FD_LIMIT):
        raise ValueError(f"a run at bytes {start} .. {end} of {runs_bytes}, messages {first} .. {stop} of {count}: "
                         "out of bounds")
    cached = _cached_pages(fd, runs_bytes, start, end)
    if cached is None:
        return None
    view, lo, hi = cached
    # One page (most runs): its CRC compared here, one call fewer; the rest, and any mismatch, by
    # check_pages (which names the damaged page, or says the read is not within the pages).
    if hi - lo > PAGE_BYTES or lo // PAGE_BYTES >= len(pages) or crc32c(view) != pages.item(lo // PAGE_BYTES):
        check_pages(view, lo, pages, key)
    return run_messages(view[start - lo:end - lo], count, first, stop, key, stream_id), hi - lo


def read_run_cached(fd: int, runs_bytes: int, pages: U32s, key: str, start: int, end: int, count: int,
                    stream_id: int) -> tuple[bytes, int] | None:
    """The run at bytes ``start .. end`` of the runs of object ``key`` (open as ``fd``; see
    :func:`read_messages_cached`), ``count`` messages of ``stream_id``, its pages checked and its frame
    checked, as bytes to keep; and the bytes of the pages read. None where the page cache does not hold
    them all. Raises CorruptBulkError where a page fails its CRC or the run's ends do not frame it;
    ValueError for a run out of bounds. The twin of ``stratalog._native.read_run_cached``."""
    if not (0 <= start <= end <= runs_bytes and 0 <= count <= COUNT_LIMIT and 0 <= fd <= FD_LIMIT):
        raise ValueError(f"a run at bytes {start} .. {end} of {runs_bytes} ({count} messages): out of bounds")
    cached = _cached_pages(fd, runs_bytes, start, end)
    if cached is None:
        return None
    view, lo, hi = cached
    check_pages(view, lo, pages, key)
    raw = view[start - lo:end - lo].tobytes()
    frame_run(raw, count, key, stream_id)
    return raw, hi - lo


def _cached_pages(fd: int, runs_bytes: int, start: int, end: int) -> tuple[memoryview, int, int] | None:
    """The pages bytes ``start .. end`` of the runs lie in, read from the page cache, and where they start
    and stop; None where the page cache does not hold them all, or they are none or more than one cached
    read takes."""
    lo, hi = page_span(start, end, runs_bytes)
    if not 0 < hi - lo <= CACHED_READ_BYTES_MAX:
        return None
    view = libc.cached_view(fd, hi - lo, lo)
    return None if view is None else (view, lo, hi)


def read_random_cached(ends: memoryview, positions: memoryview, capacity: int, objects: tuple[ReadArgs, ...],
                       stream_id: int, pos: int, stop: int) -> tuple[list[bytes], int, int, int]:
    """A random get's part in the objects, as far as the page cache serves it: messages ``pos .. stop - 1``
    of stream ``stream_id`` from the runs of ``objects`` (column k of the RunIndex is ``objects[k]``; its
    flat matrices ``ends``, ``[rows, capacity]``, and ``positions``, ``[rows + 1, capacity]``). Returns the
    messages, where they stop (``pos`` where nothing was read: the offsets from there are past the objects,
    or in a run the page cache does not hold, or in an object without a local file), and the reads and
    bytes of pages read. Raises as :func:`read_messages_cached`, and ValueError for matrices or arguments
    that do not fit together. The twin of ``stratalog._native.read_random_cached``."""
    count = len(objects)
    if not (0 <= count <= capacity and 0 <= pos <= stop and stream_id >= 0 and len(ends) % max(capacity, 1) == 0
            and len(positions) == len(ends) + capacity):
        raise ValueError(f"{count} objects, capacity {capacity}, matrices of {len(ends)} and {len(positions)}, "
                         f"stream {stream_id}, offsets {pos} .. {stop}: they do not fit together")
    out: list[bytes] = []
    reads = read_bytes = 0
    if count == 0 or stream_id >= len(ends) // capacity:
        return out, pos, reads, read_bytes
    at = stream_id * capacity
    row = ends[at:at + count].tolist()
    k = bisect.bisect_right(row, pos)
    start = row[k - 1] if k else 0
    while pos < stop and k < count:
        end = row[k]
        if end > start:
            fd, runs_bytes, pages, key = objects[k]
            if fd < 0:
                break
            upto = min(stop, end)
            cut = read_messages_cached(fd, runs_bytes, pages, key, positions[at + k], positions[at + capacity + k],
                                       end - start, stream_id, pos - start, upto - start)
            if cut is None:
                break
            out += cut[0]
            reads += 1
            read_bytes += cut[1]
            pos = upto
        start = end
        k += 1
    return out, pos, reads, read_bytes


#: The compiled reads where the core is built with its CRC32C, else the twins above.
_read_run_cached = native_crc.read_run_cached if native_crc is not None else read_run_cached
#: A random get's part in the objects (:func:`read_random_cached`), compiled where the core is built.
read_random_get = native_crc.read_random_cached if native_crc is not None else read_random_cached


def _one_chunk(held: list[Any]) -> int:
    """Chunks are counted, not sized: each is ``read_ahead_bytes`` (the object's last one at most)."""
    return 1
