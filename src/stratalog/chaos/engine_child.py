"""The writer the engine crash harness kills: ``python -m stratalog.chaos.engine_child --dir D ...``.

It opens the store (which recovers it), opens or creates ``--streams`` named streams, says it is ready,
then appends batches from a few threads until it is killed. One more thread trims streams and deletes
the objects trims left unreferenced; another calls ``flush`` now and then. The store uploads every few
tens of milliseconds and its WAL is a few MiB, so a kill lands at any step: mid-append, mid-upload,
between an object's put and its commit, between the commit and the WAL trim, mid-trim, mid-delete,
mid-flush, or (when the parent left the last crash unchecked) mid-recovery.

Every record follows from its stream's name, its offset and the writer's run id, and carries all three
(:func:`record_parts`), so the parent checks any record it reads without a log of what was written.
Each stream is appended to by one thread only, so the thread knows the offset a batch will get before
it appends it, and makes the records for that offset.

What it tells the parent, one line each on stdout, written with a single ``write`` once the fact holds
(the parent drops a last line without its newline: the child was killed while writing it)::

    o                                          opening the store: recovery runs now
    r <replayed> <in objects> <not contiguous> <orphans deleted> <recovery us>   recovery done
    s <stream> <start offset> <end offset>     stream number <stream> as the open left it
    g                                          ready: appends, trims and flushes start now
    a <stream> <base offset> <count>           this batch is durable (its future completed)
    x <stream> <expected base> <base>          the store gave a batch another offset than predicted
    t+ <stream> <offset>                       about to call trim(offset)
    t <stream> <offset>                        trim(offset) returned: the trim is durable
    f+ / f                                     about to call flush() / flush() returned
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import struct
import sys
import threading
import time
import traceback
import zlib
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NoReturn

from stratalog.chaos.lines import LineWriter, complete_lines
from stratalog.chaos.mix import mix64
from stratalog.engine.config import StoreConfig
from stratalog.engine.metadata import UnknownStreamError
from stratalog.engine.store import Stream, StreamStore
from stratalog.records import NewRecord, Record
from stratalog.wal import WALConfig
from stratalog.wal.format import HEADERS_BYTES

#: The store both the child and the checking parent open. Small on purpose: an upload every 50 ms or
#: 256 KiB, so each kill has a fair chance to land inside one; an 8 MiB WAL, so the ring wraps every few
#: rounds and the uploader trims it constantly; a 4 MiB log cache, so appends meet backpressure;
#: streams with 128 KiB in one upload get their own object, so one upload often puts several objects
#: before its single commit; objects a trim left unreferenced may be deleted at once.
CHAOS_STORE_CONFIG = StoreConfig(
    wal_capacity_bytes=HEADERS_BYTES + (8 << 20),
    wal=WALConfig(record_bytes_max=256 << 10, window_bytes_max=2 << 20, buffered_bytes_max=4 << 20),
    log_cache_bytes_max=4 << 20,
    upload_bytes_threshold=256 << 10,
    upload_interval_s=0.05,
    stream_object_bytes_min=128 << 10,
    block_cache_bytes_max=1 << 20,
    object_grace_s=0.0,
    retention_interval_s=0.25,
    append_wait_s_max=30.0,
    upload_backoff_s=0.01,
    manifest_snapshot_every=16,
)


def stream_name(index: int) -> str:
    return f"chaos-{index}"


# Records ---------------------------------------------------------------------------------------------

#: A value starts with its offset, the writer's run id (both u64) and its stream's tag (u32), little-endian.
VALUE_PREFIX = struct.Struct("<QQI")
#: Filler after the prefix: 0 to 4 KiB - 1 bytes, sizes spread evenly over powers of two, so most records
#: are small and a batch of the largest count stays far below wal.record_bytes_max.
FILLER_BYTES_MAX = (4 << 10) - 1
_SIZE_CLASSES = 13
#: Fillers are slices of one fixed pseudo-random pool, starting at one of this many places.
FILLER_STARTS = 64 << 10
_FILLER_POOL = random.Random(0x5EED_F111).randbytes(FILLER_STARTS + FILLER_BYTES_MAX)
#: Keys are 8 bytes of the record's hash, or None for one record in four.
KEY_BYTES = 8


def stream_tag(name: str) -> int:
    """The u32 every value of the stream ``name`` carries: a record read from the wrong stream is caught."""
    return zlib.crc32(name.encode())


def record_parts(tag: int, offset: int, run_id: int) -> tuple[bytes | None, bytes]:
    """``(key, value)`` of the record that run ``run_id`` writes at ``offset`` of the stream tagged ``tag``."""
    mixed = mix64(run_id ^ mix64(offset ^ (tag << 32)))
    filler_bytes = (mixed >> 8) % (1 << (mixed % _SIZE_CLASSES))
    start = (mixed >> 32) % FILLER_STARTS
    value = VALUE_PREFIX.pack(offset, run_id, tag) + _FILLER_POOL[start:start + filler_bytes]
    key = None if (mixed >> 4) & 3 == 0 else (mixed >> 16).to_bytes(KEY_BYTES, "little")
    return key, value


def record_run(tag: int, record: Record) -> int | None:
    """The run id that wrote ``record``, or None when it is not exactly what that run made at its offset."""
    if len(record.value) < VALUE_PREFIX.size:
        return None
    offset, run_id, value_tag = VALUE_PREFIX.unpack_from(record.value, 0)
    if offset != record.offset or value_tag != tag:
        return None
    if (record.key, record.value) != record_parts(tag, offset, run_id) or record.headers:
        return None
    return int(run_id)


# Line protocol ---------------------------------------------------------------------------------------

TAG_OPENING = "o"
TAG_RECOVERED = "r"
TAG_STREAM = "s"
TAG_READY = "g"
TAG_ACK = "a"
TAG_OFFSET_MISMATCH = "x"
TAG_TRIM_STARTED = "t+"
TAG_TRIM_DONE = "t"
TAG_FLUSH_STARTED = "f+"
TAG_FLUSH_DONE = "f"


@dataclass(frozen=True, slots=True)
class ChildRecovery:
    """The figures of the child's own open, from its ``r`` line."""

    batches_replayed: int
    batches_already_in_objects: int
    batches_not_contiguous: int
    orphan_objects_deleted: int
    seconds: float


