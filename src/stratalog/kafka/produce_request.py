"""Produce requests read in one pass, without kio: the one request on every produced batch's path.

Every other request goes through kio (``codec.decode_request``). For Produce, kio's generic reader was
the largest part of a small produce's computing time (``bench produce-path``: 11.5 of 15.3 µs for one
256 B record, most of it building frozen dataclasses). This module reads Produce versions 3-9 by the
schema (Apache Kafka's ProduceRequest.json, RequestHeader.json) into plain tuples, and is the twin and
reference of the compiled ``stratalog._native.decode_produce``: same values, same errors, same messages.

A frame, after its size (every integer big-endian; v9 is flexible: compact lengths and tagged fields)::

    api_key i16, api_version i16, correlation_id i32    read before (codec.peek_header)
    client_id          nullable string, int16 length      in both header versions
    [v9] tagged fields                                   the header's
    transactional_id   nullable string
    acks               int16
    timeout_ms         int32
    topics             array of:
        name               string
        partitions         array of:
            index              int32
            records            nullable bytes              a batch or several, checked later
            [v9] tagged fields
        [v9] tagged fields
    [v9] tagged fields

Lengths: int16 for strings and int32 for bytes and arrays, -1 for null; flexible (compact), an unsigned
varint of the length plus one, 0 for null. A tagged field is a varint tag, a varint size and that many
bytes: unknown ones are skipped, as Kafka's rule is (kio refuses them). An array that claims more elements
than the bytes left could hold (each takes at least ``*_BYTES_MIN``) is refused before any is read. Bytes
after the body are ignored, as Kafka ignores them (see codec.decode_request).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from stratalog.errors import StratalogError
from stratalog.native import native

#: api_key, api_version, correlation_id: where the client id begins.
HEADER_PREFIX_BYTES = 8
#: A varint longer than this is not one Kafka writes (a uint32 takes at most 5 bytes).
VARINT_BYTES_MAX = 5
#: The least wire size of one topic (an empty name, no partitions) and of one partition (its index, null
#: records), in the two encodings: the bound on an array's count.
TOPIC_BYTES_MIN = 6
TOPIC_BYTES_MIN_FLEXIBLE = 3
PARTITION_BYTES_MIN = 8
PARTITION_BYTES_MIN_FLEXIBLE = 6

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

#: One topic's part: its name and ``(partition index, records or None)`` per partition; the records are a
#: view of the frame (no copy: the frame is immutable bytes, and the append copies them into the WAL).
ProduceTopic = tuple[str, tuple[tuple[int, memoryview | None], ...]]


class MalformedProduceError(StratalogError, ValueError):
    """The frame is not a Produce request of its version (the codec closes the connection)."""


class ProduceBody(NamedTuple):
    """A Produce request's body, as the handler reads it."""

    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: tuple[ProduceTopic, ...]


def decode_produce(frame: bytes | memoryview, flexible: bool) -> tuple[str | None, ProduceBody]:
    """``(client_id, body)`` of a Produce request frame (without its size); ``flexible`` for v9. Raises
    MalformedProduceError, or UnicodeDecodeError for a name that is not UTF-8."""
    client_id, transactional_id, acks, timeout_ms, topics = _decode(frame, flexible)
    return client_id, ProduceBody(transactional_id, acks, timeout_ms, topics)


def decode_produce_fields(frame: bytes | memoryview, flexible: bool) -> tuple[str | None, str | None, int, int,
                                                                   tuple[ProduceTopic, ...]]:
    """The reference: ``(client_id, transactional_id, acks, timeout_ms, topics)``, as the compiled twin
    returns them."""
    reader = _Reader(frame, flexible)
    reader.pos = HEADER_PREFIX_BYTES
    client_id = reader.nullable_string("client id", compact=False)
    if flexible:
        reader.tagged_fields("header's tagged fields")
    transactional_id = reader.nullable_string("transactional id")
    acks = reader.int16("acks")
    timeout_ms = reader.int32("timeout")
    topics = []
    for _ in range(reader.count("topics", TOPIC_BYTES_MIN_FLEXIBLE if flexible else TOPIC_BYTES_MIN)):
        name = reader.string("topic name")
        partitions = []
        for _ in range(reader.count("partitions", PARTITION_BYTES_MIN_FLEXIBLE if flexible else PARTITION_BYTES_MIN)):
            index = reader.int32("partition index")
            records = reader.records()
            if flexible:
                reader.tagged_fields("partition's tagged fields")
            partitions.append((index, records))
        if flexible:
            reader.tagged_fields("topic's tagged fields")
        topics.append((name, tuple(partitions)))
    if flexible:
        reader.tagged_fields("body's tagged fields")
    return client_id, transactional_id, acks, timeout_ms, tuple(topics)


class _Reader:
    """A position in a frame, moved by each field read."""

    __slots__ = ("data", "flexible", "pos", "view")

    def __init__(self, frame: bytes | memoryview, flexible: bool) -> None:
        # Fields are read from a bytes copy (indexing bytes is faster than a view); records are views.
        self.data, self.view, self.flexible, self.pos = bytes(frame), memoryview(frame), flexible, 0

    def take(self, size: int, what: str) -> int:
        """Where ``size`` bytes of ``what`` begin; the position moves past them."""
        if size > len(self.data) - self.pos:
            raise MalformedProduceError(f"the request ends in the {what}")
        at = self.pos
        self.pos += size
        return at

    def int16(self, what: str) -> int:
        return int(_INT16.unpack_from(self.data, self.take(2, what))[0])

    def int32(self, what: str) -> int:
        return int(_INT32.unpack_from(self.data, self.take(4, what))[0])

    def uvarint(self, what: str) -> int:
        value = 0
        for i in range(VARINT_BYTES_MAX):
            byte = self.data[self.take(1, what)]
            value |= (byte & 0x7F) << (7 * i)
            if byte < 0x80:
                return value
        raise MalformedProduceError(f"a varint of over {VARINT_BYTES_MAX} bytes in the {what}")

    def length(self, what: str, *, compact: bool, small: bool) -> int:
        """A string's (``small``: int16), bytes' or array's length; -1 for null."""
        size = self.uvarint(what) - 1 if compact else self.int16(what) if small else self.int32(what)
        if size < -1:
            raise MalformedProduceError(f"the {what} has the length {size}")
        return size

    def nullable_string(self, what: str, *, compact: bool | None = None) -> str | None:
        size = self.length(what, compact=self.flexible if compact is None else compact, small=True)
        if size == -1:
            return None
        at = self.take(size, what)
        return self.data[at:at + size].decode("utf-8")

    def string(self, what: str) -> str:
        value = self.nullable_string(what)
        if value is None:
            raise MalformedProduceError(f"the {what} is null")
        return value

    def records(self) -> memoryview | None:
        size = self.length("records", compact=self.flexible, small=False)
        if size == -1:
            return None
        at = self.take(size, "records")
        return self.view[at:at + size]

    def count(self, what: str, element_bytes_min: int) -> int:
        count = self.length(what, compact=self.flexible, small=False)
        if count == -1:
            raise MalformedProduceError(f"the {what} are null")
        left = len(self.data) - self.pos
        if count > left // element_bytes_min:
            raise MalformedProduceError(f"the {what}: an array of {count} elements with {left} bytes left")
        return count

    def tagged_fields(self, what: str) -> None:
        for _ in range(self.uvarint(what)):
            self.uvarint(what)   # the tag: none is known here
            self.take(self.uvarint(what), what)


_decode = native.decode_produce if native is not None else decode_produce_fields
