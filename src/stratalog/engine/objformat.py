"""The object format: data blocks of one stream's batches, an index, a footer. Spec: docs/formats/object.md.

::

    object     = data_block* index footer
    data_block = batch+                        -- one stream, offsets contiguous, batches unchanged
    index      = entry*                        -- in (stream_id, start_offset) order
    entry      = stream_id:u64 start_offset:u64 end_offset:u64 position:u64 size_bytes:u32
                 record_count:u32 max_timestamp_ms:i64 block_crc32c:u32
    footer     = index_position:u64 index_bytes:u32 index_crc32c:u32 entry_count:u32 version:u16
                 flags:u16 magic:u32 footer_crc32c:u32   -- crc32c of the 28 bytes before it

All little-endian. A reader needs only ranged gets: the footer (last 32 bytes), the index, then blocks.

Where a block belongs (its stream and the offset of its first record) is what its *placement* says: the
store's metadata row or manifest entry for the block, or, for an object read on its own, its index entry.
Batch headers inside a block are not consulted for it: an object a Spark task staged
(``FLAG_PROVISIONAL``) carries provisional stream ids and task-relative offsets in its index and headers,
and the commit registers its bytes unchanged with the real ones in metadata. :func:`placed_batches` walks
a block that way.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from stratalog.engine.batch import BatchInfo, read_batch_info
from stratalog.errors import StratalogError
from stratalog.wal.format import crc32c

OBJECT_MAGIC = 0x424F4C53  # "SLOB"
#: The version this code writes and reads. Version 2 gave ``flags`` a meaning; version 3 gives batch
#: headers an ``encoding`` (40 bytes, not 36), so that a block may hold Kafka record batches as stored.
OBJECT_FORMAT_VERSION = 3
#: Versions a reader accepts: 1 and 2 hold batches with the earlier header, which this code does not read.
OBJECT_FORMAT_VERSIONS = frozenset({3})
#: Footer flag (versions 2 and 3): the stream ids and offsets in this object's index and batch headers are
#: provisional (a Spark task wrote it before the commit assigned them). The store's metadata and
#: manifest hold the real ones for each block; they are authoritative for every object.
FLAG_PROVISIONAL = 0x0001
FLAGS_KNOWN = FLAG_PROVISIONAL
INDEX_ENTRY = struct.Struct("<QQQQIIqI")
FOOTER = struct.Struct("<QIIIHHII")
FOOTER_BYTES = FOOTER.size
FOOTER_CRC_COVERS_BYTES = FOOTER_BYTES - 4
#: A data block is closed at a batch boundary once it reaches this size: the unit of a ranged get and
#: of the block cache. 1 MiB keeps one get efficient on S3 and the cache granular.
DATA_BLOCK_BYTES_TARGET = 1 << 20


class CorruptObjectError(StratalogError):
    """An object's footer, index or block failed its CRC or is inconsistent."""


@dataclass(frozen=True, slots=True)
class BlockEntry:
    """Where one data block lies in an object, and what it holds."""

    stream_id: int
    start_offset: int
    end_offset: int
    position: int
    size_bytes: int
    record_count: int
    max_timestamp_ms: int
    crc: int


@dataclass(frozen=True, slots=True)
class StreamBatch:
    """One encoded batch with the facts the writer needs about it."""

    base_offset: int
    count: int
    max_timestamp_ms: int
    #: The batch's bytes; a view into a larger buffer is written as it is (a Spark write's batches are).
    data: bytes | memoryview


class ObjectBuilder:
    """Lays out one object in memory. Streams must be added in ascending id order."""

    def __init__(self, block_bytes_target: int = DATA_BLOCK_BYTES_TARGET, *, flags: int = 0) -> None:
        if flags & ~FLAGS_KNOWN:
            raise ValueError(f"unknown object flags {flags:#x}")
        self._flags = flags
        self._parts: list[bytes | memoryview] = []
        self._entries: list[BlockEntry] = []
        self._position = 0
        self._block_bytes_target = block_bytes_target
        self._last_stream = -1

    def add_stream(self, stream_id: int, batches: Sequence[StreamBatch]) -> list[BlockEntry]:
        """Append one stream's batches (contiguous offsets) as data blocks; return their entries."""
        if stream_id <= self._last_stream:
            raise ValueError("streams must be added in ascending id order, each once")
        self._last_stream = stream_id
        added: list[BlockEntry] = []
        block: list[StreamBatch] = []
        block_bytes = 0
        for batch in batches:
            if block and block_bytes + len(batch.data) > self._block_bytes_target:
                added.append(self._close_block(stream_id, block))
                block, block_bytes = [], 0
            block.append(batch)
            block_bytes += len(batch.data)
        if block:
            added.append(self._close_block(stream_id, block))
        return added

    def _close_block(self, stream_id: int, block: list[StreamBatch]) -> BlockEntry:
        if len(block) == 1:  # common with many small streams: no loops or generators
            only = block[0]
            size, count, max_ts, crc = len(only.data), only.count, only.max_timestamp_ms, crc32c(only.data)
            self._parts.append(only.data)
        else:
            for prev, nxt in itertools.pairwise(block):
                if prev.base_offset + prev.count != nxt.base_offset:
                    raise ValueError(f"stream {stream_id}: batches are not contiguous at {nxt.base_offset}")
            size, crc = 0, 0
            for batch in block:  # the block's CRC runs over its batches in turn: they are never joined
                size += len(batch.data)
                crc = crc32c(batch.data, crc)
                self._parts.append(batch.data)
            count, max_ts = sum(b.count for b in block), max(b.max_timestamp_ms for b in block)
        entry = BlockEntry(stream_id, block[0].base_offset, block[-1].base_offset + block[-1].count,
                           self._position, size, count, max_ts, crc)
        self._entries.append(entry)
        self._position += size
        return entry

    @property
    def entries(self) -> list[BlockEntry]:
        return list(self._entries)

    @property
    def data_bytes(self) -> int:
        return self._position

    def finish(self) -> bytes:
        """The whole object: blocks, index, footer."""
        return b"".join(self.finish_parts())

    def finish_parts(self) -> list[bytes | memoryview]:
        """The whole object as its parts, in order: each data block, the index, the footer. Written part by
        part, an object of tens of MiB is never joined: a join that size holds the GIL for milliseconds."""
        index = encode_index(self._entries)
        version = OBJECT_FORMAT_VERSION
        footer_head = FOOTER.pack(self._position, len(index), crc32c(index), len(self._entries),
                                  version, self._flags, OBJECT_MAGIC, 0)[:FOOTER_CRC_COVERS_BYTES]
        footer = footer_head + crc32c(footer_head).to_bytes(4, "little")
        return [*self._parts, index, footer]


