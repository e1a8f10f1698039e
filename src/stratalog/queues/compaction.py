"""Compaction of run objects: several consecutive objects become one, each queue's runs joined into one.

At a million queues an upload of 256 MiB leaves about three messages per queue, so a queue's messages are
spread over one run per upload: a read of ten messages touches three or four objects and a consumer of a
hundred messages thirty. Merging ``fanout`` consecutive objects of one size tier into one (then ``fanout``
of those, and so on) keeps the runs per queue near ``fanout * log_fanout(data / upload)``, at the cost of
rewriting the data once per tier.

A merge's runs hold, for each stream, the messages of every source in order. Run positions are u32, so a
merge larger than an object may be is cut by stream range into pieces (:class:`MergePlan`), each an
ordinary run object (docs/formats/queues.md) in which the streams outside its range have empty runs: a
queue's messages from the merged sources still lie in one run. Each piece is laid out a slice of streams
at a time (about ``slice_bytes`` of sources), so the memory a merge takes does not grow with the objects:
per slice one ranged read of each source's pages, every page checked against its CRC, two Arrow ``take``
calls gather the new runs, and the new pages' CRCs are computed as the slices go out. Nothing of a source
is carried over unchecked.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from stratalog.native import native
from stratalog.queues.format import (
    I64,
    OBJECT_BYTES_MAX,
    OBJECT_FOOTER_BYTES,
    PAGE_BYTES,
    U32,
    CorruptBulkError,
    PageCrcs,
    U32s,
    check_pages,
    decode_footer,
    encode_footer,
    index_arrays,
    page_count,
    page_span,
)
from stratalog.wal.format import crc32c

#: A read of bytes ``start .. end`` of one object.
RangeReader = Callable[[int, int], bytes | memoryview]
#: A read of one object's bytes from ``start`` into ``view``; returns the count read (short only at its end).
IntoReader = Callable[[memoryview, int], int]
IndexReader = Callable[[int, int], bytes]
#: A merge joins this many objects at least: one alone has nothing to join.
MERGE_SOURCES_MIN = 2


@dataclass(frozen=True, slots=True)
class MergeSource:
    """One object to merge: how to read it, and its decoded index section."""

    key: str
    read: RangeReader
    first_stream: int
    names_raw: bytes    # the names section: streams first_stream .. stream_count - 1
    ends: U32s          # end offset of each stream after this object (its stream_count of them)
    positions: U32s     # run positions, stream_count + 1
    message_count: int
    pages: U32s         # the CRC of each page of its runs
    #: Reads straight into the buffer a merge gathers a slice from (no copy of what ``read`` returns).
    read_into: IntoReader | None = None

    @classmethod
    def open(cls, key: str, read: IndexReader, size_bytes: int) -> MergeSource:
        """Read the footer and the index section of object ``key`` (never its runs). The names are kept
        as they are: the merged object carries them unchanged."""
        footer = decode_footer(read(size_bytes - OBJECT_FOOTER_BYTES, size_bytes), size_bytes)
        raw = read(footer.names_position, size_bytes - OBJECT_FOOTER_BYTES)
        if len(raw) != footer.names_bytes + footer.index_bytes or crc32c(raw) != footer.index_crc:
            raise CorruptBulkError(f"run object {key}: its index failed its CRC or is short")
        ends, positions, pages = index_arrays(raw, footer)
        return cls(key, read, footer.first_stream, raw[:footer.names_bytes], ends, positions, footer.message_count,
                   pages)


@dataclass(slots=True)
class MergeResult:
    """What :func:`merge_objects` made, complete once its parts are consumed."""

    size_bytes: int = 0
    ends: U32s = field(default_factory=lambda: np.zeros(0, U32))
    positions: U32s = field(default_factory=lambda: np.zeros(1, U32))
    pages: U32s = field(default_factory=lambda: np.zeros(0, U32))
    pages_checked: int = 0
    runs_written: int = 0


@dataclass(frozen=True, slots=True)
class MergePlan:
    """How ``sources`` merge: the joined runs of every stream, cut into pieces by stream range.

    Piece p holds the runs of streams ``pieces[p][0] .. pieces[p][1] - 1`` and is an ordinary run object of
    every stream (the others have empty runs): its end offsets are the merged ones for the streams up to
    its range's end and the ends before the merge for the rest, so the pieces, read in order, are what one
    merged object would be. Piece 0 carries every source's names; the others name no new stream. Only
    per-stream totals are held here (a few bytes per stream); a slice's per-source arrays are made when the
    slice is merged."""

    sources: tuple[MergeSource, ...]
    prev_ends: U32s          # every stream's end before the first source (0 for streams it names)
    ends: U32s               # every stream's end after the last source
    positions: npt.NDArray[np.int64]   # where each merged run would start in one object of all the pieces
    pieces: tuple[tuple[int, int], ...]
    names_raw: bytes

    @property
    def stream_count(self) -> int:
        return len(self.ends)

    def piece_runs_bytes(self, piece: int) -> int:
        """The bytes of piece ``piece``'s runs (its object is these, the index and a little more)."""
        lo, hi = self.pieces[piece]
        return int(self.positions[hi] - self.positions[lo])