@dataclass(slots=True)
class ChildReport:
    """What a killed child said: every complete line, decoded."""

    opening: bool = False
    recovery: ChildRecovery | None = None
    #: ``stream -> (start offset, end offset)`` as the child's open left them.
    opened: dict[int, tuple[int, int]] = field(default_factory=dict)
    ready: bool = False
    #: ``(stream, base offset, count)`` of every acknowledged batch, in acknowledgement order.
    acks: list[tuple[int, int, int]] = field(default_factory=list)
    #: ``(stream, expected base, base)``: batches the store gave an unpredicted offset.
    offset_mismatches: list[tuple[int, int, int]] = field(default_factory=list)
    trims_started: list[tuple[int, int]] = field(default_factory=list)
    trims_done: list[tuple[int, int]] = field(default_factory=list)
    flushes_started: int = 0
    flushes_done: int = 0

    @property
    def records_acknowledged(self) -> int:
        return sum(count for _, _, count in self.acks)


def parse_child_output(output: bytes) -> ChildReport:
    """Decode a child's stdout; a last line without its newline was cut by the kill and is dropped."""
    report = ChildReport()
    for text, tag, values in complete_lines(output):
        if tag == TAG_ACK:
            stream, base, count = values
            report.acks.append((stream, base, count))
        elif tag == TAG_TRIM_STARTED:
            report.trims_started.append((values[0], values[1]))
        elif tag == TAG_TRIM_DONE:
            report.trims_done.append((values[0], values[1]))
        elif tag == TAG_FLUSH_STARTED:
            report.flushes_started += 1
        elif tag == TAG_FLUSH_DONE:
            report.flushes_done += 1
        elif tag == TAG_OFFSET_MISMATCH:
            stream, expected, got = values
            report.offset_mismatches.append((stream, expected, got))
        elif tag == TAG_STREAM:
            stream, start, end = values
            report.opened[stream] = (start, end)
        elif tag == TAG_OPENING:
            report.opening = True
        elif tag == TAG_RECOVERED:
            replayed, in_objects, not_contiguous, orphans, recovery_us = values
            report.recovery = ChildRecovery(replayed, in_objects, not_contiguous, orphans, recovery_us / 1e6)
        elif tag == TAG_READY:
            report.ready = True
        else:
            raise ValueError(f"the engine chaos child wrote an unknown line: {text!r}")
    return report


