"""The cleaner: log compaction of one stream, keeping the latest record of each key (Kafka's
``cleanup.policy=compact``). Spec: docs/formats/object.md, "Compacted blocks".

A pass over a stream:

1. **What may be cleaned**: its uploaded blocks (never the log cache, the active tail) from its start up
   to ``end_offset_max`` (the caller's bound: a broker passes where its idempotent producers' snapshot
   ends), stopping at the first block with a record newer than ``min_compaction_lag_ms``.
2. **Whether to clean**: the *dirty* blocks, from where the last pass stopped (``clean_end_offset`` in
   metadata), against all of them: a pass runs when they are ``min_cleanable_dirty_ratio`` of the bytes,
   or the oldest dirty block is ``max_compaction_lag_ms`` old.
3. **The key map**: each key of the dirty blocks, as a 16-byte digest, with the offset of its latest
   record; bounded by ``key_map_entries_max`` (a block at a time: the map's end is the block where it
   filled, and the next pass goes on from there).
4. **The rewrite**: every block from the stream's start to the map's end, read at most
   ``read_bytes_per_s_max``, ``rewrite_bytes_max`` of input at a time: each batch keeps the records no
   later record of its key supersedes, and the tombstones (null values) not older than
   ``delete_retention_ms``. A batch keeps its base offset, offset span, timestamps and producer fields,
   so offsets have gaps, as in Kafka; a run of batches that lost every record becomes one empty batch
   over their offsets, so the blocks still tile the stream. Each piece of input goes to one new object,
   which replaces its blocks in one metadata transaction (``Metadata.replace_stream_blocks``); the last
   one also records where the pass stopped. Each object is reserved in metadata before it is written
   (``Metadata.reserve_object``), so a crash leaves the blocks replaced so far (each a correct cleaning)
   and no orphan: an object written but never committed is collected as unreferenced once its reservation
   ends, in a cluster too, where a store deletes no unknown object at open.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stratalog.engine.cleaner_process import ProcessWork
from stratalog.engine.cleaner_work import CleanWork, PassSettings
from stratalog.engine.cold_reads import Pacer
from stratalog.engine.config import CleanerBounds
from stratalog.engine.core import StoreCore
from stratalog.engine.log_cache import StreamState
from stratalog.engine.metadata import NewObject, RangeRow, StaleBlocksError
from stratalog.engine.objformat import check_block
from stratalog.engine.uploads import object_key
from stratalog.objects.store import put_parts

log = logging.getLogger("stratalog.engine.cleaner")

#: How long an object a pass is writing stays reserved in metadata before it counts as unreferenced (and is
#: collected, a grace period later): far beyond a piece's write (seconds), so only a dead writer's object
#: is collected; a piece that takes over half of it is not committed.
OBJECT_RESERVATION_MS = 3_600_000
#: A pass lists the stream's blocks this many at a time.
_ROWS_PER_QUERY = 1024


@dataclass(frozen=True, slots=True)
class CleanPolicy:
    """A compacted stream's settings (Kafka's topic configs of the same names)."""

    #: A tombstone is kept this long after its timestamp, so consumers that lag less see it.
    delete_retention_ms: int = 86_400_000
    #: Records younger than this are not cleaned yet.
    min_compaction_lag_ms: int = 0
    #: A stream whose oldest uncleaned record is this old is cleaned whatever its dirty ratio.
    max_compaction_lag_ms: int = 2**63 - 1
    #: The share of uncleaned bytes that makes a pass worth it.
    min_cleanable_dirty_ratio: float = 0.5


@dataclass(slots=True)
class CleanReport:
    """What a pass did (all zero: nothing was due)."""

    blocks_read: int = 0
    bytes_read: int = 0
    records_read: int = 0
    records_kept: int = 0
    bytes_written: int = 0
    objects_written: int = 0
    #: Where the pass stopped: offsets below are compacted.
    clean_end_offset: int = 0
    seconds: float = 0.0


class Cleaner:
    """Compacts a store's streams one pass at a time (see the module's docstring)."""

    def __init__(self, core: StoreCore, bounds: CleanerBounds) -> None:
        self._core = core
        self._bounds = bounds
        self._pacer = Pacer(bounds.read_bytes_per_s_max) if bounds.read_bytes_per_s_max else None
        self._work: CleanWork | ProcessWork = ProcessWork() if bounds.own_process else CleanWork()
        #: The work holds one pass's key map: passes take turns.
        self._pass_lock = threading.Lock()
        #: For /metrics: passes committed, and the input bytes they read.
        self.passes = 0
        self.bytes_cleaned = 0

    def close(self) -> None:
        """End the cleaner's process, if it has one (after the last pass)."""
        if isinstance(self._work, ProcessWork):
            self._work.close()

    def clean(self, st: StreamState, policy: CleanPolicy, *, end_offset_max: int, now_ms: int | None = None,
              should_stop: Callable[[], bool] = lambda: False) -> CleanReport:
        """One pass over the stream ``st``, if one is due (see the module's docstring). ``should_stop`` is
        asked before each piece of the rewrite: a pass asked to stop ends after the piece it is on."""
        with self._pass_lock:
            return self._clean(st, policy, end_offset_max, now_ms, should_stop)

    def _clean(self, st: StreamState, policy: CleanPolicy, end_offset_max: int, now_ms: int | None,
               should_stop: Callable[[], bool]) -> CleanReport:
        core = self._core
        core.check_open()
        started = time.monotonic()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        report = CleanReport()
        blocks = self._cleanable(st, policy, min(end_offset_max, st.committed_end), now_ms)
        first_dirty = max(core.meta.clean_end_offset(st.stream_id), st.start_offset)
        report.clean_end_offset = first_dirty
        if not _due(blocks, first_dirty, policy, now_ms):
            return report
        self._work.begin(PassSettings(st.stream_id, st.start_offset, now_ms - policy.delete_retention_ms))
        map_end = self._key_map(blocks, first_dirty, report)
        to_rewrite = [b for b in blocks if b.end_offset <= map_end]
        try:
            for piece in _pieces(to_rewrite, self._bounds.rewrite_bytes_max):
                if should_stop():
                    return report
                last = piece[-1] is to_rewrite[-1]
                self._rewrite(st, piece, map_end if last else first_dirty, report)
        except StaleBlocksError as e:
            # A trim or the stream's deletion came first: what was replaced stands; the next pass goes on.
            log.info("compaction of stream %d stopped: %s", st.stream_id, e)
            return report
        report.clean_end_offset = map_end
        report.seconds = time.monotonic() - started
        self.passes += 1
        log.info("stream %d compacted up to offset %d: %d of %d records kept, %d bytes read, %d written "
                 "(%.2f s)", st.stream_id, map_end, report.records_kept, report.records_read, report.bytes_read,
                 report.bytes_written, report.seconds)
        return report

    def _cleanable(self, st: StreamState, policy: CleanPolicy, end: int, now_ms: int) -> list[RangeRow]:
        """The stream's blocks from its start that may be cleaned: below ``end``, none too young."""
        meta = self._core.meta
        young_from_ms = now_ms - policy.min_compaction_lag_ms
        found: list[RangeRow] = []
        pos = st.start_offset
        while pos < end:
            rows = meta.ranges(st.stream_id, pos, end, limit=_ROWS_PER_QUERY)
            for row in rows:
                if row.end_offset > end or row.max_timestamp_ms > young_from_ms:
                    return found
                found.append(row)
            if not rows:
                break
            pos = rows[-1].end_offset
        return found

    def _key_map(self, blocks: list[RangeRow], first_dirty: int, report: CleanReport) -> int:
        """Map each key of the dirty blocks to its latest offset; the offset the map covers up to."""
        map_end = first_dirty
        map_size = 0
        for row in blocks:
            if row.end_offset <= first_dirty:
                continue
            if map_size and map_size + row.record_count > self._bounds.key_map_entries_max:
                break   # the next pass starts here
            records, map_size = self._work.map_block(self._read(row, report), row.entry())
            report.records_read += records
            map_end = row.end_offset
        return map_end

    def _read(self, row: RangeRow, report: CleanReport) -> bytes | memoryview:
        """The block ``row`` from object storage, its CRC checked."""
        core = self._core
        # Straight from object storage, not through the block cache: a pass reads the whole stream once,
        # which would evict what readers use.
        block = check_block(core.with_retries(f"reading object {row.key}", functools.partial(
            core.objects.get, row.key, row.position, row.position + row.size_bytes)), row.entry())
        if self._pacer is not None:
            self._pacer.take(row.size_bytes)
        report.blocks_read += 1
        report.bytes_read += row.size_bytes
        return block

    def _rewrite(self, st: StreamState, piece: list[RangeRow], clean_end: int, report: CleanReport) -> None:
        """Write the cleaned copy of the blocks ``piece`` as one object and put it in their place."""
        core = self._core
        for row in piece:
            report.records_read += self._work.rewrite_block(self._read(row, report), row.entry())
        out = self._work.finish_piece()
        report.records_kept += out.records_kept
        size_bytes = sum(len(part) for part in out.parts)
        object_id = core.with_retries("allocating an object id", core.meta.allocate_object_id)
        key = object_key(object_id)
        reserved_until_ms = int(time.time() * 1000) + OBJECT_RESERVATION_MS
        started = time.monotonic()
        core.with_retries(f"reserving object {key}",
                          functools.partial(core.meta.reserve_object, object_id, key, reserved_until_ms))
        core.with_retries(f"writing object {key}", functools.partial(put_parts, core.objects, key, out.parts))
        new = NewObject(object_id, key, size_bytes, out.entries)
        try:
            if time.monotonic() - started > OBJECT_RESERVATION_MS / 2000:
                raise StaleBlocksError(f"writing {key} took longer than half its reservation")
            with core.commit_lock:
                core.meta.replace_stream_blocks(st.stream_id, piece, new, clean_end,
                                                reserved_until_ms=reserved_until_ms)
                core.cold_rows.invalidate()
                core.publish([], snapshot=True)
        except StaleBlocksError:
            core.objects.delete(key)   # never referenced; its reservation is collected in time
            raise
        self.bytes_cleaned += sum(row.size_bytes for row in piece)
        report.bytes_written += size_bytes
        report.objects_written += 1


def _due(blocks: list[RangeRow], first_dirty: int, policy: CleanPolicy, now_ms: int) -> bool:
    dirty = [b for b in blocks if b.end_offset > first_dirty]
    if not dirty:
        return False
    total_bytes = sum(b.size_bytes for b in blocks)
    dirty_bytes = sum(b.size_bytes for b in dirty)
    overdue = min(b.max_timestamp_ms for b in dirty) < now_ms - policy.max_compaction_lag_ms
    return overdue or dirty_bytes >= policy.min_cleanable_dirty_ratio * total_bytes


def _pieces(blocks: list[RangeRow], bytes_max: int) -> Iterator[list[RangeRow]]:
    piece: list[RangeRow] = []
    size = 0
    for row in blocks:
        if piece and size + row.size_bytes > bytes_max:
            yield piece
            piece, size = [], 0
        piece.append(row)
        size += row.size_bytes
    if piece:
        yield piece
