"""The computing part of a compaction pass: the key map, built a block at a time, then pieces of blocks
rewritten into the parts of one object. engine/cleaner.py does the rest (what is due, reading blocks and
checking their CRC, writing objects, committing them); see its docstring for what a pass keeps.

Every record of a pass is decoded here, in Python, once for the key map and once for the rewrite. A
:class:`CleanWork` holds the key map between calls and takes blocks as bytes, so it runs in the caller's
thread or, the same code, in a process of its own (engine/cleaner_process.py) that takes none of the
broker's interpreter time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from stratalog.engine.batch import ENCODING_KAFKA, BatchInfo, decode_records, kafka_body, wrap_kafka_batch
from stratalog.engine.objformat import BlockEntry, ObjectBuilder, StreamBatch, placed_batches
from stratalog.invariant import invariant
from stratalog.kafka.compaction import (
    RawRecord,
    SourceBatch,
    gap_batch,
    kafka_batch_records,
    native_batch_records,
    rebuilt_batch,
)

#: Bytes of a key's digest in the key map: 16, as Kafka's cleaner (MD5), so that two keys of a partition
#: colliding is as unlikely as anything else going wrong (about 2**-64 for a billion keys).
KEY_DIGEST_BYTES = 16


def key_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=KEY_DIGEST_BYTES).digest()


@dataclass(frozen=True, slots=True)
class PassSettings:
    """What a pass's rewrite needs to know of its stream."""

    stream_id: int
    #: The stream's first offset: records below it are trimmed, and dropped.
    start_offset: int
    #: Tombstones older than this are dropped (now less ``delete.retention.ms``).
    tombstone_before_ms: int


@dataclass(frozen=True, slots=True)
class PieceOut:
    """One rewritten piece: the new object's parts, in order, and the blocks it holds."""

    entries: list[BlockEntry]
    parts: list[bytes | memoryview]
    records_kept: int


@dataclass(slots=True)
class _Piece:
    """The piece being rewritten: the batches kept so far and the run of emptied batches after them."""

    start_offset: int = -1
    end_offset: int = -1
    out: list[StreamBatch] = field(default_factory=list)
    records_kept: int = 0
    gap_start: int = -1
    gap_end: int = -1


class CleanWork:
    """One pass's key map and the piece it is rewriting. Calls come in this order: :meth:`begin`, then
    :meth:`map_block` for each dirty block, then for each piece :meth:`rewrite_block` for each of its
    blocks and :meth:`finish_piece`."""

    def __init__(self) -> None:
        self._keys: dict[bytes, int] = {}
        self._settings = PassSettings(0, 0, 0)
        self._piece = _Piece()

    def begin(self, settings: PassSettings) -> None:
        """Start a pass: an empty key map."""
        self._keys = {}
        self._settings = settings
        self._piece = _Piece()

    def map_block(self, block: bytes | memoryview, entry: BlockEntry) -> tuple[int, int]:
        """Add the keys of a CRC-checked block to the map; ``(records read, keys in the map)``."""
        keys = self._keys
        records = 0
        for _, source in _batches(block, entry):
            records += len(source.records)
            if source.header.is_transactional:
                continue   # kept whole (see rewrite_block): supersedes nothing
            for record in source.records:
                if record.key is not None:
                    keys[key_digest(record.key)] = record.offset
        return records, len(keys)

    def rewrite_block(self, block: bytes | memoryview, entry: BlockEntry) -> int:
        """Add the cleaned batches of a CRC-checked block to the piece; the records read."""
        piece = self._piece
        if piece.start_offset < 0:
            piece.start_offset = entry.start_offset
        invariant(piece.end_offset in (-1, entry.start_offset), "a piece's blocks are contiguous")
        piece.end_offset = entry.end_offset
        stream_id = self._settings.stream_id
        records = 0
        for info, source in _batches(block, entry):
            records += len(source.records)
            # Transactions' batches, their markers too, are kept whole: a marker has a key of its own (its
            # type), and a record of an aborted transaction must not supersede a committed one.
            kept = source.records if source.header.is_transactional else [r for r in source.records if self._kept(r)]
            if not kept:
                piece.gap_start = info.base_offset if piece.gap_end != info.base_offset else piece.gap_start
                piece.gap_end = info.end_offset
                continue
            if piece.gap_end == info.base_offset:
                piece.out.append(_gap(stream_id, piece.gap_start, piece.gap_end))
            piece.gap_end = -1
            piece.records_kept += len(kept)
            piece.out.append(_rebuilt(stream_id, info, source, kept))
        return records

    def finish_piece(self) -> PieceOut:
        """The piece rewritten as one object; the next :meth:`rewrite_block` starts a new piece."""
        piece, self._piece = self._piece, _Piece()
        if piece.gap_end != -1:
            piece.out.append(_gap(self._settings.stream_id, piece.gap_start, piece.gap_end))
        out = piece.out
        invariant(bool(out) and out[0].base_offset == piece.start_offset and
                  out[-1].base_offset + out[-1].count == piece.end_offset,
                  "a cleaned piece tiles the offsets of the blocks it replaces")
        builder = ObjectBuilder()
        builder.add_stream(self._settings.stream_id, out)
        parts = builder.finish_parts()
        return PieceOut(builder.entries, parts, piece.records_kept)

    def _kept(self, record: RawRecord) -> bool:
        if record.offset < self._settings.start_offset:
            return False   # trimmed: no reader sees it
        if record.key is None:
            return True    # written before the topic was compacted: nothing supersedes it
        if self._keys.get(key_digest(record.key), record.offset) > record.offset:
            return False   # a later record of its key supersedes it
        return not (record.null_value and record.timestamp_ms < self._settings.tombstone_before_ms)


def _batches(block: bytes | memoryview, entry: BlockEntry) -> list[tuple[BatchInfo, SourceBatch]]:
    """Each batch of a CRC-checked block with its records."""
    found: list[tuple[BatchInfo, SourceBatch]] = []
    for at, info in placed_batches(block, entry):
        if info.encoding == ENCODING_KAFKA:
            source = kafka_batch_records(kafka_body(block, at, info))
        else:
            source = native_batch_records(list(decode_records(block, at, info)), info.base_offset, info.count)
        found.append((info, source))
    return found


def _rebuilt(stream_id: int, info: BatchInfo, source: SourceBatch, kept: list[RawRecord]) -> StreamBatch:
    kafka = rebuilt_batch(source, kept)
    return StreamBatch(info.base_offset, info.count, info.max_timestamp_ms,
                       wrap_kafka_batch(stream_id, info.base_offset, info.count, info.max_timestamp_ms, kafka))


def _gap(stream_id: int, start: int, end: int) -> StreamBatch:
    kafka = gap_batch(start, end - start)
    return StreamBatch(start, end - start, -1, wrap_kafka_batch(stream_id, start, end - start, -1, kafka))