# The writer ------------------------------------------------------------------------------------------

#: Records per batch: 1 to this many. 32 records of at most 4 KiB each stay far below 256 KiB.
BATCH_RECORDS_MAX = 32
#: Batches each appending thread has in flight (appended, future not completed), as a producer waiting
#: on acknowledgements would: appends then run at most this far ahead of what the child reports.
INFLIGHT_BATCHES_MAX = 16
#: The trimming thread trims one stream every 2 to 20 ms (a trim commits metadata and publishes a
#: manifest delta, so it takes a few ms itself); the flushing thread flushes every 20 to 200 ms.
TRIM_PAUSE_S_MIN = 0.002
TRIM_PAUSE_S_MAX = 0.020
#: After a trim, the trimming thread deletes the objects trims left unreferenced with this chance.
DELETE_SHARE = 0.25
FLUSH_PAUSE_S_MIN = 0.020
FLUSH_PAUSE_S_MAX = 0.200
#: A trim keeps at most this many acknowledged records of its stream, so what a check reads stays
#: bounded however long the harness runs, while most checks still read records from objects.
TRIM_KEEP_RECORDS_MAX = 6000
#: An orphaned child stops by itself after this long; the parent kills it within a second normally.
CHILD_RUN_S_MAX = 600.0
#: How often the main thread checks whether the parent is gone.
ORPHAN_CHECK_S = 0.5
#: Exit status when the store fails under the child: the parent reports the child's stderr.
EXIT_STORE_FAILED = 3


def _fail(what: str) -> NoReturn:
    """Report the exception being handled and exit at once: a failing store must not be papered over."""
    sys.stderr.write(f"engine chaos child: {what}\n{traceback.format_exc()}")
    sys.stderr.flush()
    os._exit(EXIT_STORE_FAILED)


@dataclass(slots=True)
class _StreamWriter:
    index: int
    stream: Stream
    tag: int
    #: The offset the next batch gets; only the owning appender thread touches it.
    next_offset: int
    #: One past the last acknowledged record; written by completions, read by the trimming thread.
    acked_end: int


