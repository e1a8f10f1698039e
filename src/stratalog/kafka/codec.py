"""Kafka requests and responses as values: frames in, request dataclasses out, and back.

The message schemas are data: the ``kio`` package is generated from Apache Kafka's JSON schemas (one
dataclass per API and version, its parser native). This module adds what a server needs around them:
which header layout a request uses (v1, or v2 with tagged fields from an API's first flexible
version), the bounds checked before anything is decoded, and the split of errors into "the peer sent
garbage" (close the connection, say why) and "a version we do not serve" (answer with Kafka's error).
Pure functions: no sockets, no clock.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from kio.index import UnknownAPIKey, UnknownEntity
from kio.index import load_request_schema as _load_request_schema
from kio.index import load_response_schema as _load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from stratalog.errors import StratalogError
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.array_bounds import check_array_counts
from stratalog.kafka.produce_request import MalformedProduceError, decode_produce
from stratalog.kafka.produce_response import PRODUCE_FIRST_FLEXIBLE_VERSION

#: api_key:i16 api_version:i16 correlation_id:i32: the part of every request header that all
#: header versions share, read before the API is known.
HEADER_PREFIX = struct.Struct(">hhi")
FRAME_SIZE = struct.Struct(">i")
#: The broker's own APIs have keys from here up (kafka/staged_commit.py, kafka/aborted_ranges.py), far above Kafka's.
OWN_API_KEYS_FROM = 32_000


class KafkaProtocolError(StratalogError):
    """The peer sent bytes that are not a Kafka request we can parse: the connection is closed."""


class UnsupportedVersionError(StratalogError):
    """A request for an API or version this broker does not serve."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"API {api_key} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request: its header fields and its body (a kio request dataclass; for Produce, a
    ``produce_request.ProduceBody``)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    frame_bytes: int
    #: How long the response asks the client to wait: set by the server's quota check before the handler
    #: runs (0: no quota exceeded).
    throttle_ms: int = 0


