"""Read planning: which blocks each Spark task reads. Pure functions over a manifest; no Spark, no I/O.

A plan is a list of :class:`ReadPartition`. Each holds :class:`StreamSlice` values: one stream, an offset
range, and the data blocks (object key, position, size, CRC) that hold it. Partitions are small frozen
dataclasses: Spark pickles one to each task, and the task reads exactly those blocks with ranged gets.

Planning is coarse on purpose. Many small streams are packed into one partition (objects hold streams in
id order, so their blocks sit side by side and one ranged get covers many), and a large stream is split
at block boundaries once a partition reaches ``rows_max`` rows or ``bytes_max`` bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stratalog.engine.manifest import BlockRef, Manifest

#: Rows per task at most: half a million small records is about a second of work, long enough to amortize
#: a task's start-up, short enough for a retry to be cheap and for the last wave of tasks to be short.
ROWS_PER_PARTITION = 500_000
#: Bytes of blocks per task, for streams of large records where the row count says little.
BYTES_PER_PARTITION = 128 << 20
#: Adjacent blocks of one object are fetched with one ranged get up to this size.
FETCH_BYTES_MAX = 8 << 20
#: Offsets are below this (the engine's "no end" bound in metadata queries).
OFFSET_END_MAX = 1 << 62


class UnknownStreamsError(ValueError):
    """The ``streams`` option names streams the manifest does not have."""


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` wanted from every stream (pushed-down filters on ``offset``)."""

    start: int = 0
    end: int = OFFSET_END_MAX

    def intersect(self, start: int, end: int) -> OffsetRange:
        return OffsetRange(max(self.start, start), min(self.end, end))

    @property
    def empty(self) -> bool:
        return self.start >= self.end


@dataclass(frozen=True, slots=True)
class StreamSlice:
    """Offsets ``[start_offset, end_offset)`` of one stream and the blocks that hold them, in order."""

    stream_id: int
    name: str
    start_offset: int
    end_offset: int
    blocks: tuple[BlockRef, ...]

    @property
    def rows(self) -> int:
        return self.end_offset - self.start_offset


@dataclass(frozen=True, slots=True)
class ReadPartition:
    """What one Spark task reads."""

    slices: tuple[StreamSlice, ...]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.slices)


def stream_label(stream_id: int, name: str | None) -> str:
    """The ``stream`` column's value: the stream's name, or its id for an unnamed stream."""
    return name if name is not None else str(stream_id)


def resolve_streams(manifest: Manifest, wanted: str | None) -> list[int]:
    """Stream ids named by the ``streams`` option: a comma list of names or ids; all streams when None."""
    if wanted is None or not wanted.strip():
        return sorted(manifest.streams)
    by_name = {s.name: s.stream_id for s in manifest.streams.values() if s.name is not None}
    ids: set[int] = set()
    missing: list[str] = []
    for token in (t.strip() for t in wanted.split(",")):
        if not token:
            continue
        if token in by_name:
            ids.add(by_name[token])
        elif token.isdigit() and int(token) in manifest.streams:
            ids.add(int(token))
        else:
            missing.append(token)
    if missing:
        raise UnknownStreamsError(f"no stream named {', '.join(map(repr, missing))} in the store "
                                  f"(manifest {manifest.seq}); give names or ids of existing streams")
    return sorted(ids)


def filter_by_label(manifest: Manifest, stream_ids: Iterable[int], labels: frozenset[str] | None) -> list[int]:
    """Keep the streams whose ``stream`` column value is in ``labels`` (None keeps all)."""
    if labels is None:
        return list(stream_ids)
    return [i for i in stream_ids if stream_label(i, manifest.streams[i].name) in labels]


