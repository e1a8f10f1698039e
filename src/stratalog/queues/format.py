"""The bulk formats: one WAL record carrying many streams' messages, and one object holding many streams'
runs with a dense index. Spec: docs/formats/queues.md.

::

    bulk_record = header runs names ends data       -- the body of one WAL record (the WAL CRCs it)
    header      = magic:u32 version:u16 flags:u16 run_count:u32 message_count:u32 name_count:u32
                  stream_count:u32 data_bytes:u64
    runs        = stream_id:u32[run_count] base_offset:u32[run_count] count:u32[run_count]
                                                    -- ascending stream_id, each stream at most once
    names       = (stream_id:u32 name_bytes:u16 utf8)*  -- streams this record creates
    ends        = u32[message_count]                 -- end of each message in data, runs in order
    data        = the messages, back to back

    run_object  = run* names index page_crcs footer
    run         = ends:u32[count] data               -- one stream's messages in offset order; ends are
                                                        relative to the run's data
    names       = (stream_id:u32 name_bytes:u16 utf8)*  -- streams first_stream .. stream_count-1
    index       = end_offset:u32[stream_count] position:u32[stream_count + 1]
    page_crcs   = crc32c:u32[ceil(runs_bytes / PAGE_BYTES)] -- of each 4 KiB page of the runs
    footer      = names_position:u64 names_bytes:u32 first_stream:u32 stream_count:u32 message_count:u64
                  index_crc32c:u32 version:u16 flags:u16 magic:u32 footer_crc32c:u32

All little-endian. Stream ids here are dense (0, 1, 2, ...), so the index is a pair of arrays indexed by
stream id, not one entry per stream: 8 bytes per stream per object, read into memory as two NumPy
arrays. ``end_offset[s]`` is stream s's end after this object; its run is ``position[s] ..
position[s + 1]`` (empty when s has no messages here) and holds offsets from the end in the previous
object (0 in the first) up to ``end_offset[s]``. The runs are checked by pages, not one by one: a reader
reads the pages a run lies in (what the disk reads anyway) and checks each against its CRC; a writer
computes one CRC per 4 KiB rather than one per run (a million runs per object at a million queues).
"""

from __future__ import annotations

import array
import itertools
import operator
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from stratalog.errors import StratalogError
from stratalog.native import native
from stratalog.wal.format import crc32c

BULK_MAGIC = 0x42514C53  # "SLQB"
OBJECT_MAGIC = 0x4F514C53  # "SLQO"
FORMAT_VERSION = 1
#: Run objects: version 2 checks runs by pages (version 1 had a CRC in front of every run).
OBJECT_VERSION = 2
#: The runs of a run object are checked in pages of this many bytes, one CRC32C each.
PAGE_BYTES = 4096
BULK_HEADER = struct.Struct("<IHHIIIIQ")
NAME_HEAD = struct.Struct("<IH")
_NAME_HEAD_DTYPE = np.dtype([("stream_id", "<u4"), ("name_bytes", "<u2")])    # NAME_HEAD as a packed record
CRC = struct.Struct("<I")
OBJECT_FOOTER = struct.Struct("<QIIIQIHHII")
OBJECT_FOOTER_BYTES = OBJECT_FOOTER.size
FOOTER_CRC_COVERS_BYTES = OBJECT_FOOTER_BYTES - 4
#: Offsets and positions are u32: a stream holds at most this many messages, an object this many bytes.
STREAM_MESSAGES_MAX = (1 << 32) - 1
OBJECT_BYTES_MAX = (1 << 32) - 1
#: Names are length-prefixed with a u16; 255 characters of UTF-8 take at most 1020 bytes.
NAME_BYTES_MAX = 0xFFFF

U32 = np.dtype("<u4")
I64 = np.dtype(np.int64)

Ids = npt.NDArray[np.int64]
U32s = npt.NDArray[np.uint32]


class CorruptBulkError(StratalogError):
    """A bulk record or run object failed its CRC or its parts do not add up."""


@dataclass(frozen=True, slots=True)
class BulkRecord:
    """A decoded bulk record. ``ends`` and ``data`` view the record's bytes (no copy)."""

    stream_ids: Ids
    base_offsets: Ids
    counts: Ids
    names: list[tuple[int, str]]
    stream_count: int
    ends: U32s
    data: memoryview


