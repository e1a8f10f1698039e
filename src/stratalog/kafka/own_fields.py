"""The field reader and writer of the broker's own APIs (kafka/staged_commit.py, kafka/aborted_ranges.py):
Kafka's fixed-width big-endian integers and int16-length strings, every length checked against the bytes
left (and its own bound) before anything is made of it. Errors are KafkaProtocolError, named by the API."""

from __future__ import annotations

import struct

from stratalog.kafka.codec import FRAME_SIZE, KafkaProtocolError
from stratalog.kafka.records import INT16_MAX

I8, I16, I32, I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class FieldReader:
    """Fields from ``data`` at ``at`` onwards; KafkaProtocolError for any that does not fit or is not one."""

    def __init__(self, data: bytes | memoryview, at: int, api_name: str) -> None:
        self.data = memoryview(data)
        self.at = at
        self._api = api_name

    def left(self) -> int:
        return len(self.data) - self.at

    def fixed(self, fmt: struct.Struct) -> int:
        if self.left() < fmt.size:
            raise KafkaProtocolError(f"{self._api}: the frame ends inside a field at byte {self.at}")
        (value,) = fmt.unpack_from(self.data, self.at)
        self.at += fmt.size
        return int(value)

    def flag(self) -> bool:
        value = self.fixed(I8)
        if value not in (0, 1):
            raise KafkaProtocolError(f"{self._api}: a flag of {value} at byte {self.at - 1} (0 or 1)")
        return value == 1

    def nullable_string(self) -> str | None:
        length = self.fixed(I16)
        return None if length == -1 else self._text(length, INT16_MAX)

    def string(self, bytes_max: int = INT16_MAX) -> str:
        return self._text(self.fixed(I16), bytes_max)

    def _text(self, length: int, bytes_max: int) -> str:
        if length < 0 or length > self.left() or length > bytes_max:
            raise KafkaProtocolError(f"{self._api}: a string of {length} bytes at byte {self.at} (bytes left: "
                                     f"{self.left()}, at most {bytes_max})")
        raw = bytes(self.data[self.at:self.at + length])
        self.at += length
        try:
            return raw.decode()
        except UnicodeDecodeError as e:
            raise KafkaProtocolError(f"{self._api}: a string that is not UTF-8 ({e})") from None

    def count(self, entry_bytes_min: int, what: str, count_max: int | None = None) -> int:
        """An array's count: refused beyond ``count_max`` or beyond what the bytes left can hold, before the
        caller makes anything of it."""
        n = self.fixed(I32)
        if count_max is not None and n > count_max:
            raise KafkaProtocolError(f"{self._api}: {n} {what}; at most {count_max}")
        if n < 0 or n * entry_bytes_min > self.left():
            raise KafkaProtocolError(f"{self._api}: {n} {what} cannot fit the {self.left()} bytes left")
        return n

    def end(self) -> None:
        if self.left():
            raise KafkaProtocolError(f"{self._api}: {self.left()} bytes after the body, at byte {self.at}")


def put_string(out: bytearray, value: str | None) -> None:
    """A nullable int16-length string."""
    if value is None:
        out += I16.pack(-1)
        return
    raw = value.encode()
    if len(raw) > INT16_MAX:
        raise ValueError(f"a string of {len(raw)} bytes does not fit an int16 length")
    out += I16.pack(len(raw)) + raw


def framed(out: bytearray) -> bytes:
    """``out``, begun with FRAME_SIZE's room, with its size written there."""
    FRAME_SIZE.pack_into(out, 0, len(out) - FRAME_SIZE.size)
    return bytes(out)


def read_request_header(frame: bytes | memoryview, api_name: str) -> tuple[int, int, int, str | None, int]:
    """(api key, version, correlation id, client id, where the body starts) of a request frame with header
    v1 (no tagged fields) of the broker's own API ``api_name``."""
    r = FieldReader(frame, 0, api_name)
    api_key, version, correlation_id = r.fixed(I16), r.fixed(I16), r.fixed(I32)
    client_id = r.nullable_string()
    return api_key, version, correlation_id, client_id, r.at