def plan_merge(sources: Sequence[MergeSource], prev_ends: U32s, piece_bytes_max: int) -> MergePlan:
    """The merge of ``sources`` (consecutive objects, oldest first), in pieces of at most ``piece_bytes_max``
    bytes (a single stream's run too large for that gets a piece of its own). ``prev_ends`` are the
    streams' ends before the first source. Raises CorruptBulkError when the sources do not follow on."""
    if len(sources) < MERGE_SOURCES_MIN:
        raise ValueError(f"a merge takes at least {MERGE_SOURCES_MIN} objects")
    first_stream = sources[0].first_stream
    if len(prev_ends) != first_stream:
        raise CorruptBulkError(f"object {sources[0].key} names streams from {first_stream}, but "
                               f"{len(prev_ends)} streams come before it")
    for prior, src in itertools.pairwise(sources):
        if src.first_stream != len(prior.ends):
            raise CorruptBulkError(f"object {src.key} names streams from {src.first_stream}: it does not follow on")
    stream_count = len(sources[-1].ends)
    # Merged run sizes: the sum over sources of each stream's run (streams a source does not know: none).
    run_bytes = np.zeros(stream_count, I64)
    for src in sources:
        at = src.positions.astype(I64)
        run_bytes[:len(src.ends)] += at[1:] - at[:-1]
    positions = np.zeros(stream_count + 1, I64)
    np.cumsum(run_bytes, out=positions[1:])
    del run_bytes
    before = np.zeros(stream_count, U32)
    before[:len(prev_ends)] = prev_ends
    names_raw = b"".join(src.names_raw for src in sources)
    # A piece's bytes besides its runs: names (piece 0), the index, a CRC per page of runs, the footer.
    # The CRCs are 4 * ceil(runs / PAGE_BYTES) bytes: budgeting 4 * runs / PAGE_BYTES plus one more CRC for
    # the page the rounding up adds keeps every piece within piece_bytes_max.
    fixed_bytes = len(names_raw) + 8 * stream_count + 4 + OBJECT_FOOTER_BYTES + 4
    runs_bytes_max = (piece_bytes_max - fixed_bytes) * PAGE_BYTES // (PAGE_BYTES + 4)
    if runs_bytes_max < 1:
        raise ValueError(f"pieces of {piece_bytes_max} bytes cannot hold the index of {stream_count} streams")
    pieces: list[tuple[int, int]] = []
    lo = 0
    while lo < stream_count or not pieces:
        hi = int(np.searchsorted(positions, positions[lo] + runs_bytes_max, side="right")) - 1
        hi = min(stream_count, max(hi, lo + 1))
        pieces.append((lo, hi))
        lo = hi
    return MergePlan(tuple(sources), before, sources[-1].ends, positions, tuple(pieces), names_raw)