class _Child:
    """One run's threads: appenders (each owning some streams), a trimmer and a flusher."""

    def __init__(self, store: StreamStore, writers: list[_StreamWriter], run_id: int, threads: int,
                 lines: LineWriter) -> None:
        self._store = store
        self._writers = writers
        self._run_id = run_id
        self._threads = threads
        self._lines = lines
        self._acked_lock = threading.Lock()

    def start(self) -> None:
        for number in range(self._threads):
            own = self._writers[number::self._threads]
            if own:
                threading.Thread(target=self._append_loop, args=(number, own), name=f"appender-{number}",
                                 daemon=True).start()
        threading.Thread(target=self._trim_loop, name="trimmer", daemon=True).start()
        threading.Thread(target=self._flush_loop, name="flusher", daemon=True).start()

    def _append_loop(self, number: int, own: list[_StreamWriter]) -> None:
        rng = random.Random(self._run_id * 1000 + number)
        inflight = threading.Semaphore(INFLIGHT_BATCHES_MAX)
        try:
            while True:
                writer = rng.choice(own)
                base = writer.next_offset
                count = rng.randint(1, BATCH_RECORDS_MAX)
                records = []
                for offset in range(base, base + count):
                    key, value = record_parts(writer.tag, offset, self._run_id)
                    records.append(NewRecord(value, key=key))
                inflight.acquire()
                future = writer.stream.append(records)
                writer.next_offset = base + count
                future.add_done_callback(functools.partial(self._on_durable, writer, base, count, inflight))
        except BaseException:
            _fail(f"appender thread {number} failed")

    def _on_durable(self, writer: _StreamWriter, base: int, count: int, inflight: threading.Semaphore,
                    future: Future[int]) -> None:
        # Runs where the store completes the future: in durability order, so acks of a stream ascend.
        try:
            got = future.result()
        except BaseException:
            _fail(f"an append to stream {writer.index} failed")
        if got != base:
            self._lines.write(f"{TAG_OFFSET_MISMATCH} {writer.index} {base} {got}\n")
        self._lines.write(f"{TAG_ACK} {writer.index} {got} {count}\n")
        with self._acked_lock:
            writer.acked_end = max(writer.acked_end, got + count)
        inflight.release()

    def _trim_loop(self) -> None:
        rng = random.Random(self._run_id ^ 0x7E1A)
        try:
            while True:
                time.sleep(rng.uniform(TRIM_PAUSE_S_MIN, TRIM_PAUSE_S_MAX))
                self._trim(rng.choice(self._writers), rng)
                if rng.random() < DELETE_SHARE:
                    # The uploader does this every retention_interval_s, which few children live to see.
                    self._store.delete_unreferenced()
        except BaseException:
            _fail("a trim or deleting unreferenced objects failed")

    def _flush_loop(self) -> None:
        rng = random.Random(self._run_id ^ 0xF1A5)
        try:
            while True:
                time.sleep(rng.uniform(FLUSH_PAUSE_S_MIN, FLUSH_PAUSE_S_MAX))
                self._lines.write(f"{TAG_FLUSH_STARTED}\n")
                self._store.flush()
                self._lines.write(f"{TAG_FLUSH_DONE}\n")
        except BaseException:
            _fail("a flush failed")

    def _trim(self, writer: _StreamWriter, rng: random.Random) -> None:
        with self._acked_lock:
            acked_end = writer.acked_end
        start = writer.stream.start_offset
        if acked_end <= start:
            return
        # Anywhere in the last TRIM_KEEP_RECORDS_MAX acknowledged records: mid-batch, at the very end
        # (below records still in memory only), or below records already in objects.
        target = rng.randint(max(start + 1, acked_end - TRIM_KEEP_RECORDS_MAX), acked_end)
        self._lines.write(f"{TAG_TRIM_STARTED} {writer.index} {target}\n")
        writer.stream.trim(target)
        self._lines.write(f"{TAG_TRIM_DONE} {writer.index} {target}\n")


def _open_streams(store: StreamStore, streams: int, lines: LineWriter) -> list[_StreamWriter]:
    writers = []
    for index in range(streams):
        name = stream_name(index)
        try:
            stream = store.open_stream(name)
        except UnknownStreamError:
            stream = store.create_stream(name)
        lines.write(f"{TAG_STREAM} {index} {stream.start_offset} {stream.end_offset}\n")
        writers.append(_StreamWriter(index, stream, stream_tag(name), stream.end_offset, stream.end_offset))
    return writers


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stratalog.chaos.engine_child",
                                     description="The writer the engine crash harness kills.")
    parser.add_argument("--dir", required=True, help="the store's data directory (made on the first run)")
    parser.add_argument("--object-store", default=None, help="object store URI (default: under --dir)")
    parser.add_argument("--run-id", type=int, required=True, help="u64 that every record carries")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--threads", type=int, default=3, help="appending threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    lines = LineWriter(sys.stdout.fileno())
    parent_pid = os.getppid()
    lines.write(f"{TAG_OPENING}\n")
    store = StreamStore.open(args.dir, args.object_store, CHAOS_STORE_CONFIG)
    rec = store.recovery
    lines.write(f"{TAG_RECOVERED} {rec.batches_replayed} {rec.batches_already_in_objects} "
                f"{rec.batches_not_contiguous} {rec.orphan_objects_deleted} {round(rec.seconds * 1e6)}\n")
    writers = _open_streams(store, args.streams, lines)
    lines.write(f"{TAG_READY}\n")
    _Child(store, writers, args.run_id, args.threads, lines).start()
    deadline = time.monotonic() + CHILD_RUN_S_MAX
    while os.getppid() == parent_pid and time.monotonic() < deadline:
        time.sleep(ORPHAN_CHECK_S)
    # Orphaned: stop as the kill would have, without a final upload.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