def encode_names(names: Sequence[tuple[int, str]]) -> bytes:
    """The names section of ``(stream_id, name)`` pairs: each name's head (id, UTF-8 length) then its bytes,
    laid out by one Arrow ``take`` (a million new queues bring a million names at once)."""
    if not names:
        return b""
    count = len(names)
    ids = np.fromiter(map(operator.itemgetter(0), names), I64, count)
    encoded = pa.array(list(map(operator.itemgetter(1), names)), pa.string())
    lengths = np.asarray(pc.binary_length(encoded), I64)
    if int(lengths.max()) > NAME_BYTES_MAX:
        at = int(np.argmax(lengths))
        raise ValueError(f"name of stream {ids[at]} is {lengths[at]} UTF-8 bytes; at most {NAME_BYTES_MAX}")
    heads = np.empty(count, _NAME_HEAD_DTYPE)
    heads["stream_id"] = ids
    heads["name_bytes"] = lengths
    head_array = pa.Array.from_buffers(pa.binary(), count, [
        None, pa.py_buffer(np.arange(0, NAME_HEAD.size * (count + 1), NAME_HEAD.size, dtype=np.int32)),
        pa.py_buffer(heads.tobytes())])
    order = np.empty(2 * count, I64)
    order[0::2] = np.arange(count)
    order[1::2] = np.arange(count, 2 * count)
    laid = pa.chunked_array([head_array, encoded.cast(pa.binary())]).take(pa.array(order)).combine_chunks()
    offsets = np.frombuffer(laid.buffers()[1], np.int32, 2 * count + 1, laid.offset)
    return bytes(memoryview(laid.buffers()[2])[int(offsets[0]):int(offsets[-1])])


def decode_names(buf: bytes | memoryview, pos: int, count: int) -> tuple[list[tuple[int, str]], int]:
    """``count`` names from ``buf[pos:]``; returns them and the position after them."""
    view = memoryview(buf)
    out: list[tuple[int, str]] = []
    unpack = NAME_HEAD.unpack_from
    for _ in range(count):
        if pos + NAME_HEAD.size > len(view):
            raise CorruptBulkError("a name runs past the end of its section")
        stream_id, size = unpack(view, pos)
        pos += NAME_HEAD.size
        if pos + size > len(view):
            raise CorruptBulkError("a name runs past the end of its section")
        try:
            name = bytes(view[pos:pos + size]).decode()
        except UnicodeDecodeError:   # escaped the reader before (found by fuzzing)
            raise CorruptBulkError(f"the name of stream {stream_id} is not UTF-8") from None
        out.append((stream_id, name))
        pos += size
    return out, pos


def encode_bulk(stream_ids: Ids, base_offsets: Ids, counts: Ids, names: Sequence[tuple[int, str]],
                stream_count: int, ends: npt.NDArray[np.integer], data: bytes | memoryview) -> list[bytes | memoryview]:
    """The parts of one bulk record (join them, or hand them to a writer that gathers)."""
    runs_u32 = np.concatenate([stream_ids, base_offsets, counts]).astype(U32).tobytes()
    return encode_bulk_parts(len(stream_ids), runs_u32, names, stream_count, ends.astype(U32).tobytes(), data)


def encode_bulk_parts(run_count: int, runs_u32: bytes | memoryview, names: Sequence[tuple[int, str]],
                      stream_count: int, ends_u32: bytes | memoryview,
                      data: bytes | memoryview) -> list[bytes | memoryview]:
    """:func:`encode_bulk` from its run section (stream ids, base offsets and counts, u32 each, one column
    after the other) and its messages' ends (u32) already laid out."""
    head = BULK_HEADER.pack(BULK_MAGIC, FORMAT_VERSION, 0, run_count, len(ends_u32) // 4, len(names), stream_count,
                            len(data))
    return [head, runs_u32, encode_names(names), ends_u32, data]


