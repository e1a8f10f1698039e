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

import contextlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from stratalog.io import libc
from stratalog.io.libc import CACHED_READ_BYTES_MAX
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

#: Every queue object's key starts so (an upload's and a merge's).
QUEUE_PREFIX = "queues/"


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


#: Read-ahead across queues (see RunObject.read_run_ahead). A walk starts where a sequential reader's run
#: starts within 1/WALK_SPAN of the read-ahead size (4 KiB of 64 KiB) of where the last sequential read in
#: its object ended, and goes on into the next chunk while the last one served at least WALK_RUNS_MIN runs.
#: A chunk of 64 KiB costs what four or five reads of one run do (the copy and a CRC per page), so it must
#: serve well more than that. Each object keeps its last chunks (QueueConfig.read_ahead_cache_bytes, at
#: least CHUNKS_PER_OBJECT_MIN), for reader threads that drift apart. Measured on 1 M queues in 7 objects,
#: 20% consumed in order (the bench's consume): one thread 2.54 -> 2.77 M msg/s (6 -> 1.1 object reads per
#: queue). 8 threads, each taking every 8th queue, drift apart by more than 16 chunks: with 16 per object,
#: 13 objects, they read a chunk ~3 times as often as one thread does and were slower than with no
#: read-ahead (1.3-1.5 vs 1.75 M msg/s); with 128-256 per object, 1.9-2.1 M.
WALK_SPAN = 16
WALK_RUNS_MIN = 16
CHUNKS_PER_OBJECT_MIN = 16


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
    #: checked, with the runs it has served (``[bytes, runs]``), oldest first. Shared by reader threads
    #: without a lock: entries are added and removed whole, and a lost update costs a read, never a
    #: wrong answer.
    walk_end: int = -1
    chunks: OrderedDict[int, list[Any]] = field(default_factory=OrderedDict)

    def read_run_ahead(self, store: ObjectStore, start: int, end: int, count: int, stream_id: int,
                       ahead_bytes: int, chunks_max: int) -> tuple[bytes, int] | None:
        """Bytes ``start .. end`` of the runs (one run of ``count`` messages of ``stream_id``) for a sequential
        reader, checked and framed, and the bytes read: from a chunk read ahead if one holds them; else,
        if readers are walking this object's runs in order, read with the rest of its chunk (keeping at
        most ``chunks_max``): consumers of neighbouring queues then read their runs from memory, as the
        queues share this object's pages. None: neither (read just the run)."""
        c = start // ahead_bytes
        chunks = self.chunks
        if chunks:
            held = chunks.get(c)
            if held is not None and end <= (c + 1) * ahead_bytes:
                held[1] += 1
                lo = c * ahead_bytes
                raw = held[0][start - lo:end - lo]
                frame_run(raw, count, self.key, stream_id)
                return raw, 0
        walked = self.walk_end
        self.walk_end = end
        if not -ahead_bytes <= WALK_SPAN * (start - walked) <= ahead_bytes:
            before = chunks.get(c - 1) if chunks else None
            if before is None or before[1] < WALK_RUNS_MIN:
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
        chunks[c] = [data, 1]
        if len(chunks) > chunks_max:
            # The oldest, in one call: reader threads share the chunks, and taking the first key through
            # an iterator raised "dictionary changed size" when another thread added one in between.
            with contextlib.suppress(KeyError):
                chunks.popitem(last=False)
        raw = data[start - lo:end - lo]
        frame_run(raw, count, self.key, stream_id)
        return raw, hi - lo

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
        the run copied out."""
        reader = self.reader
        if reader is None:
            return None
        lo = start - start % PAGE_BYTES
        hi = min(end + -end % PAGE_BYTES, self.runs_bytes)
        view = reader.peek(lo, hi)
        if view is None:
            return None
        check_pages(view, lo, self.pages, self.key)
        raw = view[start - lo:end - lo].tobytes()
        frame_run(raw, count, self.key, stream_id)
        return raw, hi - lo

    def read_messages_cached(self, start: int, end: int, count: int, stream_id: int, first: int,
                             stop: int) -> tuple[list[bytes], int] | None:
        """Messages ``first .. stop - 1`` of the run at bytes ``start .. end`` (``count`` messages of
        ``stream_id``), and the bytes of pages read, if the page cache holds its pages; None if the read
        would wait for the disk (or the object is not local). A random reader's path: the pages are checked
        and the messages cut out where they were read, with no copy of the run (it is not kept)."""
        reader = self.reader
        lo = start - start % PAGE_BYTES
        hi = min(end + -end % PAGE_BYTES, self.runs_bytes)
        if reader is None or not 0 < hi - lo <= CACHED_READ_BYTES_MAX:
            return None
        view = libc.cached_view(reader.random_fd, hi - lo, lo)
        if view is None:
            return None
        # One page (most runs): its CRC compared here, one call fewer; the rest, and any mismatch, by
        # check_pages (which names the damaged page).
        if hi - lo > PAGE_BYTES or crc32c(view) != self.pages.item(lo // PAGE_BYTES):
            check_pages(view, lo, self.pages, self.key)
        return run_messages(view[start - lo:end - lo], count, first, stop, self.key, stream_id), hi - lo

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
