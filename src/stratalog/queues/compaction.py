"""Compaction of run objects: several consecutive objects become one, each queue's runs joined into one.

At a million queues an upload of 256 MiB leaves about three messages per queue, so a queue's messages are
spread over one run per upload: a read of ten messages touches three or four objects and a consumer of a
hundred messages thirty. Merging ``fanout`` consecutive objects of one size tier into one object (then
``fanout`` of those, up to ``compact_object_bytes_max``) keeps the runs per queue near
``fanout * log_fanout(data / upload)``, at the cost of rewriting the data once per tier.

The merged object is an ordinary run object (docs/formats/queues.md): its runs hold, for each stream, the
messages of every source in order, its index the last source's end offsets, its names every source's
names. It is laid out a slice of streams at a time (about ``slice_bytes`` of sources), so the memory it
takes does not grow with the objects: per slice one ranged read of each source's pages, every page checked
against its CRC, two Arrow ``take`` calls gather the new runs, and the new pages' CRCs are computed as
the slices go out. Nothing of a source is carried over unchecked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from stratalog.engine.bulkformat import (
    I64,
    OBJECT_BYTES_MAX,
    OBJECT_FOOTER_BYTES,
    PAGE_BYTES,
    U32,
    CorruptBulkError,
    U32s,
    check_pages,
    decode_footer,
    encode_footer,
    index_arrays,
    page_count,
    page_crcs,
    page_span,
)
from stratalog.wal.format import crc32c

#: A read of bytes ``start .. end`` of one object.
RangeReader = Callable[[int, int], bytes]


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

    @classmethod
    def open(cls, key: str, read: RangeReader, size_bytes: int) -> MergeSource:
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


def merge_objects(sources: Sequence[MergeSource], prev_ends: U32s, slice_bytes: int,
                  result: MergeResult) -> Iterator[bytes | bytearray]:
    """The bytes of one run object holding ``sources`` (consecutive objects, oldest first) merged, in
    parts of about ``slice_bytes`` of sources each; ``result`` is filled as the parts go.

    ``prev_ends`` are the streams' ends before the first source (what the object before it ends at).
    Raises CorruptBulkError when a source's page fails its CRC or its index does not follow on.
    """
    if len(sources) < 2:
        raise ValueError("a merge takes at least two objects")
    last = sources[-1]
    stream_count = len(last.ends)
    first_stream = sources[0].first_stream
    if len(prev_ends) != first_stream:
        raise CorruptBulkError(f"object {sources[0].key} names streams from {first_stream}, but "
                               f"{len(prev_ends)} streams come before it")
    ends_rows = np.zeros((len(sources) + 1, stream_count), I64)
    ends_rows[0, :len(prev_ends)] = prev_ends
    positions = np.zeros((len(sources), stream_count + 1), I64)
    for j, src in enumerate(sources):
        n = len(src.ends)
        if j and src.first_stream != len(sources[j - 1].ends):
            raise CorruptBulkError(f"object {src.key} names streams from {src.first_stream}: it does not follow on")
        ends_rows[j + 1, :n] = src.ends
        ends_rows[j + 1, n:] = ends_rows[j, n:]
        positions[j, :n + 1] = src.positions
        positions[j, n + 1:] = src.positions[-1]
    counts = np.diff(ends_rows, axis=0)                  # [source, stream]
    if np.any(counts < 0):
        raise CorruptBulkError(f"objects {sources[0].key} .. {last.key}: a stream's end offset goes back")
    run_bytes = np.diff(positions, axis=1)               # [source, stream]
    header_bytes = 4 * counts
    data_bytes = run_bytes - header_bytes
    if np.any(data_bytes < 0) or np.any((counts == 0) & (run_bytes != 0)):
        raise CorruptBulkError(f"objects {sources[0].key} .. {last.key}: run sizes do not match their counts")
    out_run_bytes = 4 * counts.sum(axis=0) + data_bytes.sum(axis=0)
    out_positions = np.zeros(stream_count + 1, I64)
    np.cumsum(out_run_bytes, out=out_positions[1:])
    runs_bytes = int(out_positions[-1])
    names_raw = b"".join(src.names_raw for src in sources)
    index_raw = names_raw + ends_rows[-1].astype(U32).tobytes() + out_positions.astype(U32).tobytes()
    total = runs_bytes + len(index_raw) + 4 * page_count(runs_bytes) + OBJECT_FOOTER_BYTES
    if total > OBJECT_BYTES_MAX:
        raise ValueError(f"a merged object of {total} bytes exceeds {OBJECT_BYTES_MAX}: merge fewer objects")

    # Slices of streams holding about slice_bytes of sources each.
    source_bytes = positions.sum(axis=0)
    cuts = np.searchsorted(source_bytes, np.arange(0, int(source_bytes[-1]), max(1, slice_bytes)), side="left")
    bounds = np.unique(np.concatenate((cuts.clip(0, stream_count), [0, stream_count])))
    pages = _PageCrcs()
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        part = _merge_slice(sources, lo, hi, counts[:, lo:hi], positions[:, lo:hi + 1], header_bytes[:, lo:hi],
                            data_bytes[:, lo:hi], result)
        if len(part) != int(out_positions[hi] - out_positions[lo]):
            raise AssertionError("a merged slice is not the size its index says")
        pages.add(part)
        yield part
    crcs = pages.finish()
    index_raw += crcs.tobytes()
    yield index_raw + encode_footer(runs_bytes, len(names_raw), first_stream, stream_count,
                                    sum(s.message_count for s in sources), crc32c(index_raw))
    result.size_bytes = total
    result.ends = ends_rows[-1].astype(U32)
    result.positions = out_positions.astype(U32)
    result.pages = crcs


class _PageCrcs:
    """The page CRCs of bytes that arrive in parts of any size."""

    def __init__(self) -> None:
        self._crcs: list[U32s] = []
        self._carry = b""    # the start of a page the next part completes

    def add(self, part: bytes | bytearray) -> None:
        view = memoryview(part)
        if self._carry:
            need = PAGE_BYTES - len(self._carry)
            if len(view) < need:
                self._carry += bytes(view)
                return
            self._crcs.append(np.array([crc32c(self._carry + bytes(view[:need]))], U32))
            view = view[need:]
        whole = len(view) - len(view) % PAGE_BYTES
        self._crcs.append(page_crcs(view[:whole]))
        self._carry = bytes(view[whole:])

    def finish(self) -> U32s:
        if self._carry:
            self._crcs.append(np.array([crc32c(self._carry)], U32))
            self._carry = b""
        return np.concatenate(self._crcs) if self._crcs else np.zeros(0, U32)


def _merge_slice(sources: Sequence[MergeSource], lo: int, hi: int, counts: np.ndarray, positions: np.ndarray,
                 header_bytes: np.ndarray, data_bytes: np.ndarray, result: MergeResult) -> bytearray:
    """The merged runs of streams ``lo .. hi``."""
    m = hi - lo
    chunks = []
    for j, src in enumerate(sources):
        start, stop = int(positions[j, 0]), int(positions[j, -1])
        first, end = page_span(start, stop, int(src.positions[-1])) if stop > start else (start, start)
        raw = src.read(first, end) if end > first else b""
        if len(raw) != end - first:
            raise CorruptBulkError(f"object {src.key} is shorter than its index says")
        if raw:
            check_pages(raw, first, src.pages, src.key)
            result.pages_checked += page_count(len(raw))
        rel = positions[j] - first
        # Element 2s: stream s's message ends; element 2s + 1: its messages.
        offsets = np.empty(2 * m + 1, np.int64)
        offsets[0::2] = rel
        offsets[1::2] = rel[:-1] + header_bytes[j]
        chunks.append(pa.Array.from_buffers(pa.large_binary(), 2 * m, [None, pa.py_buffer(offsets),
                                                                        pa.py_buffer(raw)]))
    sources_array = pa.chunked_array(chunks, type=pa.large_binary())
    j_count = len(sources)
    chunk_base = 2 * m * np.arange(j_count, dtype=np.int64)
    stream = np.arange(m, dtype=np.int64)

    # Message ends of every (stream, source) run, streams first, shifted past the data of the sources
    # before it in that stream.
    headers = sources_array.take(pa.array((chunk_base[None, :] + 2 * stream[:, None]).ravel()))
    headers = headers.combine_chunks() if headers.num_chunks != 1 else headers.chunk(0)
    header_offsets = np.frombuffer(headers.buffers()[1], np.int64, len(headers) + 1, 8 * headers.offset)
    words = np.frombuffer(headers.buffers()[2] or b"", U32, int(header_offsets[-1] - header_offsets[0]) // 4,
                          int(header_offsets[0]))
    c = counts.T.ravel()                                  # [stream, source] order
    present = c > 0
    msg_ends = words.astype(np.int64)
    d = data_bytes.T.ravel()
    if np.any(msg_ends[(np.cumsum(c) - 1)[present]] != d[present]):
        raise CorruptBulkError(f"objects {sources[0].key} .. {sources[-1].key}: a run's message ends do not "
                               "match its length")
    shift = (np.cumsum(data_bytes, axis=0) - data_bytes).T.ravel()
    msg_ends += np.repeat(shift, c)

    # Each new run: its message ends (one element), then each source's messages.
    out_counts = counts.sum(axis=0)
    head_offsets = np.zeros(m + 1, np.int64)
    np.cumsum(4 * out_counts, out=head_offsets[1:])
    heads = pa.Array.from_buffers(pa.large_binary(), m, [None, pa.py_buffer(head_offsets),
                                                         pa.py_buffer(msg_ends.astype(U32).tobytes())])
    pieces = pa.chunked_array([heads, *chunks], type=pa.large_binary())
    order = np.empty((m, j_count + 1), np.int64)
    order[:, 0] = stream
    order[:, 1:] = m + chunk_base[None, :] + 2 * stream[:, None] + 1
    merged = pieces.take(pa.array(order.ravel()))
    merged = merged.combine_chunks() if merged.num_chunks != 1 else merged.chunk(0)
    merged_offsets = np.frombuffer(merged.buffers()[1], np.int64, len(merged) + 1, 8 * merged.offset)
    out = bytearray(memoryview(merged.buffers()[2] or b"")[int(merged_offsets[0]):int(merged_offsets[-1])])
    del merged, pieces, heads, headers, sources_array, chunks
    result.runs_written += int(np.count_nonzero(out_counts))
    return out