def decode_bulk(body: bytes | memoryview) -> BulkRecord:
    """Decode a bulk record (the WAL already checked its CRC); raise CorruptBulkError if it does not add up."""
    view = memoryview(body)
    if len(view) < BULK_HEADER.size:
        raise CorruptBulkError("bulk record shorter than its header")
    magic, version, _, run_count, message_count, name_count, stream_count, data_bytes = BULK_HEADER.unpack_from(view)
    if magic != BULK_MAGIC or version != FORMAT_VERSION:
        raise CorruptBulkError(f"not a bulk record (magic {magic:#x}, version {version})")
    pos = BULK_HEADER.size
    runs_bytes = 12 * run_count
    if pos + runs_bytes > len(view):
        raise CorruptBulkError("bulk record runs past its end")
    runs = np.frombuffer(view, U32, 3 * run_count, pos).astype(I64).reshape(3, run_count)
    pos += runs_bytes
    names, pos = decode_names(view, pos, name_count)
    if pos + 4 * message_count + data_bytes != len(view):
        raise CorruptBulkError("bulk record: ends and data do not add up to its length")
    ends = np.frombuffer(view, U32, message_count, pos)
    pos += 4 * message_count
    if int(runs[2].sum()) != message_count or (message_count and int(ends[-1]) != data_bytes):
        raise CorruptBulkError("bulk record: run counts or message ends do not match")
    if message_count > 1 and bool(np.any(ends[1:] < ends[:-1])):
        # Falling ends cut messages of negative length out of the data (found by fuzzing).
        raise CorruptBulkError("bulk record: message ends fall")
    return BulkRecord(runs[0], runs[1], runs[2], names, stream_count, ends, view[pos:])


@dataclass(frozen=True, slots=True)
class ObjectFooter:
    names_position: int
    names_bytes: int
    first_stream: int
    stream_count: int
    message_count: int
    index_crc: int

    @property
    def index_position(self) -> int:
        return self.names_position + self.names_bytes

    @property
    def index_bytes(self) -> int:
        """The index section and the page CRCs after it."""
        return 8 * self.stream_count + 4 + 4 * page_count(self.names_position)


def encode_footer(names_position: int, names_bytes: int, first_stream: int, stream_count: int,
                  message_count: int, index_crc: int) -> bytes:
    head = OBJECT_FOOTER.pack(names_position, names_bytes, first_stream, stream_count, message_count, index_crc,
                              OBJECT_VERSION, 0, OBJECT_MAGIC, 0)[:FOOTER_CRC_COVERS_BYTES]
    return head + CRC.pack(crc32c(head))


def decode_footer(raw: bytes, object_bytes: int) -> ObjectFooter:
    if len(raw) != OBJECT_FOOTER_BYTES:
        raise CorruptBulkError(f"run object footer is {len(raw)} bytes, not {OBJECT_FOOTER_BYTES}")
    names_pos, names_bytes, first, count, messages, index_crc, version, _, magic, crc = OBJECT_FOOTER.unpack(raw)
    if magic != OBJECT_MAGIC or crc != crc32c(raw[:FOOTER_CRC_COVERS_BYTES]):
        raise CorruptBulkError("run object footer: bad magic or CRC (not a run object, or damaged)")
    if version != OBJECT_VERSION:
        raise CorruptBulkError(f"run object version {version}; this stratalog reads version {OBJECT_VERSION} "
                               "(runs checked by pages)")
    footer = ObjectFooter(names_pos, names_bytes, first, count, messages, index_crc)
    if footer.index_position + footer.index_bytes + OBJECT_FOOTER_BYTES != object_bytes or first > count:
        raise CorruptBulkError("run object footer: sections do not add up to the object's size")
    return footer


def decode_index(raw: bytes, footer: ObjectFooter) -> tuple[list[tuple[int, str]], U32s, U32s, U32s]:
    """Names, end offsets, run positions and page CRCs from the bytes ``names_position .. index end``."""
    if len(raw) != footer.names_bytes + footer.index_bytes or crc32c(raw) != footer.index_crc:
        raise CorruptBulkError("run object index: bad CRC or length")
    names, pos = decode_names(raw, 0, footer.stream_count - footer.first_stream)
    if pos != footer.names_bytes:
        raise CorruptBulkError("run object names do not fill their section")
    if any(stream_id != expected for (stream_id, _), expected in zip(names, itertools.count(footer.first_stream))):
        # Recovery maps each name to the id beside it: an id out of place gave a queue another's id (found
        # by fuzzing, with CRCs made right).
        raise CorruptBulkError("run object names are not those of streams first_stream .. stream_count - 1")
    ends, positions, pages = index_arrays(raw, footer)
    if footer.stream_count and (np.any(np.diff(positions.astype(I64)) < 0)
                                or int(positions[-1]) != footer.names_position):
        raise CorruptBulkError("run object index: run positions are not in order")
    return names, ends, positions, pages


