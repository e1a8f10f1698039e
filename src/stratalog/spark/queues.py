"""Queue reads: a queue store's messages as rows of the data source (option ``queues``).

Planning (driver): read the queue manifest (:mod:`stratalog.queues.manifest`), then each listed run
object's footer and names + index section (two ranged gets per object; never the runs). Object *k* holds,
for stream *s*, the run of offsets ``prev_end[s] .. end[s] - 1`` at bytes ``position[s] .. position[s + 1]``
(``prev_end`` is object *k - 1*'s ``end``; docs/formats/queues.md). A partition is a slice of one object:
a range of its runs, chosen streams only, of about ``bytes_max`` bytes or ``rows_max`` messages; it is
never one task per queue. Partitions are cut where the gap between two chosen runs passes
``GAP_BYTES_MAX`` too, so a task's single ranged get never reads much it does not need.

A :class:`QueuePartition` carries its streams as packed arrays (ids, first offsets, counts, run
positions, wanted offsets) and their names as UTF-8 bytes, compressed together: about 10 bytes a stream
once pickled for names like ``q000123``, not a Python object per queue.

Reading (task): one ranged get of the pages holding the partition's runs, every page checked against its
CRC (the plan carries them) and every run's framing before any row leaves, then one RecordBatch built with
NumPy gathers and one Arrow ``take``. Queue messages have no timestamp and no key: both columns are null.

Objects a merge replaced are deleted ``compact_retire_s`` (10 s by default) after the merge. A read
planned on an older manifest may find its object gone: the task then reads the queue manifest again and
takes the same streams' same offsets from wherever they are now (a merged object holds them unchanged),
up to ``REPLAN_ATTEMPTS_MAX`` times. If the manifest has not changed yet the object is missing, or the
offsets are nowhere to be found, the task fails with :class:`QueueReadError`, which says to re-run.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from stratalog.errors import StratalogError
from stratalog.objects.store import ObjectNotFoundError, ObjectStore
from stratalog.queues.format import (
    I64,
    OBJECT_FOOTER_BYTES,
    PAGE_BYTES,
    U32,
    CorruptBulkError,
    U32s,
    decode_footer,
    decode_index,
    page_count,
    page_crcs,
    page_span,
    u32_at,
)
from stratalog.queues.manifest import QueueManifest, read_queue_manifest
from stratalog.spark.columns import ARROW_SCHEMA, gather_binary
from stratalog.spark.plan import BYTES_PER_PARTITION, ROWS_PER_PARTITION, OffsetRange, UnknownStreamsError

#: A partition is cut where two chosen runs lie further apart than this: its one ranged get reads the gap.
GAP_BYTES_MAX = 1 << 20
#: Times a task (or the planner) reads the manifest again when an object it was to read is gone.
REPLAN_ATTEMPTS_MAX = 3
#: Offsets are u32 in run objects: this bound stands for "no end".
_OFFSET_END = (1 << 32) - 1
#: Rows of a partition's packed array: one u32 per stream each.
_IDS, _FIRSTS, _COUNTS, _RUN_STARTS, _RUN_STOPS, _WANT_STARTS, _WANT_ENDS, _NAME_ENDS = range(8)
_PACKED_ROWS = 8

Array = npt.NDArray[np.int64]


class QueueReadError(StratalogError):
    """A queue read cannot go on: an object it was planned on is gone or changed. Re-run the read."""


@dataclass(frozen=True, slots=True)
class ObjectLayout:
    """One run object's index, as the driver reads it: ``ends`` and ``positions`` by stream id."""

    key: str
    size_bytes: int
    ends: U32s
    positions: U32s
    pages: U32s = field(default_factory=lambda: np.zeros(0, U32))    # the CRC of each page of its runs


@dataclass(frozen=True, slots=True)
class QueueLayout:
    """The live objects of a manifest, oldest first, and every stream's name (index = stream id)."""

    manifest: QueueManifest
    objects: tuple[ObjectLayout, ...]
    names: pa.StringArray