def merge_piece(plan: MergePlan, piece: int, slice_bytes: int,
                result: MergeResult) -> Iterator[bytes | memoryview]:
    """The bytes of piece ``piece`` of ``plan``, in parts of about ``slice_bytes`` of sources each;
    ``result`` is filled as the parts go. Raises CorruptBulkError when a source's page fails its CRC or its
    index does not add up."""
    lo, hi = plan.pieces[piece]
    n = plan.stream_count
    sources = plan.sources
    ends = np.where(np.arange(n) < hi, plan.ends, plan.prev_ends).astype(U32)
    out_positions = np.clip(plan.positions - plan.positions[lo], 0, int(plan.positions[hi] - plan.positions[lo]))
    runs_bytes = int(out_positions[-1])
    names_raw = plan.names_raw if piece == 0 else b""
    first_stream = sources[0].first_stream if piece == 0 else n
    index_raw = names_raw + ends.tobytes() + out_positions.astype(U32).tobytes()
    total = runs_bytes + len(index_raw) + 4 * page_count(runs_bytes) + OBJECT_FOOTER_BYTES
    if total > OBJECT_BYTES_MAX:
        raise ValueError(f"a merged object of {total} bytes exceeds {OBJECT_BYTES_MAX}: merge in smaller pieces")
    # Slices of streams holding about slice_bytes of sources each (the merged runs are the sources' bytes).
    cuts = np.searchsorted(plan.positions[lo:hi + 1], plan.positions[lo] + np.arange(0, max(1, runs_bytes),
                                                                                    max(1, slice_bytes)))
    bounds = np.unique(np.concatenate((lo + cuts.clip(0, hi - lo), [lo, hi])))
    pages = PageCrcs()
    message_count = 0
    scratch = _SliceBuffer()
    for a, b in itertools.pairwise(bounds.tolist()):
        counts, positions, header_bytes, data_bytes = _slice_arrays(plan, a, b)
        message_count += int(counts.sum())
        part = _merge_slice(sources, a, b, counts, positions, header_bytes, data_bytes, result, scratch)
        if len(part) != int(out_positions[b] - out_positions[a]):
            raise AssertionError("a merged slice is not the size its index says")
        pages.add(part)
        yield part
    crcs = pages.finish()
    index_raw += crcs.tobytes()
    yield index_raw + encode_footer(runs_bytes, len(names_raw), first_stream, n, message_count, crc32c(index_raw))
    result.size_bytes = total
    result.ends = ends
    result.positions = out_positions.astype(U32)
    result.pages = crcs