#: kio finds a schema class by importing its module each time (3 µs a request): once per version here.
load_request_schema = functools.cache(_load_request_schema)
load_response_schema = functools.cache(_load_response_schema)


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a request frame (without its size prefix)."""
    if len(frame) < HEADER_PREFIX.size:
        raise KafkaProtocolError(f"a request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = HEADER_PREFIX.unpack_from(frame, 0)
    return int(api_key), int(api_version), int(correlation_id)


def decode_request(frame: bytes | memoryview, supported: Mapping[int, tuple[int, int]]) -> Request:
    """Decode one request frame (the bytes after its size). ``supported``: api key -> (min, max)
    version served. Raises UnsupportedVersionError or KafkaProtocolError."""
    api_key, api_version, correlation_id = peek_header(frame)
    versions = supported.get(api_key)
    if versions is None or not versions[0] <= api_version <= versions[1]:
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    if api_key >= OWN_API_KEYS_FROM:
        return _decode_own(frame, api_key, api_version, correlation_id)
    if api_key == ApiKey.PRODUCE:
        return _decode_produce(frame, api_version, correlation_id)
    schema = load_request_schema(api_key, api_version)
    try:
        header, header_bytes = entity_reader(schema.__header_schema__)(frame, 0)
        check_array_counts(frame, header_bytes, schema)  # before kio reserves room for them
        body, _ = entity_reader(schema)(frame, header_bytes)
    except (SerialError, ValueError, TypeError, IndexError, OverflowError, UnicodeDecodeError) as e:
        raise KafkaProtocolError(f"API {api_key} v{api_version}: malformed request ({e})") from e
    except KeyError as e:
        # kio's reader knows no tagged field beyond the schema's (Kafka's rule is to skip them; no client
        # sends any in the versions served), and says so with a KeyError.
        raise KafkaProtocolError(f"API {api_key} v{api_version}: {e.args[0] if e.args else e}") from e
    # Bytes after the body are ignored, as Apache Kafka ignores them (it reads a request's fields and never
    # checks that the frame ends there). librdkafka relies on it: its Metadata v12 for all topics carries
    # 3 bytes after the body, and refusing them failed every confluent-kafka list_topics. The frame
    # itself is bounded (request_bytes_max) before it is read.
    client_id = cast(str | None, getattr(header, "client_id", None))
    return Request(api_key, api_version, correlation_id, client_id, body, len(frame))


def _decode_produce(frame: bytes | memoryview, api_version: int, correlation_id: int) -> Request:
    """Produce, read without kio (stratalog.kafka.produce_request): the request of every produced batch."""
    try:
        client_id, body = decode_produce(frame, api_version >= PRODUCE_FIRST_FLEXIBLE_VERSION)
    except (MalformedProduceError, UnicodeDecodeError) as e:
        raise KafkaProtocolError(f"API {ApiKey.PRODUCE} v{api_version}: malformed request ({e})") from e
    return Request(ApiKey.PRODUCE, api_version, correlation_id, client_id, body, len(frame))


def _decode_own(frame: bytes | memoryview, api_key: int, api_version: int, correlation_id: int) -> Request:
    """A request of the broker's own APIs (not in Kafka's schemas: their modules say their format)."""
    from stratalog.kafka import aborted_ranges, staged_commit
    from stratalog.kafka.own_fields import read_request_header

    decoders: dict[int, tuple[str, Callable[[bytes | memoryview, int], Any]]] = {
        staged_commit.API_KEY: (staged_commit.API_NAME, staged_commit.decode_request_body),
        staged_commit.REPLACE_API_KEY: (staged_commit.REPLACE_API_NAME, staged_commit.decode_replace_body),
        aborted_ranges.API_KEY: (aborted_ranges.API_NAME, aborted_ranges.decode_request_body)}
    if api_key not in decoders:
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    name, decode = decoders[api_key]
    _, _, _, client_id, at = read_request_header(frame, name)
    return Request(api_key, api_version, correlation_id, client_id, decode(frame, at), len(frame))


def response_schema(api_key: int, api_version: int) -> type[Any]:
    """The kio response class of an API version this module can encode."""
    try:
        return load_response_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity) as e:
        raise UnsupportedVersionError(api_key, api_version, -1) from e


#: A response frame as the server sends it: bytes, or a list of pieces (header bytes between views of
#: stored records) for a gather write; either way the frame is the pieces joined.
EncodedResponse = bytes | list[bytes | memoryview]


@dataclass(frozen=True, slots=True)
class Prebuilt:
    """A response its handler encoded itself, a whole frame as pieces: Fetch answers with its records
    as views of the stored batches (``stratalog.kafka.fetch_response``), which kio would copy twice."""

    pieces: list[bytes | memoryview]
    #: The throttle time the handler wrote into the frame (the server mutes the connection as long).
    throttle_ms: int = 0


def encode_response(correlation_id: int, response: Any) -> bytes:
    """A whole response frame (size, header, body). The header layout (v0, or v1 with tagged fields)
    is the one the response's schema names: ApiVersions answers with v0 at every version."""
    header_schema = response.__header_schema__
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    entity_writer(header_schema)(out, header_schema(correlation_id=correlation_id))
    entity_writer(type(response))(out, response)
    frame = out.getbuffer()
    FRAME_SIZE.pack_into(frame, 0, len(frame) - FRAME_SIZE.size)
    del frame
    return out.getvalue()


# Client side: what a client writes and reads (the Spark driver's client, the fuzzer's seeds).


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: Any) -> bytes:
    """A request frame (without its size) as a client writes it: the header the API version uses, then
    the body (a kio request dataclass)."""
    schema = load_request_schema(api_key, api_version)
    header_schema = schema.__header_schema__
    values: dict[str, Any] = {"request_api_key": api_key, "request_api_version": api_version,
                              "correlation_id": correlation_id}
    if "client_id" in {f.name for f in dataclasses.fields(header_schema)}:
        values["client_id"] = client_id
    out = io.BytesIO()
    entity_writer(header_schema)(out, header_schema(**values))
    entity_writer(schema)(out, body)
    return out.getvalue()


def decode_response(frame: bytes | memoryview, api_key: int, api_version: int) -> tuple[int, Any]:
    """(correlation id, body) of a response frame (without its size); KafkaProtocolError if malformed."""
    schema = response_schema(api_key, api_version)
    try:
        header, at = entity_reader(schema.__header_schema__)(frame, 0)
        body, _ = entity_reader(schema)(frame, at)
    except (SerialError, ValueError, TypeError, IndexError, OverflowError, UnicodeDecodeError, KeyError) as e:
        raise KafkaProtocolError(f"API {api_key} v{api_version}: malformed response ({e})") from e
    return int(header.correlation_id), body