@dataclass(frozen=True, slots=True)
class QueuePartition:
    """What one task reads: bytes ``start .. end`` of object ``key`` and, for each of ``streams`` streams,
    where its run lies and which offsets of it are wanted. ``packed`` is zlib of ``_PACKED_ROWS`` u32
    arrays of ``streams`` values each (see ``_IDS`` ...), then the streams' names back to back."""

    manifest_seq: int
    key: str
    start: int
    end: int
    streams: int
    rows: int
    packed: bytes
    runs_bytes: int = 0      # the object's runs end here: its last page may be short
    pages: bytes = b""       # the CRCs of the pages holding start .. end (u32 each)

    def unpack(self) -> tuple[npt.NDArray[np.int64], pa.StringArray]:
        """The ``[_PACKED_ROWS, streams]`` array and the names."""
        raw = zlib.decompress(self.packed)
        words = _PACKED_ROWS * self.streams
        planes = np.frombuffer(raw, np.uint8, 4 * words).reshape(4, words)
        coded = np.ascontiguousarray(planes.T).view(U32).reshape(_PACKED_ROWS, self.streams).astype(I64)
        table = _undelta(coded)
        name_offsets = np.zeros(self.streams + 1, np.int32)
        name_offsets[1:] = table[_NAME_ENDS]
        names = pa.Array.from_buffers(pa.string(), self.streams, [
            None, pa.py_buffer(name_offsets), pa.py_buffer(raw[4 * words:])])
        return table, names


# Packed rows are stored as differences that stay small (ids and run positions grow, wanted offsets sit
# near the run's first offset), and the u32s as four byte planes: zlib then packs a million queues'
# numbers into a few bytes each, where plain u32s took 32.


def _delta(table: Array) -> Array:
    coded = table.copy()
    for row in (_IDS, _RUN_STARTS, _NAME_ENDS):
        coded[row, 1:] = np.diff(table[row])
    coded[_RUN_STOPS] = table[_RUN_STOPS] - table[_RUN_STARTS]
    coded[_WANT_STARTS] = table[_WANT_STARTS] - table[_FIRSTS]
    coded[_WANT_ENDS] = table[_WANT_ENDS] - table[_WANT_STARTS]
    return coded


def _undelta(coded: Array) -> Array:
    table = coded.copy()
    for row in (_IDS, _RUN_STARTS, _NAME_ENDS):
        np.cumsum(coded[row], out=table[row])
    table[_RUN_STOPS] = table[_RUN_STARTS] + coded[_RUN_STOPS]
    table[_WANT_STARTS] = table[_FIRSTS] + coded[_WANT_STARTS]
    table[_WANT_ENDS] = table[_WANT_STARTS] + coded[_WANT_ENDS]
    return table


