"""Array counts checked against the bytes that remain, before kio reads a request.

kio's native reader reserves room for an array's whole count before it reads the first element: a
count of 10^9 in an 89-byte frame makes it ask for ~100 GB, and the allocation failure aborts the
process (found by fuzzing: ``stratalog chaos fuzz --target kafka_request``). Every element takes at
least one byte on the wire, so a count larger than the bytes left in the frame cannot be honest.
This module walks a request in Kafka's encoding, following the same kio schema, and refuses such a
frame; it reads nothing into memory but integers. Anything it cannot read (a truncated frame) it
leaves to kio, which refuses it properly.

Walk plans are compiled once per schema class: one tuple of steps per entity.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import types
import typing
from typing import Any

from stratalog.errors import StratalogError

#: Wire sizes of the fixed-size types (kio's ``kafka_type`` names).
FIXED_BYTES = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "float64": 8,
               "uuid": 16, "timedelta_i32": 4, "timedelta_i64": 8, "datetime_i64": 8}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
#: A varint longer than this is not one Kafka writes (a uint32 takes at most 5 bytes).
_VARINT_BYTES_MAX = 5

# Step kinds.
_FIXED, _STRING, _BYTES, _ENTITY = range(4)
Step = tuple[int, bool, Any]  # (kind, is_array, size in bytes for _FIXED, or the entity's plan)


class ArrayCountError(StratalogError, ValueError):
    """An array claims more elements than the frame has bytes left (the codec closes the connection)."""


class _TruncatedError(Exception):
    """The frame ends before the walk does: kio's refusal, not ours."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    name: str
    flexible: bool
    steps: tuple[tuple[str, Step], ...]


@functools.cache
def _plan(schema: Any) -> _Plan:
    steps: list[tuple[str, Step]] = []
    for field in dataclasses.fields(schema):
        if "tag" in field.metadata:
            continue  # tagged fields travel in the tagged-field section
        annotation: Any = field.type
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        is_array = typing.get_origin(annotation) is tuple
        if is_array:
            annotation = typing.get_args(annotation)[0]
        kafka_type = field.metadata.get("kafka_type")
        if kafka_type is None:
            steps.append((field.name, (_ENTITY, is_array, _plan(annotation))))
        elif kafka_type in FIXED_BYTES:
            steps.append((field.name, (_FIXED, is_array, FIXED_BYTES[kafka_type])))
        elif kafka_type == "string":
            steps.append((field.name, (_STRING, is_array, None)))
        else:  # bytes, records
            steps.append((field.name, (_BYTES, is_array, None)))
    return _Plan(schema.__name__, bool(schema.__flexible__), tuple(steps))


class _Walk:
    __slots__ = ("frame", "pos")

    def __init__(self, frame: bytes | memoryview, pos: int) -> None:
        self.frame = frame
        self.pos = pos

    def skip(self, size: int) -> None:
        if size < 0 or self.pos + size > len(self.frame):
            raise _TruncatedError
        self.pos += size

    def uvarint(self) -> int:
        value = shift = 0
        frame, pos = self.frame, self.pos
        for _ in range(_VARINT_BYTES_MAX):
            if pos >= len(frame):
                raise _TruncatedError
            byte = frame[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return value
            shift += 7
        raise _TruncatedError  # kio refuses an over-long varint

    def length(self, flexible: bool, small: bool) -> int:
        """A string's (``small``: int16 when not flexible), bytes' or array's length; -1: null."""
        if flexible:
            return self.uvarint() - 1
        fmt = _INT16 if small else _INT32
        if self.pos + fmt.size > len(self.frame):
            raise _TruncatedError
        value: int = fmt.unpack_from(self.frame, self.pos)[0]
        self.pos += fmt.size
        return value

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.skip(self.uvarint())

    def entity(self, plan: _Plan) -> None:
        flexible = plan.flexible
        for name, (kind, is_array, arg) in plan.steps:
            count = 1
            if is_array:
                count = self.length(flexible, small=False)
                left = len(self.frame) - self.pos
                if count > left:
                    raise ArrayCountError(f"{plan.name}.{name}: an array of {count} elements in a frame with "
                                             f"{left} bytes left")
            for _ in range(count):
                if kind == _FIXED:
                    self.skip(arg)
                elif kind == _ENTITY:
                    self.entity(arg)
                else:
                    self.skip(max(0, self.length(flexible, small=kind == _STRING)))
        if flexible:
            self.tagged_fields()


def check_array_counts(frame: bytes | memoryview, body_position: int, schema: Any) -> None:
    """Refuse (ArrayCountError) a request body whose arrays claim more elements than bytes remain."""
    try:
        _Walk(frame, body_position).entity(_plan(schema))
    except _TruncatedError:
        return