def _slice_arrays(plan: MergePlan, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For streams ``lo .. hi - 1``: each source's message count, run positions (``hi - lo + 1`` each),
    message-end bytes and data bytes, ``[source, stream]``; checked against each other."""
    sources = plan.sources
    m = hi - lo
    ends_rows = np.empty((len(sources) + 1, m), I64)
    ends_rows[0] = plan.prev_ends[lo:hi]
    positions = np.empty((len(sources), m + 1), I64)
    for j, src in enumerate(sources):
        known = max(0, min(len(src.ends), hi) - lo)      # streams of the slice this source knows
        ends_rows[j + 1, :known] = src.ends[lo:lo + known]
        ends_rows[j + 1, known:] = ends_rows[j, known:]
        positions[j, :known + 1] = src.positions[lo:lo + known + 1] if known else src.positions[min(lo, len(src.ends))]
        positions[j, known + 1:] = positions[j, known]
    counts = np.diff(ends_rows, axis=0)
    run_bytes = np.diff(positions, axis=1)
    header_bytes = 4 * counts
    data_bytes = run_bytes - header_bytes
    if np.any(counts < 0):
        raise CorruptBulkError(f"objects {sources[0].key} .. {sources[-1].key}: a stream's end offset goes back")
    if np.any(data_bytes < 0) or np.any((counts == 0) & (run_bytes != 0)):
        raise CorruptBulkError(f"objects {sources[0].key} .. {sources[-1].key}: run sizes do not match their counts")
    return counts, positions, header_bytes, data_bytes


def merge_objects(sources: Sequence[MergeSource], prev_ends: U32s, slice_bytes: int,
                  result: MergeResult) -> Iterator[bytes | memoryview]:
    """The bytes of one run object holding ``sources`` merged (a plan of one piece)."""
    plan = plan_merge(sources, prev_ends, OBJECT_BYTES_MAX)
    if len(plan.pieces) != 1:
        raise ValueError(f"a merged object of {int(plan.positions[-1])} bytes of runs exceeds {OBJECT_BYTES_MAX}: "
                         "merge fewer objects")
    return merge_piece(plan, 0, slice_bytes, result)


class _SliceBuffer:
    """The bytes one slice of a merge is gathered from (every source's pages, then the new runs' message
    ends), reused by the next slice: a fresh buffer per slice faults in new pages each time (a fault a
    page where freed memory goes back to a VM's host)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def view(self, size: int) -> memoryview:
        if len(self._buffer) < size:
            self._buffer = bytearray(size)
        return memoryview(self._buffer)[:size]


def _merge_slice(sources: Sequence[MergeSource], lo: int, hi: int, counts: np.ndarray, positions: np.ndarray,
                 header_bytes: np.ndarray, data_bytes: np.ndarray, result: MergeResult,
                 scratch: _SliceBuffer) -> memoryview:
    """The merged runs of streams ``lo .. hi``, as a view of the Arrow buffer they were laid out in (it
    stays alive while the view does), not a copy: a copy is a fresh buffer of a slice's size, and copying
    and faulting in fresh pages for those copies took a sizeable share of a merge's time.

    The sources' pages and the new runs' message ends go into ``scratch`` one after the other, and one
    Arrow array over it is what both takes gather from: a take on a chunked array (a chunk per source)
    joins the chunks into fresh memory first, on every call."""
    m = hi - lo
    j_count = len(sources)
    spans = []
    for src, row in zip(sources, positions, strict=True):
        start, stop = int(row[0]), int(row[-1])
        spans.append(page_span(start, stop, int(src.positions[-1])) if stop > start else (start, start))
    sources_bytes = sum(end - first for first, end in spans)
    heads_bytes = int(header_bytes.sum())
    buf = scratch.view(sources_bytes + heads_bytes)
    # Element (2m + 1) j + 2s: stream s's message ends in source j; the element after it: its messages;
    # element (2m + 1) j + 2m: the bytes up to the next source's first run (page slack). Then the m heads.
    width = 2 * m + 1
    heads_at = j_count * width
    offsets = np.empty(heads_at + m + 1, np.int64)
    at = 0
    for j, (src, (first, end)) in enumerate(zip(sources, spans, strict=True)):
        if end > first:
            raw = buf[at:at + end - first]
            if src.read_into is not None:
                got = src.read_into(raw, first)
            else:
                read = src.read(first, end)
                got = len(read)
                if got == len(raw):
                    raw[:] = read
                del read
            if got != end - first:
                raise CorruptBulkError(f"object {src.key} is shorter than its index says")
            check_pages(raw, first, src.pages, src.key)
            result.pages_checked += page_count(len(raw))
            del raw
        rel = positions[j] - first + at
        offsets[j * width:(j + 1) * width:2] = rel
        offsets[j * width + 1:(j + 1) * width - 1:2] = rel[:-1] + header_bytes[j]
        at += end - first
    if _merge_runs is not None:
        # The runs joined in one C call (the Arrow takes below are its twin).
        starts = np.ascontiguousarray(offsets[:heads_at].reshape(j_count, width)[:, ::2])
        # Out into Arrow's pool, which reuses freed memory (a bytes object of a slice's size is fresh pages).
        joined = pa.allocate_buffer(int((starts[:, -1] - starts[:, 0]).sum()))
        if _merge_runs(buf[:sources_bytes], starts, np.ascontiguousarray(counts, np.int64), joined) is None:
            raise CorruptBulkError(f"objects {sources[0].key} .. {sources[-1].key}: a run's message ends do not "
                                   "match its length")
        result.runs_written += int(np.count_nonzero(counts.sum(axis=0)))
        return memoryview(joined)
    chunk_base = width * np.arange(j_count, dtype=np.int64)
    stream = np.arange(m, dtype=np.int64)
    offsets[heads_at] = sources_bytes
    sources_array = pa.Array.from_buffers(pa.large_binary(), heads_at, [None, pa.py_buffer(offsets[:heads_at + 1]),
                                                                        pa.py_buffer(buf[:sources_bytes])])

    # Message ends of every (stream, source) run, streams first, shifted past the data of the sources
    # before it in that stream.
    headers = sources_array.take(pa.array((chunk_base[None, :] + 2 * stream[:, None]).ravel()))
    del sources_array
    header_offsets = np.frombuffer(headers.buffers()[1], np.int64, len(headers) + 1, 8 * headers.offset)
    words = np.frombuffer(headers.buffers()[2] or b"", U32, int(header_offsets[-1] - header_offsets[0]) // 4,
                          int(header_offsets[0]))
    c = counts.T.ravel()                                  # [stream, source] order
    present = c > 0
    msg_ends = words.astype(np.int64)
    del words, headers
    d = data_bytes.T.ravel()
    if np.any(msg_ends[(np.cumsum(c) - 1)[present]] != d[present]):
        raise CorruptBulkError(f"objects {sources[0].key} .. {sources[-1].key}: a run's message ends do not "
                               "match its length")
    shift = (np.cumsum(data_bytes, axis=0) - data_bytes).T.ravel()
    msg_ends += np.repeat(shift, c)

    # Each new run: its message ends (one element, after the sources' bytes), then each source's messages.
    out_counts = counts.sum(axis=0)
    np.cumsum(4 * out_counts, out=offsets[heads_at + 1:])
    offsets[heads_at + 1:] += sources_bytes
    buf[sources_bytes:] = msg_ends.astype(U32).data.cast("B")
    del msg_ends
    pieces = pa.Array.from_buffers(pa.large_binary(), heads_at + m, [None, pa.py_buffer(offsets), pa.py_buffer(buf)])
    order = np.empty((m, j_count + 1), np.int64)
    order[:, 0] = heads_at + stream
    order[:, 1:] = chunk_base[None, :] + 2 * stream[:, None] + 1
    merged = pieces.take(pa.array(order.ravel()))
    del pieces, buf
    merged_offsets = np.frombuffer(merged.buffers()[1], np.int64, len(merged) + 1, 8 * merged.offset)
    out = memoryview(merged.buffers()[2] or b"")[int(merged_offsets[0]):int(merged_offsets[-1])]
    del merged
    result.runs_written += int(np.count_nonzero(out_counts))
    return out


def tier(size_bytes: int, upload_bytes: int, fanout: int) -> int:
    """Size tier of an object: 0 below fanout / 2 uploads, then one more per factor of fanout."""
    tier = 0
    bound = upload_bytes * fanout // 2
    while size_bytes >= bound:
        tier += 1
        bound *= fanout
    return tier


def tier_merge_start(sizes: list[int], upload_bytes: int, fanout: int, bytes_max: int) -> int | None:
    """The first of ``fanout`` consecutive units (of these sizes, oldest first) of one size tier that a
    merge takes, within ``bytes_max``; None if there are none. The lowest tier goes first, the oldest
    within it: merging ``fanout`` uploads leaves as many fewer objects for readers as merging ``fanout``
    units of a higher tier, for a fraction of the work. The merge worker is one process, so taking the
    oldest group first let a tier-1 merge of 3.7 GiB (13 s) hold back the uploads that came meanwhile: a
    put_many send of 100 M messages to a million queues left 13 objects for the read phases."""
    tiers = [tier(size, upload_bytes, fanout) for size in sizes]
    best: int | None = None
    for u in range(len(sizes) - fanout + 1):
        group = tiers[u:u + fanout]
        if min(group) == max(group) and sum(sizes[u:u + fanout]) <= bytes_max \
                and (best is None or group[0] < tiers[best]):
            best = u
    return best


def idle_merge_start(sizes: list[int], fanout: int, bytes_max: int) -> int | None:
    """The first of the newest units (of these sizes, oldest first) a merge at rest takes, or None (fewer
    than two). Going back from the newest, a unit joins while it is at most ``fanout`` times the units
    after it together and the total stays within ``bytes_max``."""
    first = len(sizes) - 1
    total = sizes[-1] if sizes else 0
    while first > 0 and sizes[first - 1] <= fanout * total and total + sizes[first - 1] <= bytes_max:
        first -= 1
        total += sizes[first]
    return first if first < len(sizes) - 1 else None


_merge_runs: Any = native.merge_runs if native is not None else None