def plan_partitions(manifest: Manifest, stream_ids: Sequence[int], offsets: OffsetRange = OffsetRange(),
                    rows_max: int = ROWS_PER_PARTITION, bytes_max: int = BYTES_PER_PARTITION,
                    ends: dict[int, int] | None = None, starts: dict[int, int] | None = None,
                    time_from_ms: int | None = None) -> list[ReadPartition]:
    """Pack the committed data of ``stream_ids`` within ``offsets`` into partitions of bounded size.

    ``time_from_ms`` leaves out blocks whose newest record is older (a pushed-down ``timestamp >=``
    filter, which Spark still applies to the rows of the blocks kept).

    ``starts`` / ``ends`` narrow single streams further (a streaming micro-batch reads each stream from
    where the last one stopped). A partition closes before a block that would take it past ``rows_max``
    rows or ``bytes_max`` bytes, and a stream that does not fit is continued in the next partition from
    the block boundary. A partition also closes once it holds an even share of all rows (the total over
    the number of partitions ``rows_max`` implies), so tasks take about the same time.
    """
    if rows_max < 1 or bytes_max < 1:
        raise ValueError("rows_max and bytes_max must be positive")
    windows = {i: _window(manifest, i, offsets, starts, ends) for i in stream_ids}
    total_rows = sum(max(w.end - w.start, 0) for w in windows.values())
    # As many partitions as rows_max asks for, but even: with rows_max 1 M, 1.1 M rows make two of about
    # 550 k, not 1 M + 100 k. A partition closes once it reaches the even share, or before a block that
    # would take it past rows_max.
    rows_even = -(-total_rows // -(-total_rows // rows_max)) if total_rows else rows_max
    parts: list[ReadPartition] = []
    current: list[StreamSlice] = []
    rows = size = 0
    for stream_id in sorted(stream_ids):
        info = manifest.streams[stream_id]
        window = windows[stream_id]
        if window.empty:
            continue
        label = stream_label(stream_id, info.name)
        run: list[BlockRef] = []
        for ref in manifest.blocks.get(stream_id, ()):
            entry = ref.entry
            if entry.end_offset <= window.start or entry.start_offset >= window.end:
                continue
            if time_from_ms is not None and entry.max_timestamp_ms < time_from_ms:
                if run:  # a slice covers contiguous blocks: close it before the gap
                    current.append(_slice(stream_id, label, run, window))
                    run = []
                continue
            block_rows = min(entry.end_offset, window.end) - max(entry.start_offset, window.start)
            if rows and (rows >= rows_even or rows + block_rows > rows_max or size + entry.size_bytes > bytes_max):
                if run:
                    current.append(_slice(stream_id, label, run, window))
                    run = []
                parts.append(ReadPartition(tuple(current)))
                current, rows, size = [], 0, 0
            run.append(ref)
            rows += block_rows
            size += entry.size_bytes
        if run:
            current.append(_slice(stream_id, label, run, window))
    if current:
        parts.append(ReadPartition(tuple(current)))
    return parts


def _window(manifest: Manifest, stream_id: int, offsets: OffsetRange, starts: dict[int, int] | None,
            ends: dict[int, int] | None) -> OffsetRange:
    info = manifest.streams[stream_id]
    window = offsets.intersect(info.start_offset, info.end_offset)
    if starts is not None or ends is not None:
        window = window.intersect((starts or {}).get(stream_id, 0), (ends or {}).get(stream_id, OFFSET_END_MAX))
    return window


def _slice(stream_id: int, label: str, run: list[BlockRef], window: OffsetRange) -> StreamSlice:
    return StreamSlice(stream_id, label, max(run[0].entry.start_offset, window.start),
                       min(run[-1].entry.end_offset, window.end), tuple(run))


@dataclass(frozen=True, slots=True)
class Fetch:
    """One ranged get: bytes ``[start, end)`` of ``key``, holding the listed blocks."""

    key: str
    start: int
    end: int
    #: (index of the slice in the partition, the block) for each block inside the range, in order.
    blocks: tuple[tuple[int, BlockRef], ...]


def plan_fetches(partition: ReadPartition, fetch_bytes_max: int = FETCH_BYTES_MAX) -> list[Fetch]:
    """Coalesce a partition's blocks into ranged gets, in object and position order: blocks that follow
    each other in one object are read together up to ``fetch_bytes_max`` bytes (a single larger block is
    read alone). Rows then come out in that order, not stream by stream."""
    wanted = sorted(((ref.key, ref.entry.position, index, ref) for index, piece in enumerate(partition.slices)
                     for ref in piece.blocks), key=lambda w: (w[0], w[1]))
    fetches: list[Fetch] = []
    key, start, end = "", 0, 0
    group: list[tuple[int, BlockRef]] = []
    for ref_key, position, index, ref in wanted:
        follows = group and ref_key == key and position == end
        if follows and position + ref.entry.size_bytes - start <= fetch_bytes_max:
            group.append((index, ref))
            end = position + ref.entry.size_bytes
            continue
        if group:
            fetches.append(Fetch(key, start, end, tuple(group)))
        key, start, end = ref_key, position, position + ref.entry.size_bytes
        group = [(index, ref)]
    if group:
        fetches.append(Fetch(key, start, end, tuple(group)))
    return fetches
