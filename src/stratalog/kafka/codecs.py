"""Kafka's compression codecs for record batches: gzip, snappy (raw, or in the xerial framing of the Java
client), lz4 and zstd, decompressed under a bound and compressed as Kafka's producers do. Knows nothing of
batches: records.py calls it for a batch's payload and reports its errors as the batch's."""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable
from enum import IntEnum

import cramjam

from stratalog.invariant import invariant

#: Java's SnappyOutputStream (xerial) frames raw snappy blocks: a 16-byte header (this marker,
#: version:i32, compatible version:i32), then (block_bytes:i32 block)*. librdkafka writes raw snappy.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = struct.Struct(">8sii")
XERIAL_HEADER_BYTES = 16
XERIAL_BLOCK_LENGTH = struct.Struct(">i")
XERIAL_VERSION = 1
#: The block size Java's SnappyOutputStream uses, so our snappy batches look like the Java client's.
XERIAL_BLOCK_BYTES = 32 * 1024
#: lz4 and zstd frames need not state their size: decompression starts in a buffer of this guess
#: (ratio x compressed, at least the floor) and doubles it, up to decompressed_bytes_max.
DECOMPRESS_RATIO_GUESS = 8
DECOMPRESS_BUFFER_BYTES_MIN = 64 * 1024
#: lz4's fast mode, as Kafka's producers compressed before KIP-390: cramjam's default (4) is the
#: high-compression mode, six times slower here (1.5 ms against 0.26 ms for 100 KB), and a broker
#: that recompresses does it on its event loop.
LZ4_LEVEL = 1
#: zlib's window bits for the gzip container (RFC 1952), which Kafka's gzip codec uses.
GZIP_WBITS = 16 + zlib.MAX_WBITS


class Compression(IntEnum):
    """A record batch's codec: its attributes bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class PayloadError(ValueError):
    """A compressed payload is damaged, or inflates past its bound."""


def decompress(codec: int, payload: memoryview, bytes_max: int) -> bytes:
    """``payload`` inflated by ``codec`` (not NONE), at most ``bytes_max`` bytes of it: PayloadError for a
    damaged payload or one that inflates past the bound (a small batch can inflate to gigabytes)."""
    invariant(bytes_max >= 0, "decompressed_bytes_max must not be negative")
    try:
        if codec == Compression.GZIP:
            return _gunzip(payload, bytes_max)
        if codec == Compression.SNAPPY:
            return _unsnappy(payload, bytes_max)
        if codec == Compression.LZ4:
            return _decompress_growing(cramjam.lz4.decompress_into, payload, bytes_max, "lz4")
        invariant(codec == Compression.ZSTD, f"codec {codec} was not refused by check_batch")
        return _decompress_growing(cramjam.zstd.decompress_into, payload, bytes_max, "zstd")
    except (cramjam.DecompressionError, zlib.error) as e:
        raise PayloadError(f"{Compression(codec).name.lower()} payload is damaged: {e}") from None


def _too_large(what: str, bytes_max: int) -> PayloadError:
    return PayloadError(f"{what} decompresses to more than {bytes_max} bytes")


def _gunzip(payload: memoryview, bytes_max: int) -> bytes:
    """Every gzip member in ``payload`` (Java's GZIPInputStream reads concatenated members too)."""
    parts: list[bytes] = []
    total = 0
    rest: bytes | memoryview = payload
    while True:
        inflater = zlib.decompressobj(GZIP_WBITS)
        part = inflater.decompress(rest, bytes_max + 1 - total)
        total += len(part)
        if total > bytes_max:
            raise _too_large("gzip payload", bytes_max)
        if not inflater.eof:
            raise PayloadError("gzip payload is truncated")
        parts.append(part)
        rest = inflater.unused_data
        if not rest:
            return b"".join(parts)


def _unsnappy(payload: memoryview, bytes_max: int) -> bytes:
    """Raw snappy (librdkafka), or raw snappy blocks in xerial framing (the Java client). Each raw
    block states its size up front, so the bound is checked before anything is inflated."""
    if len(payload) < XERIAL_HEADER_BYTES or payload[:len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        blocks = [payload]
    else:
        # Version and compatible version are not checked: some producers write them little-endian.
        blocks = []
        p = XERIAL_HEADER_BYTES
        while p < len(payload):
            if len(payload) - p < XERIAL_BLOCK_LENGTH.size:
                raise PayloadError("snappy (xerial) block length is truncated")
            (block_bytes,) = XERIAL_BLOCK_LENGTH.unpack_from(payload, p)
            p += XERIAL_BLOCK_LENGTH.size
            if block_bytes < 0 or p + block_bytes > len(payload):
                raise PayloadError(f"snappy (xerial) block of {block_bytes} bytes runs past the payload")
            blocks.append(payload[p:p + block_bytes])
            p += block_bytes
    sizes = []
    total = 0
    for block in blocks:
        size = cramjam.snappy.decompress_raw_len(block)
        total += size
        if total > bytes_max:
            raise _too_large("snappy payload", bytes_max)
        sizes.append(size)
    out = bytearray(total)
    with memoryview(out) as view:
        at = 0
        for block, size in zip(blocks, sizes, strict=True):
            if cramjam.snappy.decompress_raw_into(block, view[at:at + size]) != size:
                raise PayloadError("snappy block is shorter than it says")
            at += size
    return bytes(out)


def _decompress_growing(decompress_into: Callable[[memoryview, bytearray], int], payload: memoryview,
                        bytes_max: int, what: str) -> bytes:
    """lz4 and zstd frames need not state their size: inflate into a buffer that doubles until the
    data fits or the bound is reached. A too-small buffer fails after filling it, so work and memory
    stay within the bound; damaged data fails the same way, so it is refused at the bound."""
    size = min(bytes_max, max(DECOMPRESS_BUFFER_BYTES_MIN, len(payload) * DECOMPRESS_RATIO_GUESS))
    while True:
        out = bytearray(size)
        try:
            written = decompress_into(payload, out)
        except cramjam.DecompressionError as e:
            if size >= bytes_max:
                raise PayloadError(f"{what} payload is damaged or decompresses to more than "
                                         f"{bytes_max} bytes ({e})") from None
            size = min(bytes_max, size * 2)
            continue
        with memoryview(out) as view, view[:written] as filled:
            return bytes(filled)


def compress(codec: Compression, data: bytes) -> bytes:
    """``data`` compressed by ``codec`` (not NONE) as Kafka's producers do it."""
    if codec == Compression.GZIP:
        return gzip.compress(data, mtime=0)
    if codec == Compression.SNAPPY:
        parts = [XERIAL_HEADER.pack(XERIAL_MAGIC, XERIAL_VERSION, XERIAL_VERSION)]
        for at in range(0, len(data), XERIAL_BLOCK_BYTES):
            block = bytes(cramjam.snappy.compress_raw(data[at:at + XERIAL_BLOCK_BYTES]))
            parts += (XERIAL_BLOCK_LENGTH.pack(len(block)), block)
        return b"".join(parts)
    if codec == Compression.LZ4:
        # Independent blocks and no content checksum: what Kafka's own lz4 frames use.
        compressor = cramjam.lz4.Compressor(level=LZ4_LEVEL, block_linked=False, content_checksum=False)
        compressor.compress(data)
        return bytes(compressor.finish())
    invariant(codec == Compression.ZSTD, f"unknown codec {codec}")
    return bytes(cramjam.zstd.compress(data))