def index_arrays(raw: bytes, footer: ObjectFooter) -> tuple[U32s, U32s, U32s]:
    """End offsets, run positions and page CRCs (copies) from the bytes ``names_position .. index end``,
    whose length and CRC the caller checked."""
    n = footer.stream_count
    at = footer.names_bytes
    ends = np.frombuffer(raw, U32, n, at).copy()
    positions = np.frombuffer(raw, U32, n + 1, at + 4 * n).copy()
    pages = np.frombuffer(raw, U32, page_count(footer.names_position), at + 8 * n + 4).copy()
    return ends, positions, pages


def page_count(runs_bytes: int) -> int:
    return -(-runs_bytes // PAGE_BYTES)


def page_span(start: int, stop: int, runs_bytes: int) -> tuple[int, int]:
    """Bytes ``lo .. hi`` of the whole pages that hold bytes ``start .. stop`` of an object's runs."""
    return start - start % PAGE_BYTES, min(-(-stop // PAGE_BYTES) * PAGE_BYTES, runs_bytes)


def page_crcs(runs: Any) -> U32s:
    """The CRC of every page of ``runs`` (a buffer starting at a page; its last page may be short).
    Python ranges, not NumPy's: readers call this for every chunk they read ahead, and ``np.arange`` gives
    up the GIL, which beside other reader threads is a hand-over each time (8 consumer threads spent most
    of their waiting on it)."""
    view = memoryview(runs).cast("B")
    size = len(view)
    ends = range(PAGE_BYTES, size + PAGE_BYTES, PAGE_BYTES)
    pages = map(view.__getitem__, map(slice, range(0, size, PAGE_BYTES), ends))
    return np.fromiter(map(crc32c, pages), np.uint32, page_count(size))


def check_pages(raw: Any, at: int, crcs: U32s, key: str) -> None:
    """Check ``raw``, bytes ``at ..`` of object ``key``'s runs (``at`` on a page; the end on one or at the
    runs' end), against the object's page CRCs ``crcs``; raise CorruptBulkError naming the first bad page."""
    first = at // PAGE_BYTES
    size = len(raw)
    if size <= 2 * PAGE_BYTES and not at % PAGE_BYTES and first + (size > PAGE_BYTES) < len(crcs):
        # One page or two: most gets.
        if size <= PAGE_BYTES:
            if crc32c(raw) != crcs.item(first):
                _bad_page(key, first)
            return
        view = raw if type(raw) is memoryview else memoryview(raw)
        if crc32c(view[:PAGE_BYTES]) != crcs.item(first):
            _bad_page(key, first)
        if crc32c(view[PAGE_BYTES:]) != crcs.item(first + 1):
            _bad_page(key, first + 1)
        return
    if at % PAGE_BYTES or first + page_count(len(raw)) > len(crcs):
        raise CorruptBulkError(f"object {key}: a read of bytes {at} .. {at + len(raw)} is not within its pages")
    view = memoryview(raw).cast("B")
    if len(view) <= 4 * PAGE_BYTES:
        for i, page_at in enumerate(range(0, len(view), PAGE_BYTES)):
            if crc32c(view[page_at:page_at + PAGE_BYTES]) != int(crcs[first + i]):
                _bad_page(key, first + i)
        return
    got = page_crcs(view)
    want = crcs[first:first + len(got)]
    if got.tobytes() != want.tobytes():   # a compare of bytes keeps the GIL (see page_crcs)
        _bad_page(key, first + int(np.flatnonzero(got != want)[0]))


def _bad_page(key: str, page: int) -> NoReturn:
    raise CorruptBulkError(f"object {key}: page {page} (bytes {page * PAGE_BYTES} ..) failed its CRC: the object "
                           "is damaged")


class ObjectParts:
    """A run object laid out a slice of streams at a time, as parts to store one after the other (no joined
    copy). ``parts`` is iterated once: the runs in slices, then the names, index, page CRCs and footer;
    ``pages`` (the CRC of each page of the runs) is set once the last part has gone out."""

    __slots__ = ("ends", "pages", "parts", "positions", "size_bytes")

    def __init__(self, size_bytes: int, ends: U32s, positions: U32s) -> None:
        self.parts: Iterator[bytes | memoryview] = iter(())
        self.size_bytes = size_bytes
        self.ends = ends
        self.positions = positions
        self.pages: U32s | None = None


class PageCrcs:
    """The page CRCs of bytes that arrive in parts of any size."""

    def __init__(self) -> None:
        self._crcs: list[U32s] = []
        self._carry = b""    # the start of a page the next part completes

    def add(self, part: bytes | memoryview) -> None:
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


#: A chunk of messages: an Arrow binary array's int32 offsets (one more than its messages) and its bytes.
Chunk = tuple[npt.NDArray[np.int32], Any]


def chunks_of(arrays: Sequence[Any]) -> tuple[Chunk, ...]:
    """Arrow binary arrays as the chunks the compiled core reads (no copy)."""
    return tuple((np.frombuffer(a.buffers()[1], np.int32, len(a) + 1, a.offset * 4), a.buffers()[2] or b"")
                 for a in arrays)


#: An object's runs are laid out this many bytes at a time (about): each slice is fresh memory, so the slice,
#: not the object, bounds what an upload takes beside the log cache. Each slice costs a few dozen NumPy and
#: Arrow calls, each of which gives up the GIL and must get it back beside busy producers: not much smaller.
LAY_OUT_SLICE_BYTES = 64 << 20


def lay_out_object(prev_ends: U32s, stream_count: int, first_stream: int, names: Sequence[tuple[int, str]],
                   stream_ids: Ids, counts: Ids, messages: Any, order: Ids,
                   slice_bytes: int = LAY_OUT_SLICE_BYTES) -> ObjectParts:
    """Lay out one run object from Arrow binary ``messages`` (an array or a chunked array).

    ``stream_ids`` (ascending, distinct) and ``counts``: the streams present and how many messages each
    brings; ``order``: indices into ``messages`` of every message, streams in order, offsets in order.
    The sizes (so the index) come first, from the message lengths; the runs are then laid out as the parts
    are taken, about ``slice_bytes`` at a time: one Arrow ``take`` per slice places each run's message ends
    before its messages, and the slice's pages are checksummed as it goes (a C call each, no Python frame).
    ``messages`` and ``order`` must stay unchanged until the parts have all been taken.
    """
    ends = np.zeros(stream_count, U32)
    ends[:len(prev_ends)] = prev_ends
    ends[stream_ids] += counts.astype(U32)
    runs = len(counts)
    total = int(counts.sum())
    if runs and int(counts.min()) < 1:
        raise ValueError("every stream present brings at least one message")
    if slice_bytes < 1:
        raise ValueError("slice_bytes must be positive")
    lengths = pc.binary_length(messages)
    if isinstance(lengths, pa.ChunkedArray):
        lengths = lengths.combine_chunks() if lengths.num_chunks else pa.array([], pa.int32())
    # Lengths stay Arrow's int32 until they are summed (in int64): each message-long array is fresh memory
    # for every upload (a fault and a cleared page each, on a VM whose host takes freed memory back).
    lengths = np.asarray(lengths)
    run_first = np.zeros(runs + 1, I64)
    np.cumsum(counts, out=run_first[1:])
    data_bytes = np.add.reduceat(lengths[order], run_first[:-1], dtype=I64) if total else np.zeros(runs, I64)
    run_bytes = 4 * counts + data_bytes
    sizes = np.zeros(stream_count, I64)
    sizes[stream_ids] = run_bytes
    positions64 = np.zeros(stream_count + 1, I64)
    np.cumsum(sizes, out=positions64[1:])
    del sizes
    runs_bytes = int(positions64[-1])
    names_raw = encode_names(names)
    index_bytes = len(names_raw) + 4 * stream_count + 4 * (stream_count + 1) + 4 * page_count(runs_bytes)
    size = runs_bytes + index_bytes + OBJECT_FOOTER_BYTES
    if size > OBJECT_BYTES_MAX:
        raise ValueError(f"a run object of {size} bytes exceeds {OBJECT_BYTES_MAX}: upload smaller batches")
    # Slices of whole runs, about slice_bytes each.
    run_ends = np.cumsum(run_bytes)
    marks = np.arange(slice_bytes, runs_bytes, slice_bytes, dtype=I64)
    bounds = np.unique(np.concatenate(([0], np.searchsorted(run_ends, marks, side="right"), [runs]))).tolist()
    layout = ObjectParts(size, ends, positions64.astype(U32))
    index_head = names_raw + ends.tobytes() + layout.positions.tobytes()
    footer_fields = (runs_bytes, len(names_raw), first_stream, stream_count, total)
    if _lay_out_runs is not None:
        layout.parts = _laid_parts_native(layout, messages, order, run_first, run_ends, bounds, index_head,
                                          footer_fields)
    else:
        layout.parts = _laid_parts(layout, messages, lengths, order, counts, run_first, run_ends, bounds, index_head,
                                   footer_fields=footer_fields)
    return layout


def _laid_parts_native(layout: ObjectParts, messages: Any, order: Ids, run_first: Ids, run_ends: Ids,
                       bounds: list[int], index_head: bytes,
                       footer_fields: tuple[int, int, int, int, int]) -> Iterator[bytes | memoryview]:
    """:func:`_laid_parts` with each slice one C call (``_native.lay_out_runs``, the GIL released while it
    copies), straight from the records' messages: no joined copy of them, no take."""
    chunks = chunks_of(messages.chunks if isinstance(messages, pa.ChunkedArray) else [messages])
    pages = PageCrcs()
    for a, b in itertools.pairwise(bounds):
        # Out into Arrow's pool, which reuses freed memory (a bytes object of a slice's size is fresh pages).
        body = pa.allocate_buffer(int(run_ends[b - 1]) - (int(run_ends[a - 1]) if a else 0))
        _lay_out_runs(chunks, order, run_first, a, b, body)
        view = memoryview(body)
        pages.add(view)
        yield view
    yield _index_part(layout, pages, index_head, footer_fields)


def _index_part(layout: ObjectParts, pages: PageCrcs, index_head: bytes,
                footer_fields: tuple[int, int, int, int, int]) -> bytes:
    """An object's last part, once its runs are laid out: the index (``index_head``, the page CRCs) and the
    footer; the page CRCs are kept in ``layout``."""
    crcs = pages.finish()
    layout.pages = crcs
    index_raw = index_head + crcs.tobytes()
    return index_raw + encode_footer(*footer_fields, crc32c(index_raw))


def _laid_parts(layout: ObjectParts, messages: Any, lengths: npt.NDArray[np.int32], order: Ids, counts: Ids,
                run_first: Ids, run_ends: Ids, bounds: list[int], index_head: bytes,
                footer_fields: tuple[int, int, int, int, int]) -> Iterator[bytes | memoryview]:
    """The parts of ``layout``: runs ``bounds[i] .. bounds[i + 1]`` (of those present) for each i, then the
    index (``index_head`` and the page CRCs) and the footer. The twin of ``_native.lay_out_runs`` (its
    slices), in NumPy and Arrow."""
    runs, total = len(counts), len(order)
    # Each run's head (its message ends, relative to its data) as one element, after the messages in one
    # array the slices take from. One array, made once: Arrow's take on a chunked array joins its chunks
    # first, on every call (with a take per slice, that copied the log cache's messages four or five times
    # an upload, each copy fresh memory).
    all_ends = np.zeros(total + 1, I64)
    np.cumsum(lengths[order], out=all_ends[1:])
    head_words = np.repeat(all_ends[run_first[:-1]], counts)
    np.subtract(all_ends[1:], head_words, out=head_words)
    del all_ends
    heads = pa.Array.from_buffers(pa.binary(), runs, [None, pa.py_buffer((4 * run_first).astype(np.int32)),
                                                      pa.py_buffer(head_words.astype(U32))])
    del head_words
    chunks = messages.chunks if isinstance(messages, pa.ChunkedArray) else [messages]
    # (Binary offsets are 32-bit: past 2 GiB of messages and heads, 64-bit ones.)
    wide = runs > 0 and int(run_ends[-1]) >= 1 << 31
    values_type = pa.large_binary() if wide else pa.binary()
    offset_type = np.dtype(I64 if wide else np.int32)
    values = pa.concat_arrays([c if c.type == values_type else c.cast(values_type) for c in [*chunks, heads]])
    del chunks, heads
    heads_at = len(values) - runs
    pages = PageCrcs()
    for a, b in itertools.pairwise(bounds):
        n = b - a
        m0, m1 = int(run_first[a]), int(run_first[b])
        # Where each run's head goes in this slice's take: before its messages.
        slot = run_first[a:b] - m0 + np.arange(n, dtype=I64)
        is_message = np.ones(n + m1 - m0, bool)
        is_message[slot] = False
        take = np.empty(n + m1 - m0, offset_type)
        take[slot] = np.arange(heads_at + a, heads_at + b, dtype=take.dtype)
        take[is_message] = order[m0:m1]
        laid = values.take(pa.array(take))
        del take, is_message, slot
        offsets = np.frombuffer(laid.buffers()[1], offset_type, len(laid) + 1, offset_type.itemsize * laid.offset)
        lo, hi = int(offsets[0]), int(offsets[-1])
        want = int(run_ends[b - 1]) - (int(run_ends[a - 1]) if a else 0)
        if hi - lo != want:
            raise AssertionError(f"laid-out runs of {hi - lo} bytes where their sizes add up to {want}")
        body = memoryview(laid.buffers()[2])[lo:hi]
        del laid, offsets
        pages.add(body)
        yield body
    del values
    yield _index_part(layout, pages, index_head, footer_fields)


def build_object(prev_ends: U32s, stream_count: int, first_stream: int, names: Sequence[tuple[int, str]],
                 stream_ids: Ids, counts: Ids, msg_ends: npt.NDArray[np.integer],
                 data: memoryview) -> tuple[bytearray, U32s, U32s]:
    """One run object as bytes: ``msg_ends`` are the ends of the messages in ``data`` (streams in order,
    offsets in order). Returns the object and its index arrays (end offsets, run positions)."""
    offsets = np.zeros(len(msg_ends) + 1, np.int32)
    offsets[1:] = msg_ends
    messages = pa.Array.from_buffers(pa.binary(), len(msg_ends), [None, pa.py_buffer(offsets),
                                                                   pa.py_buffer(data)])
    laid = lay_out_object(prev_ends, stream_count, first_stream, names, stream_ids, counts, messages,
                          np.arange(len(msg_ends), dtype=I64))
    return bytearray(b"".join(laid.parts)), laid.ends, laid.positions


def run_crcs(view: memoryview, starts: npt.NDArray[np.int64], stops: npt.NDArray[np.int64]) -> npt.NDArray[np.uint32]:
    """CRC32C of ``view[starts[i]:stops[i]]`` for every i, iterated in C (no Python frame per slice)."""
    pieces = map(view.__getitem__, map(slice, starts.tolist(), stops.tolist()))
    return np.fromiter(map(crc32c, pieces), np.uint32, len(starts))


def u32_at(data: npt.NDArray[np.uint8], at: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The little-endian u32 at each byte position ``at`` of ``data`` (unaligned)."""
    words: npt.NDArray[np.int64] = data[at[:, None] + np.arange(4)].copy().view(U32).reshape(-1).astype(I64)
    return words


def frame_run(raw: bytes | memoryview, count: int, key: str, stream_id: int) -> None:
    """Check that one run whose pages were checked (stream ``stream_id`` in object ``key``, ``count``
    messages) is framed by its message ends."""
    ends_at = 4 * count
    if len(raw) < ends_at:
        raise CorruptBulkError(f"run of stream {stream_id} in object {key}: shorter than its message ends; "
                               "the object is damaged")
    if count and int.from_bytes(raw[ends_at - 4:ends_at], "little") != len(raw) - ends_at:
        raise CorruptBulkError(f"run of stream {stream_id} in object {key}: message ends do not match its length")


def run_messages(raw: bytes | memoryview, count: int, first: int, stop: int, key: str | None = None,
                 stream_id: int = -1) -> list[bytes]:
    """Messages ``first .. stop - 1`` of a run of ``count`` messages checked by :func:`frame_run` (only
    those are copied), or, given the object's ``key`` (and the run's stream, for the error), checked here
    as frame_run would (one call fewer for a reader that reads each run once). Where they are all as long
    as the run's first message (the common case: a queue's messages are often of one size), one ``struct``
    call cuts them out; otherwise a plain loop over the ends (for ten messages or a hundred, twice as fast
    as building the slices with map). Ends out of order or past the run (in a run whose pages passed
    their CRCs: written so) cut as Python slices do, clamped to the run."""
    at = 4 * count
    if key is not None and len(raw) < at:
        frame_run(raw, count, key, stream_id)      # raises: shorter than its message ends
    ends = memoryview(raw)[:at].cast("I")   # little-endian on disk; checked at import
    if key is not None and count and ends[count - 1] != len(raw) - at:
        frame_run(raw, count, key, stream_id)      # raises: the ends do not frame it
    if stop > first:
        size = ends[0]
        # Equal sizes from the run's start up to ``stop``: then the ends are size, 2 size, 3 size, ...
        # (a compare of two views, in C; from message ``first - 1`` on, which is all the slice needs).
        if 0 < size <= FIXED_MESSAGE_BYTES_MAX and stop <= FIXED_RUN_MAX and at + stop * size <= len(raw):
            checked = first - 1 if first else 0
            multiples = _multiples_of.get(size)   # (the caches looked up here first: a call costs a tenth)
            if multiples is None or len(multiples) < stop:
                multiples = _multiples(size, stop)
            if ends[checked:stop] == multiples[checked:stop]:
                cut = _fixed_structs.get((size, stop - first)) or _fixed_struct(size, stop - first)
                return list(cut.unpack_from(raw, at + first * size))
    if type(raw) is not bytes:
        raw = bytes(raw)   # a view: its slices would be views too
    lo = at + ends[first - 1] if first else at
    out = []
    for end in ends[first:stop]:
        out.append(raw[lo:at + end])
        lo = at + end
    return out


#: Runs cut by one struct call: messages up to this size, and up to this many messages into the run
#: (beyond, the loop: a struct of n fields costs tens of bytes a field to hold).
FIXED_MESSAGE_BYTES_MAX = 64 << 10
FIXED_RUN_MAX = 4096
#: Compiled structs held (by message size and count), at most this many fields in all (a field takes
#: 32 bytes: 8 MiB), and tables of multiples for at most this many sizes (16 KiB each at most): each
#: cache is cleared when full, so whatever the mix of sizes and counts, memory stays bounded.
_FIXED_FIELDS_MAX = 256 << 10
_MULTIPLES_SIZES_MAX = 256
_fixed_structs: dict[tuple[int, int], struct.Struct] = {}
_fixed_fields = [0]
_multiples_of: dict[int, memoryview] = {}


def _fixed_struct(size: int, n: int) -> struct.Struct:
    """A struct of ``n`` byte strings of ``size`` bytes each."""
    got = _fixed_structs.get((size, n))
    if got is None:
        if _fixed_fields[0] + n > _FIXED_FIELDS_MAX:
            _fixed_structs.clear()
            _fixed_fields[0] = 0
        got = _fixed_structs[size, n] = struct.Struct("<" + f"{size}s" * n)
        _fixed_fields[0] += n
    return got


def _multiples(size: int, n: int) -> memoryview:
    """``size, 2 size, .., n size`` (at least) as native u32, to compare a run's ends with."""
    got = _multiples_of.get(size)
    if got is None or len(got) < n:
        if len(_multiples_of) >= _MULTIPLES_SIZES_MAX:
            _multiples_of.clear()
        length = max(n, 256)
        got = _multiples_of[size] = memoryview(array.array("I", range(size, size * (length + 1), size)))
    return got


def decode_run(raw: bytes, count: int, key: str, stream_id: int) -> list[bytes]:
    """The ``count`` messages of one run (stream ``stream_id`` in object ``key``; its pages checked)."""
    frame_run(raw, count, key, stream_id)
    return run_messages(raw, count, 0, count)


# Runs are decoded by casting their ends to native u32: the formats are little-endian, and so must be the host.
if sys.byteorder != "little":
    raise ImportError("stratalog's bulk formats are read natively and need a little-endian host")


_lay_out_runs: Any = native.lay_out_runs if native is not None else None
