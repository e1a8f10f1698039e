"""The console producer's input lines and the console consumer's output lines, without I/O.

Three formats, for keys, values and header values alike:

- ``text``: UTF-8. A line is the value, or ``KEY<separator>VALUE`` when a key separator is given.
  Output decodes UTF-8 and shows other bytes as backslash escapes (``\\xff``); a null key or value
  prints as ``null``, as Kafka's console consumer prints it.
- ``hex``: the same layout with keys and values in hexadecimal (``68690a`` for ``b"hi\\n"``).
- ``json``: one JSON object a line, lossless for any bytes::

      {"topic": "t", "partition": 0, "offset": 7, "timestamp_ms": 1700000000000,
       "key": "user-1", "value": "hello", "headers": [{"key": "trace", "value": "abc"}]}

  ``key``, ``value`` and a header's ``value`` are strings when the bytes are UTF-8, ``null`` when
  absent, and otherwise given as ``key_hex`` / ``value_hex`` instead. On input, ``topic``, ``offset`` are
  ignored, ``partition`` and ``timestamp_ms`` are used when present, and a ``value`` that is a JSON
  object, array, number or boolean is sent as its compact JSON text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Format(Enum):
    TEXT = "text"
    HEX = "hex"
    JSON = "json"


class RecordFormatError(ValueError):
    """An input line that does not hold a record in the chosen format."""


@dataclass(frozen=True)
class Record:
    """One record as the console tools see it: bytes, where it lives, and when."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    partition: int | None = None
    timestamp_ms: int | None = None
    topic: str | None = None
    offset: int | None = None


@dataclass(frozen=True)
class Fields:
    """What a text or hex output line shows besides the value, in this order, separated by tabs."""

    offset: bool = False
    timestamp: bool = False
    key: bool = False
    headers: bool = False
    separator: str = field(default="\t")


# Input -------------------------------------------------------------------------------------------------


def parse_line(line: str, fmt: Format, key_separator: str | None = None) -> Record:
    """The record an input line holds (its line ending already removed)."""
    if fmt is Format.JSON:
        return _parse_json(line)
    key_text: str | None = None
    value_text = line
    if key_separator:
        key_text, sep, value_text = line.partition(key_separator)
        if not sep:
            raise RecordFormatError(f"no key separator {key_separator!r} in {_shown(line)}")
    return Record(value=_from_text(value_text, fmt), key=None if key_text is None else _from_text(key_text, fmt))


def _from_text(text: str, fmt: Format) -> bytes:
    if fmt is Format.TEXT:
        return text.encode()
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise RecordFormatError(f"not hexadecimal: {_shown(text)}") from None


def _parse_json(line: str) -> Record:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        raise RecordFormatError(f"not JSON ({e.msg} at column {e.colno}): {_shown(line)}") from None
    if not isinstance(doc, dict):
        raise RecordFormatError(f"expected a JSON object a line, got {_shown(line)}")
    headers = doc.get("headers") or []
    if not isinstance(headers, list):
        raise RecordFormatError("headers: expected a list of {\"key\": ..., \"value\": ...}")
    return Record(value=_json_bytes(doc, "value", nested=True), key=_json_bytes(doc, "key", nested=False),
                  headers=tuple(_json_header(h) for h in headers),
                  partition=_json_int(doc, "partition"), timestamp_ms=_json_int(doc, "timestamp_ms"))


def _json_bytes(doc: dict[str, Any], name: str, nested: bool) -> bytes | None:
    if f"{name}_hex" in doc:
        hexed = doc[f"{name}_hex"]
        if not isinstance(hexed, str):
            raise RecordFormatError(f"{name}_hex: expected a string of hex digits")
        return _from_text(hexed, Format.HEX)
    given = doc.get(name)
    if given is None:
        return None
    if isinstance(given, str):
        return given.encode()
    if nested:
        return json.dumps(given, separators=(",", ":"), ensure_ascii=False).encode()
    raise RecordFormatError(f"{name}: expected a string or null (or {name}_hex)")


def _json_header(header: Any) -> tuple[str, bytes | None]:
    if not isinstance(header, dict) or not isinstance(header.get("key"), str):
        raise RecordFormatError(f"a header: expected {{\"key\": NAME, \"value\": ...}}, got {header!r}")
    return header["key"], _json_bytes(header, "value", nested=False)


def _json_int(doc: dict[str, Any], name: str) -> int | None:
    given = doc.get(name)
    if given is None:
        return None
    if not isinstance(given, int) or isinstance(given, bool) or given < 0:
        raise RecordFormatError(f"{name}: expected a non-negative integer, got {given!r}")
    return given


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


# Output ------------------------------------------------------------------------------------------------


def render(record: Record, fmt: Format, fields: Fields = Fields()) -> str:
    """The output line of a consumed record (no line ending)."""
    if fmt is Format.JSON:
        return _render_json(record)
    parts = []
    if fields.offset:
        parts.append(f"{record.partition}:{record.offset}")
    if fields.timestamp:
        parts.append("null" if record.timestamp_ms is None else str(record.timestamp_ms))
    if fields.key:
        parts.append(_to_text(record.key, fmt))
    if fields.headers:
        parts.append(",".join(f"{name}:{_to_text(value, fmt)}" for name, value in record.headers))
    parts.append(_to_text(record.value, fmt))
    return fields.separator.join(parts)


def _to_text(data: bytes | None, fmt: Format) -> str:
    if data is None:
        return "null"
    return data.hex() if fmt is Format.HEX else data.decode("utf-8", "backslashreplace")


def _render_json(record: Record) -> str:
    doc: dict[str, Any] = {"topic": record.topic, "partition": record.partition, "offset": record.offset,
                           "timestamp_ms": record.timestamp_ms}
    _put_bytes(doc, "key", record.key)
    _put_bytes(doc, "value", record.value)
    headers = []
    for name, value in record.headers:
        header: dict[str, Any] = {"key": name}
        _put_bytes(header, "value", value)
        headers.append(header)
    doc["headers"] = headers
    return json.dumps(doc, ensure_ascii=False)


def _put_bytes(doc: dict[str, Any], name: str, data: bytes | None) -> None:
    if data is None:
        doc[name] = None
        return
    try:
        doc[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        doc[f"{name}_hex"] = data.hex()