def _pack(manifest_seq: int, obj: ObjectLayout, table: Array, names: pa.StringArray) -> QueuePartition:
    """A partition of the streams in ``table`` (rows up to ``_WANT_ENDS``), named by ``names``."""
    count = table.shape[1]
    offsets = np.frombuffer(names.buffers()[1], np.int32, count + 1, names.offset)
    data = names.buffers()[2]
    name_bytes = data.to_pybytes()[int(offsets[0]):int(offsets[-1])] if data is not None else b""
    full = np.empty((_PACKED_ROWS, count), I64)
    full[:_NAME_ENDS] = table[:_NAME_ENDS]
    full[_NAME_ENDS] = offsets[1:] - offsets[0]
    rows = int((table[_WANT_ENDS] - table[_WANT_STARTS]).sum())
    start = int(table[_RUN_STARTS].min()) if count else 0
    end = int(table[_RUN_STOPS].max()) if count else 0
    planes = np.ascontiguousarray(_delta(full).astype(U32).reshape(-1).view(np.uint8).reshape(-1, 4).T)
    packed = zlib.compress(planes.tobytes() + name_bytes, 1)
    runs_bytes = int(obj.positions[-1]) if len(obj.positions) else 0
    lo, hi = page_span(start, end, runs_bytes)
    pages = obj.pages[lo // PAGE_BYTES:page_count(hi)].tobytes() if end > start else b""
    return QueuePartition(manifest_seq, obj.key, start, end, count, rows, packed, runs_bytes, pages)


# Planning ------------------------------------------------------------------------------------------


def read_layout(store: ObjectStore) -> QueueLayout:
    """The manifest and every listed object's index; read again if an object went away meanwhile (a merge
    replaced it and its grace period passed between our two reads)."""
    for attempt in range(REPLAN_ATTEMPTS_MAX):
        manifest = read_queue_manifest(store)
        try:
            return _layout_of(store, manifest)
        except ObjectNotFoundError:
            if attempt == REPLAN_ATTEMPTS_MAX - 1:
                raise QueueReadError(f"queue objects keep disappearing while planning (manifest {manifest.seq}): "
                                     "is something deleting them? Re-run the read") from None
    raise AssertionError("unreachable")


def _layout_of(store: ObjectStore, manifest: QueueManifest) -> QueueLayout:
    objects: list[ObjectLayout] = []
    names: list[str] = []
    for ref in manifest.objects:
        size = ref.size_bytes
        footer = decode_footer(store.get(ref.key, size - OBJECT_FOOTER_BYTES, size), size)
        named, ends, positions, pages = decode_index(store.get(ref.key, footer.names_position,
                                                               size - OBJECT_FOOTER_BYTES), footer)
        if footer.first_stream != len(names):
            raise CorruptBulkError(f"queue object {ref.key} names streams from {footer.first_stream}; "
                                   f"{len(names)} come before it")
        names.extend(name for _, name in named)
        objects.append(ObjectLayout(ref.key, size, ends, positions, pages))
    if len(names) != manifest.stream_count:
        raise CorruptBulkError(f"queue manifest {manifest.seq} counts {manifest.stream_count} streams; its "
                               f"objects name {len(names)}")
    return QueueLayout(manifest, tuple(objects), pa.array(names, pa.string()))


def select_streams(layout: QueueLayout, queues: str, labels: frozenset[str] | None) -> npt.NDArray[np.bool_]:
    """Which stream ids to read: the ``queues`` option (``*`` or a comma list of names), narrowed by
    pushed-down ``stream`` filters (``labels``; None keeps all)."""
    count = len(layout.names)
    wanted = {t.strip() for t in queues.split(",") if t.strip()}
    if not wanted:
        raise ValueError("option 'queues' must be '*' or a comma list of queue names")
    ids = {name: i for i, name in enumerate(layout.names.to_pylist())} if wanted != {"*"} or labels else {}
    mask = np.ones(count, bool)
    if wanted != {"*"}:
        missing = sorted(wanted - ids.keys())
        if missing:
            raise UnknownStreamsError(f"no queue named {', '.join(map(repr, missing))} in the store (queue "
                                      f"manifest {layout.manifest.seq}); give names of queues with messages")
        mask[:] = False
        mask[[ids[name] for name in wanted]] = True
    if labels is not None:
        chosen = np.zeros(count, bool)
        chosen[[ids[name] for name in labels if name in ids]] = True
        mask &= chosen
    return mask


def plan_queue_partitions(layout: QueueLayout, selected: npt.NDArray[np.bool_], offsets: OffsetRange | None = None,
                          rows_max: int = ROWS_PER_PARTITION,
                          bytes_max: int = BYTES_PER_PARTITION) -> list[QueuePartition]:
    """Partitions covering every wanted message of the ``selected`` streams exactly once."""
    if rows_max < 1 or bytes_max < 1:
        raise ValueError("rows_max and bytes_max must be positive")
    offsets = offsets or OffsetRange()
    window = (min(offsets.start, _OFFSET_END), min(offsets.end, _OFFSET_END))
    parts: list[QueuePartition] = []
    prev = np.zeros(0, I64)
    for obj in layout.objects:
        table = _runs_of(obj, prev, selected, window)
        prev = obj.ends.astype(I64)
        for lo, hi in _cuts(table, rows_max, bytes_max):
            piece = table[:, lo:hi]
            parts.append(_pack(layout.manifest.seq, obj, piece, layout.names.take(pa.array(piece[_IDS]))))
    return parts


def _runs_of(obj: ObjectLayout, prev_ends: Array, selected: npt.NDArray[np.bool_],
             window: tuple[int, int]) -> Array:
    """The ``[_NAME_ENDS, k]`` table of the wanted runs of one object (chosen streams with wanted rows)."""
    n = len(obj.ends)
    ends = obj.ends.astype(I64)
    prev = np.zeros(n, I64)
    prev[:len(prev_ends)] = prev_ends
    want_starts = np.maximum(prev, window[0])
    want_ends = np.minimum(ends, window[1])
    ids = np.flatnonzero(selected[:n] & (ends > prev) & (want_ends > want_starts))
    positions = obj.positions.astype(I64)
    table = np.empty((_NAME_ENDS, len(ids)), I64)
    table[_IDS] = ids
    table[_FIRSTS] = prev[ids]
    table[_COUNTS] = ends[ids] - prev[ids]
    table[_RUN_STARTS] = positions[ids]
    table[_RUN_STOPS] = positions[ids + 1]
    table[_WANT_STARTS] = want_starts[ids]
    table[_WANT_ENDS] = want_ends[ids]
    return table


def _cuts(table: Array, rows_max: int, bytes_max: int) -> Iterator[tuple[int, int]]:
    """Ranges of the table's columns: each within ``bytes_max`` bytes of object and ``rows_max`` rows
    (or one run alone when it is larger), and without a gap over ``GAP_BYTES_MAX`` inside."""
    count = table.shape[1]
    if not count:
        return
    starts, stops = table[_RUN_STARTS], table[_RUN_STOPS]
    rows = np.zeros(count + 1, I64)
    np.cumsum(table[_WANT_ENDS] - table[_WANT_STARTS], out=rows[1:])
    gaps = np.flatnonzero(starts[1:] - stops[:-1] > GAP_BYTES_MAX)   # cut after column g
    lo = 0
    while lo < count:
        by_bytes = int(np.searchsorted(stops, starts[lo] + bytes_max, side="right"))
        by_rows = int(np.searchsorted(rows, rows[lo] + rows_max, side="right")) - 1
        at = int(np.searchsorted(gaps, lo))
        by_gap = int(gaps[at]) + 1 if at < len(gaps) else count
        hi = max(lo + 1, min(by_bytes, by_rows, by_gap, count))
        yield lo, hi
        lo = hi


# Reading -------------------------------------------------------------------------------------------


def read_queue_partition(store: ObjectStore, partition: QueuePartition) -> Iterator[pa.RecordBatch]:
    """The partition's messages as RecordBatches in the data source's Arrow schema."""
    yield from _read(store, partition, REPLAN_ATTEMPTS_MAX)


def _read(store: ObjectStore, partition: QueuePartition, attempts: int) -> Iterator[pa.RecordBatch]:
    if not partition.streams:
        return
    lo, hi = page_span(partition.start, partition.end, partition.runs_bytes)
    try:
        buf = store.get(partition.key, lo, hi)
    except ObjectNotFoundError:
        yield from _read_moved(store, partition, attempts)
        return
    table, names = partition.unpack()
    if len(buf) != hi - lo:
        raise QueueReadError(f"queue object {partition.key} is shorter than queue manifest "
                             f"{partition.manifest_seq} says: it was changed outside the store; re-run the read")
    bad = np.flatnonzero(page_crcs(buf) != np.frombuffer(partition.pages, U32))
    if len(bad) and attempts > 1 and _merged_away(store, partition):
        # Merged away since the read was planned: a local store may have written a newer object over its
        # file (QueueConfig.spare_bytes_max) while this read was in it. Read the offsets where they are now.
        yield from _read_moved(store, partition, attempts)
        return
    if len(bad):
        raise CorruptBulkError(f"queue object {partition.key}: page {lo // PAGE_BYTES + int(bad[0])} failed its CRC: "
                               "the object is damaged, or was changed outside the store since the read was planned "
                               "(re-run it)")
    yield messages_batch(buf, lo, partition.key, table, names)


def messages_batch(buf: bytes, base: int, key: str, table: Array, names: pa.StringArray) -> pa.RecordBatch:
    """The wanted messages of the runs in ``table`` (positions in object ``key``; ``buf`` holds its bytes
    from ``base``, its pages checked), each run's framing checked first."""
    data = np.frombuffer(buf, np.uint8)
    run_starts = table[_RUN_STARTS] - base
    run_stops = table[_RUN_STOPS] - base
    counts = table[_COUNTS]
    heads = run_starts + 4 * counts
    if np.any(heads > run_stops):
        _bad_run(key, table, names, int(np.flatnonzero(heads > run_stops)[0]), "is shorter than its message ends")
    total = int(counts.sum())
    run_of = np.repeat(np.arange(len(counts), dtype=I64), counts)
    first_of_run = np.cumsum(counts) - counts
    rank = np.arange(total, dtype=I64) - first_of_run[run_of]
    ends = u32_at(data, run_starts[run_of] + 4 * rank)
    begins = np.where(rank > 0, np.concatenate(([0], ends[:-1])), 0)
    if np.any(ends < begins) or np.any(ends[first_of_run + counts - 1] != run_stops - heads):
        at = np.flatnonzero(ends[first_of_run + counts - 1] != run_stops - heads)
        _bad_run(key, table, names, int(at[0]) if len(at) else int(run_of[np.argmax(ends < begins)]),
                 "has message ends that do not match its length")
    offsets = table[_FIRSTS][run_of] + rank
    keep = (offsets >= table[_WANT_STARTS][run_of]) & (offsets < table[_WANT_ENDS][run_of])
    if not keep.all():
        run_of, offsets, begins, ends = run_of[keep], offsets[keep], begins[keep], ends[keep]
    rows = len(offsets)
    starts = heads[run_of] + begins
    values = gather_binary(data, starts, ends - begins, None) if rows else pa.array([], pa.binary())
    stream = names.take(pa.array(run_of.astype(np.int32)))
    columns = [stream, pa.array(offsets, pa.int64()), pa.nulls(rows, ARROW_SCHEMA.field("timestamp").type),
               pa.nulls(rows, pa.binary()), values]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _bad_run(key: str, table: Array, names: pa.StringArray, column: int, what: str) -> NoReturn:
    raise CorruptBulkError(f"run of queue {names[column].as_py()!r} (stream {int(table[_IDS, column])}) in object "
                           f"{key} {what}: the object is damaged, or was changed outside the store since the read "
                           "was planned (re-run it)")


def _merged_away(store: ObjectStore, partition: QueuePartition) -> bool:
    """Whether the newest manifest no longer names the partition's object (a newer one replaced it)."""
    newest = read_queue_manifest(store)
    return newest.seq != partition.manifest_seq and all(o.key != partition.key for o in newest.objects)


def _read_moved(store: ObjectStore, partition: QueuePartition, attempts: int) -> Iterator[pa.RecordBatch]:
    """Read the partition's offsets from where the newest manifest has them (its object was merged away)."""
    newest = read_queue_manifest(store).seq
    if attempts <= 1 or newest == partition.manifest_seq:
        raise QueueReadError(f"queue object {partition.key} of queue manifest {partition.manifest_seq} is gone "
                             f"(the newest manifest is {newest}): merged away and deleted after its grace "
                             "period, or deleted outside the store; re-run the read")
    layout = read_layout(store)
    table, names = partition.unpack()
    ids = table[_IDS]
    moved: list[QueuePartition] = []
    prev = np.zeros(0, I64)
    for obj in layout.objects:
        n = len(obj.ends)
        here = ids < n
        ends = np.zeros(len(ids), I64)
        ends[here] = obj.ends[ids[here]]
        firsts = np.zeros(len(ids), I64)
        known = ids < len(prev)
        firsts[known] = prev[ids[known]]
        prev = obj.ends.astype(I64)
        want_starts = np.maximum(table[_WANT_STARTS], firsts)
        want_ends = np.minimum(table[_WANT_ENDS], ends)
        cols = np.flatnonzero(here & (ends > firsts) & (want_ends > want_starts))
        if not len(cols):
            continue
        sub = np.empty((_NAME_ENDS, len(cols)), I64)
        sub[_IDS] = ids[cols]
        sub[_FIRSTS] = firsts[cols]
        sub[_COUNTS] = ends[cols] - firsts[cols]
        positions = obj.positions.astype(I64)
        sub[_RUN_STARTS] = positions[ids[cols]]
        sub[_RUN_STOPS] = positions[ids[cols] + 1]
        sub[_WANT_STARTS] = want_starts[cols]
        sub[_WANT_ENDS] = want_ends[cols]
        moved.append(_pack(layout.manifest.seq, obj, sub, names.take(pa.array(cols))))
    found = sum(p.rows for p in moved)
    if found != partition.rows:
        raise QueueReadError(f"queue manifest {layout.manifest.seq} holds {found} of the {partition.rows} "
                             f"messages planned from object {partition.key} (manifest {partition.manifest_seq}); "
                             "re-run the read")
    for piece in moved:
        yield from _read(store, piece, attempts - 1)


def plan_queue_read(store: ObjectStore, queues: str, labels: frozenset[str] | None, offsets: OffsetRange,
                    rows_max: int, bytes_max: int) -> list[QueuePartition]:
    """The driver's whole plan for a queue read."""
    layout = read_layout(store)
    return plan_queue_partitions(layout, select_streams(layout, queues, labels), offsets, rows_max, bytes_max)


def partition_rows(partitions: Sequence[QueuePartition]) -> int:
    return sum(p.rows for p in partitions)