def encode_index(entries: Iterable[BlockEntry]) -> bytes:
    return b"".join(
        INDEX_ENTRY.pack(e.stream_id, e.start_offset, e.end_offset, e.position, e.size_bytes,
                         e.record_count, e.max_timestamp_ms, e.crc)
        for e in entries
    )


@dataclass(frozen=True, slots=True)
class Footer:
    index_position: int
    index_bytes: int
    index_crc: int
    entry_count: int
    version: int = OBJECT_FORMAT_VERSION
    flags: int = 0

    @property
    def provisional(self) -> bool:
        """The index and batch headers hold provisional stream ids and offsets (see FLAG_PROVISIONAL)."""
        return bool(self.flags & FLAG_PROVISIONAL)


def decode_footer(raw: bytes, object_bytes: int) -> Footer:
    if len(raw) != FOOTER_BYTES:
        raise CorruptObjectError(f"object footer is {len(raw)} bytes, not {FOOTER_BYTES}")
    pos, index_bytes, index_crc, count, version, flags, magic, crc = FOOTER.unpack(raw)
    if magic != OBJECT_MAGIC or crc != crc32c(raw[:FOOTER_CRC_COVERS_BYTES]):
        raise CorruptObjectError("object footer: bad magic or CRC (not a stratalog object, or damaged)")
    if version not in OBJECT_FORMAT_VERSIONS:
        raise CorruptObjectError(f"object format version {version}; this stratalog reads versions "
                                 f"{', '.join(map(str, sorted(OBJECT_FORMAT_VERSIONS)))}")
    if flags & ~FLAGS_KNOWN:
        raise CorruptObjectError(f"object footer: flags {flags:#x} unknown to version {version}")
    if pos + index_bytes + FOOTER_BYTES != object_bytes or index_bytes != count * INDEX_ENTRY.size:
        raise CorruptObjectError("object footer: index position and sizes do not add up")
    return Footer(pos, index_bytes, index_crc, count, version, flags)


def decode_index(raw: bytes, footer: Footer) -> list[BlockEntry]:
    if crc32c(raw) != footer.index_crc:
        raise CorruptObjectError("object index: bad CRC")
    return [BlockEntry(*INDEX_ENTRY.unpack_from(raw, i * INDEX_ENTRY.size)) for i in range(footer.entry_count)]


_Data = TypeVar("_Data", bytes, memoryview)


def check_block(data: _Data, entry: BlockEntry) -> _Data:
    """Return ``data`` after checking it is the block ``entry`` describes."""
    if len(data) != entry.size_bytes or crc32c(data) != entry.crc:
        raise CorruptObjectError(
            f"data block of stream {entry.stream_id} at {entry.start_offset}: bad CRC or length; "
            "the object is damaged"
        )
    return data


def placed_batches(block: bytes | memoryview, entry: BlockEntry) -> Iterator[tuple[int, BatchInfo]]:
    """``(position, info)`` of each batch of a CRC-checked block, placed where ``entry`` says.

    ``info.stream_id`` is ``entry.stream_id`` and ``info.base_offset`` counts on from
    ``entry.start_offset`` (records of a block are dense and in order); the ids and offsets in the batch
    headers are ignored, as they are provisional in a staged object. Raises CorruptObjectError when the
    block's batches do not hold exactly ``entry``'s records (checked once the walk reaches the end).
    """
    at, base, size = 0, entry.start_offset, len(block)
    stream_id = entry.stream_id
    while at < size:
        header = read_batch_info(block, at)
        yield at, BatchInfo(stream_id, base, header.count, header.batch_bytes, header.max_timestamp_ms,
                            header.encoding)
        base += header.count
        at += header.batch_bytes
    if base != entry.end_offset:
        raise CorruptObjectError(f"data block of stream {stream_id} at {entry.start_offset}: its batches hold "
                                 f"{base - entry.start_offset} records, its entry says "
                                 f"{entry.end_offset - entry.start_offset}")
