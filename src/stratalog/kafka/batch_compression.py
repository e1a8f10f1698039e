"""A record batch's payload compressed and decompressed: the batch-level side of ``codecs.py``, which
knows nothing of batches. Decompression is bounded (a few kilobytes of zeros inflate to gigabytes) and its
errors are the batch's (CorruptRecordError); recompression rewrites only the header fields the codec
changes. ``records.py`` decompresses through here to decode; ``record_check.py`` to check a produced
batch; the broker recompresses under a topic's ``compression.type``."""

from __future__ import annotations

from stratalog.kafka.batch_format import (
    ATTRIBUTES,
    ATTRIBUTES_POSITION,
    BATCH_BYTES_LIMIT,
    BATCH_LENGTH,
    BATCH_LENGTH_POSITION,
    COMPRESSION_MASK,
    CRC,
    CRC_COVERS_FROM_POSITION,
    CRC_POSITION,
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    RECORDS_POSITION,
    BatchHeader,
    CorruptRecordError,
    RecordBatchTooLargeError,
)
from stratalog.kafka.codecs import Compression, PayloadError, compress, decompress
from stratalog.wal.format import crc32c

__all__ = ["decompress_payload", "recompress", "uncompressed_records"]


def decompress_payload(codec: int, payload: memoryview, bytes_max: int) -> bytes:
    """``payload`` inflated by ``codec`` (not NONE), at most ``bytes_max`` bytes: CorruptRecordError,
    with the codec's message, for a damaged payload or one that inflates past the bound."""
    try:
        return decompress(codec, payload, bytes_max)
    except PayloadError as e:
        raise CorruptRecordError(str(e)) from None


def uncompressed_records(view: memoryview, header: BatchHeader, *, decompressed_bytes_max: int
                         ) -> bytes | memoryview:
    """The records of the batch ``view`` (exactly one batch, ``header`` its own) as they are before
    compression (a view when they are not compressed); decompression is bounded by
    ``decompressed_bytes_max``."""
    codec = header.attributes & COMPRESSION_MASK
    if codec == Compression.NONE:
        return view[RECORDS_POSITION:]
    return decompress_payload(codec, view[RECORDS_POSITION:], decompressed_bytes_max)


def recompress(view: memoryview, header: BatchHeader, codec: Compression, *, decompressed_bytes_max: int,
               records: bytes | memoryview | None = None) -> tuple[bytes, BatchHeader]:
    """The batch ``view`` (checked: ``header`` is its own) with its records compressed by ``codec`` instead,
    as a broker stores it under a topic's ``compression.type``. Every header field but the length, the
    codec bits and the CRC stays as the producer sent it (offsets, timestamps, producer id, epoch and
    sequence): the records are the same, only their payload's encoding changes. ``records``: the batch's
    records uncompressed, when the caller has them already (``check_records`` returns them); else they are
    decompressed here. Returns the new batch and its header."""
    if records is None:
        records = uncompressed_records(view, header, decompressed_bytes_max=decompressed_bytes_max)
    payload = bytes(records) if codec == Compression.NONE else compress(codec, bytes(records))
    batch_bytes = HEADER_BYTES + len(payload)
    if batch_bytes > BATCH_BYTES_LIMIT:
        raise RecordBatchTooLargeError(f"the batch recompressed with {codec.name.lower()} is {batch_bytes} bytes, "
                                       "more than the format allows")
    attributes = (header.attributes & ~COMPRESSION_MASK) | int(codec)
    out = bytearray(view[:HEADER_BYTES])
    BATCH_LENGTH.pack_into(out, BATCH_LENGTH_POSITION, batch_bytes - LOG_OVERHEAD_BYTES)
    ATTRIBUTES.pack_into(out, ATTRIBUTES_POSITION, attributes)
    out += payload
    crc = crc32c(memoryview(out)[CRC_COVERS_FROM_POSITION:])
    CRC.pack_into(out, CRC_POSITION, crc)
    return bytes(out), header._replace(batch_length=batch_bytes - LOG_OVERHEAD_BYTES, attributes=attributes, crc=crc)
