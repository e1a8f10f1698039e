"""Array counts checked against the bytes that remain, before kio reads a request.

kio's native reader reserves room for an array's whole count before it reads the first element: a
count of 10^9 in an 89-byte frame makes it ask for ~100 GB, and the allocation failure aborts the
process (found by fuzzing: ``stratalog chaos fuzz --target kafka_request``). Every element takes at
least one byte on the wire, so a count larger than the bytes left in the frame cannot be honest.
This module walks a request in Kafka's encoding, following the same kio schema, and refuses such a
frame; it reads nothing into memory but integers. Anything it cannot read (a truncated frame) it
leaves to kio, which refuses it properly.

Walk plans are compiled once per schema class: one tuple of steps per entity. The walk has a compiled
twin (src/native/array_counts.c) that reads the same plans.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import types
import typing
from typing import Any

from stratalog.errors import StratalogError
from stratalog.native import native

#: Wire sizes of the fixed-size types (kio's ``kafka_type`` names).
FIXED_BYTES = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "float64": 8,
               "uuid": 16, "timedelta_i32": 4, "timedelta_i64": 8, "datetime_i64": 8}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
#: A varint longer than this is not one Kafka writes (a uint32 takes at most 5 bytes).
_VARINT_BYTES_MAX = 5

# Step kinds.
FIXED, STRING, BYTES, ENTITY = range(4)
#: A walk plan, compiled once per schema class: ``(entity name, flexible, steps)``, each step ``(field name,
#: kind, is_array, arg)`` with arg the size in bytes for FIXED, the entity's plan for ENTITY, else None.
#: Plain tuples: the compiled twin reads the same plan.
Plan = tuple[str, bool, tuple[tuple[str, int, bool, Any], ...]]


class ArrayCountError(StratalogError, ValueError):
    """An array claims more elements than the frame has bytes left (the codec closes the connection)."""


class _TruncatedError(Exception):
    """The frame ends before the walk does: kio's refusal, not ours."""


@functools.cache
def plan_of(schema: Any) -> Plan:
    steps: list[tuple[str, int, bool, Any]] = []
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
            steps.append((field.name, ENTITY, is_array, plan_of(annotation)))
        elif kafka_type in FIXED_BYTES:
            steps.append((field.name, FIXED, is_array, FIXED_BYTES[kafka_type]))
        elif kafka_type == "string":
            steps.append((field.name, STRING, is_array, None))
        else:  # bytes, records
            steps.append((field.name, BYTES, is_array, None))
    return schema.__name__, bool(schema.__flexible__), tuple(steps)


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

    def entity(self, plan: Plan) -> None:
        entity_name, flexible, steps = plan
        for name, kind, is_array, arg in steps:
            count = 1
            if is_array:
                count = self.length(flexible, small=False)
                left = len(self.frame) - self.pos
                if count > left:
                    raise ArrayCountError(f"{entity_name}.{name}: an array of {count} elements in a frame with "
                                             f"{left} bytes left")
            for _ in range(count):
                if kind == FIXED:
                    self.skip(arg)
                elif kind == ENTITY:
                    self.entity(arg)
                else:
                    self.skip(max(0, self.length(flexible, small=kind == STRING)))
        if flexible:
            self.tagged_fields()


def walk_array_counts(frame: bytes | memoryview, body_position: int, plan: Plan) -> None:
    """Walk a request body by ``plan``: ArrayCountError for an array that claims more elements than bytes
    remain; None once walked, or where the frame ends first (kio refuses that). The reference of the
    compiled ``stratalog._native.check_array_counts``: same rules, same errors."""
    if not 0 <= body_position <= len(frame):
        return
    try:
        _Walk(frame, body_position).entity(plan)
    except _TruncatedError:
        return


_walk = native.check_array_counts if native is not None else walk_array_counts


def check_array_counts(frame: bytes | memoryview, body_position: int, schema: Any) -> None:
    """Refuse (ArrayCountError) a request body whose arrays claim more elements than bytes remain."""
    _walk(frame, body_position, plan_of(schema))
