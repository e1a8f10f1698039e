"""Fuzz targets of the Kafka protocol code: request frames, the connection's frame reader, record batches.

``kafka_request``: ``codec.decode_request`` on a whole frame, with the versions the broker serves. It
returns a request or raises KafkaProtocolError / UnsupportedVersionError; a request it returns must
encode again (kio's writer) and decode to the same request. Produce, read without kio
(``produce_request``), must read as kio reads it wherever kio accepts the frame.

``native_produce_request``: the compiled Produce reader against its Python twin: the same values, or the
same error and message.

``kafka_frames``: ``connection.FrameReader`` fed a byte stream in chunks the input chooses. The frames
it returns, each behind its size, must be exactly the bytes it took; it never buffers more than one
frame and one read; it raises only KafkaProtocolError (FrameTooLargeError among them).

``kafka_batch``: ``records.split_batches``, ``decode_records`` and ``record_timestamps`` on a Produce
request's records field. Offsets come back dense from each batch's base offset, decompressed data stays
within its bound, and the records re-encode (``encode_batch``) to a batch that decodes to the same
records. The round-trip mode builds records from the input, encodes them with each codec and decodes.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kio.index import load_request_schema
from kio.serial import entity_reader

from stratalog.chaos.fuzz_targets import (
    ALLOCATION_BYTES_BASE,
    ALLOCATION_BYTES_PER_INPUT_BYTE,
    FuzzTarget,
    Reader,
    check,
    put,
)
from stratalog.engine.batch import BATCH_HEADER_BYTES, CorruptBatchError
from stratalog.engine.batch import encode_batch as encode_native_batch
from stratalog.engine.record_index import index_native_records
from stratalog.kafka import records as kr
from stratalog.kafka import staged_commit
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.array_bounds import ArrayCountError, plan_of, walk_array_counts
from stratalog.kafka.codec import (
    FRAME_SIZE,
    HEADER_PREFIX,
    KafkaProtocolError,
    Request,
    UnsupportedVersionError,
    decode_request,
    encode_request,
    peek_header,
)
from stratalog.kafka.compaction import gap_batch, kafka_batch_records, rebuilt_batch
from stratalog.kafka.connection import FrameReader
from stratalog.kafka.produce_request import MalformedProduceError, decode_produce_fields
from stratalog.kafka.record_check import check_records, walk_records
from stratalog.kafka.record_index import index_kafka_records
from stratalog.native import native
from stratalog.records import NewRecord
from stratalog.wal.format import crc32c

# ---------------------------------------------------------------------------------------------------
# Requests


def served_versions() -> dict[int, tuple[int, int]]:
    """``{api_key: (min_version, max_version)}`` of every API the broker registers (broker.apis), read
    from the modules' APIS lists without opening a broker."""
    from stratalog.broker import api_admin, api_cluster, api_epochs, api_fetch, api_groups, api_log

    return {api.key: (api.min_version, api.max_version)
            for module in (api_cluster, api_log, api_fetch, api_epochs, api_admin, api_groups) for api in module.APIS}


_SERVED: dict[int, tuple[int, int]] = {}


def _served() -> Mapping[int, tuple[int, int]]:
    if not _SERVED:
        _SERVED.update(served_versions())
    return _SERVED


def check_request(frame: bytes) -> None:
    try:
        request = decode_request(frame, _served())
    except UnsupportedVersionError as e:
        _request_feature()(e.api_key, e.api_version, 2)
        raise
    except KafkaProtocolError:
        if len(frame) >= HEADER_PREFIX.size:
            api_key, api_version, _ = HEADER_PREFIX.unpack_from(frame)
            _request_feature()(api_key, api_version, 1)
        raise
    _request_feature()(request.api_key, request.api_version, 0)
    check(request.frame_bytes == len(frame), "frame_bytes is not the frame's length")
    if request.api_key == ApiKey.PRODUCE:
        _check_produce_as_kio(frame, request)
        return
    again = decode_request(encode_request(request.api_key, request.api_version, request.correlation_id,
                                          request.client_id, request.body), _served())
    check(again.body == request.body, f"API {request.api_key} v{request.api_version}: the request re-encoded "
                                      f"decodes to another body")
    check(again.client_id == request.client_id and again.correlation_id == request.correlation_id,
          "the header re-encoded decodes to another header")


def _check_produce_as_kio(frame: bytes, request: Request) -> None:
    """A Produce request read as kio reads it, where kio reads it (kio refuses more: unknown tagged fields,
    which Kafka skips)."""
    schema: Any = load_request_schema(ApiKey.PRODUCE, request.api_version)
    try:
        header, at = entity_reader(schema.__header_schema__)(frame, 0)
        body, _ = entity_reader(schema)(frame, at)
    except Exception:   # whatever kio refuses, and how, is kio's affair
        return
    topics = tuple((t.name, tuple((p.index, p.records) for p in t.partition_data)) for t in body.topic_data)
    as_kio = (header.client_id, body.transactional_id, body.acks, body.timeout // datetime.timedelta(milliseconds=1),
              topics)
    ours = (request.client_id, *request.body)
    check(ours == as_kio, f"Produce v{request.api_version} read as {ours!r}, by kio as {as_kio!r}")


def check_native_produce(frame: bytes) -> None:
    """The compiled Produce reader against its Python twin on any frame, read as both versions' layouts:
    the same values, or the same error and message. Without the compiled core only the twin runs."""
    for flexible in (False, True):
        def outcome(read: Callable[[bytes, bool], object], flexible: bool = flexible) -> tuple[str, object]:
            try:
                return "returned", read(frame, flexible)
            except (MalformedProduceError, UnicodeDecodeError) as e:
                return type(e).__name__, str(e)

        python = outcome(decode_produce_fields)
        if native is not None:
            compiled = outcome(native.decode_produce)
            check(compiled == python, f"the compiled Produce reader gave {compiled}, its Python twin {python}")


def produce_seeds() -> list[bytes]:
    """Produce requests of every version served, with batches in them, and the sample of each version."""
    batch = kr.encode_batch([(b"k", b"value", (), 1_700_000_000_000)], base_offset=0)
    low, high = _served()[ApiKey.PRODUCE]
    seeds = [seed for seed in request_seeds() if peek_header(seed)[0] == ApiKey.PRODUCE]
    for version in range(low, high + 1):
        schema: Any = load_request_schema(ApiKey.PRODUCE, version)
        module = __import__(schema.__module__, fromlist=["PartitionProduceData", "TopicProduceData"])
        body = schema(transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=(
            module.TopicProduceData(name="events", partition_data=(
                module.PartitionProduceData(index=0, records=batch),
                module.PartitionProduceData(index=1, records=None))),
            module.TopicProduceData(name="other", partition_data=())))
        seeds.append(encode_request(ApiKey.PRODUCE, version, 9, "fuzz", body))
    return seeds


_FEATURE: list[Callable[[int, int, int], int]] = []


def _request_feature() -> Callable[[int, int, int], int]:
    """A function whose branches are each (API, version, outcome): kio parses natively, where the
    fuzzer sees no coverage, so without these every request would look alike to it and the corpus
    would shrink to a handful of inputs. The child instruments it (``coverage_functions``)."""
    if not _FEATURE:
        lines = ["def request_feature(api_key, api_version, outcome):"]
        for api_key, (low, high) in sorted(_served().items()):
            lines.append(f"    if api_key == {api_key}:")
            for version in range(low, high + 1):
                lines.append(f"        if api_version == {version}:")
                lines.append("            return 3 * api_version + outcome if outcome < 2 else -1")
        lines.append("    return -2")
        namespace: dict[str, Any] = {}
        exec(compile("\n".join(lines), "<request_feature>", "exec"), namespace)
        _FEATURE.append(namespace["request_feature"])
    return _FEATURE[0]


def _sample_value(field: dataclasses.Field[Any], depth: int) -> Any:
    """A small valid value of one kio field: one element for arrays, short strings, a real batch for
    records (so the seeds reach every field's parser)."""
    kafka_type = field.metadata.get("kafka_type")
    annotation: Any = field.type
    is_array = typing.get_origin(annotation) is tuple
    inner = typing.get_args(annotation)[0] if is_array else annotation
    if typing.get_origin(inner) in (typing.Union, types.UnionType):
        inner = next(a for a in typing.get_args(inner) if a is not type(None))
        if typing.get_origin(inner) is tuple:   # an optional array: ``tuple[X, ...] | None``
            is_array, inner = True, typing.get_args(inner)[0]
    if kafka_type is None:
        value: Any = sample_entity(inner, depth + 1)
    else:
        value = _sample_primitive(kafka_type, inner)
    return (value,) if is_array else value


def _sample_primitive(kafka_type: str, annotation: Any) -> Any:  # noqa: PLR0911 -- one return per type: a table
    if kafka_type == "bool":
        return True
    if kafka_type in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
        return annotation(1)
    if kafka_type == "float64":
        return 1.5
    if kafka_type == "string":
        return annotation("t") if isinstance(annotation, type) else "t"
    if kafka_type == "bytes":
        return b"\x01\x02"
    if kafka_type == "records":
        return annotation(kr.encode_batch([(b"k", b"v", (("h", b"x"),), 1000)], base_offset=0))
    if kafka_type == "uuid":
        return uuid.UUID(int=1)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return annotation.parse(datetime.timedelta(milliseconds=100))
    if kafka_type == "datetime_i64":
        return datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    raise ValueError(f"no sample for kafka_type {kafka_type!r}")


def sample_entity(schema: type[Any], depth: int = 0) -> Any:
    """A kio entity with every field set to a small valid value."""
    values = {f.name: _sample_value(f, depth) for f in dataclasses.fields(schema) if f.init}
    return schema(**values)


def request_seeds() -> list[bytes]:
    """One request of every API version the broker serves, written by kio with sample values, and
    the same body with a null client id."""
    seeds = []
    for api_key, (low, high) in sorted(_served().items()):
        for version in range(low, high + 1):
            body = sample_entity(load_request_schema(api_key, version))
            seeds.append(encode_request(api_key, version, 7, "fuzz", body))
            seeds.append(encode_request(api_key, version, 8, None, body))
    return seeds


_OWN_APIS = {staged_commit.API_KEY: (0, staged_commit.COMMIT_VERSION_MAX), staged_commit.REPLACE_API_KEY: (0, 0)}


def check_staged_commit(frame: bytes) -> None:
    """The broker's own requests through the codec: a decoded request re-encodes to a frame that decodes alike."""
    request = decode_request(frame, _OWN_APIS)
    body = request.body
    if isinstance(body, staged_commit.ReplaceObjectsRequest):
        encoded = staged_commit.encode_replace_request(request.correlation_id, request.client_id, body)
    else:
        encoded = staged_commit.encode_request(request.correlation_id, request.client_id, body, request.api_version)
    again = decode_request(encoded[4:], _OWN_APIS)
    check(again.body == body and again.client_id == request.client_id and again.api_version == request.api_version,
          f"a request of API {request.api_key} re-encoded decodes to another request")


def staged_commit_seeds() -> list[bytes]:
    entry = staged_commit.StagedStreamEntry
    objects = (staged_commit.StagedObjectEntry(0, "spark-staging/w/000000-0.slo", 4096,
                                               (entry("clicks/0", 0, 10), entry("clicks/1", 0, 3))),
               staged_commit.StagedObjectEntry(3, "spark-staging/w/000003-0.slo", 99, (entry("t/7", 5, 1),)))
    return [staged_commit.encode_request(1, "spark", staged_commit.CommitStagedRequest(None, -1, objects))[4:],
            staged_commit.encode_request(2, None, staged_commit.CommitStagedRequest("sink", 41, objects[:1]))[4:],
            staged_commit.encode_request(3, "", staged_commit.CommitStagedRequest("", 0, ()), version=0)[4:],
            staged_commit.encode_replace_request(4, "spark", staged_commit.ReplaceObjectsRequest(
                ("data/00000000000000000001.slo", "data/00000000000000000002.slo"),
                (("spark-staging/compact-1/000000.slo", 4096),)))[4:]]


# ---------------------------------------------------------------------------------------------------
# Frames

#: The frame reader's bound in this target: small, so that inputs reach the too-large refusal too.
FRAME_BYTES_MAX_BASE = 64
#: A chunk (one socket read) is at most this many bytes.
CHUNK_BYTES_MAX = 256
#: Inputs fed a byte at a time cost a Python loop per byte: 2 KiB holds many frames and keeps the rate up.
FRAMES_INPUT_BYTES_MAX = 2 << 10


def check_frames(data: bytes) -> None:
    """Input: frame_bytes_max selector (1 byte), chunking (1 byte), then the connection's bytes."""
    reader_input = Reader(data)
    frame_bytes_max = FRAME_BYTES_MAX_BASE + 16 * reader_input.u8()
    chunking = reader_input.u8()
    stream = reader_input.rest()
    reader = FrameReader(frame_bytes_max)
    taken = 0          # bytes of the stream the frames returned so far cover
    fed = 0
    chunk = 1 + chunking % CHUNK_BYTES_MAX
    try:
        while fed < len(stream):
            size = chunk if chunking & 0x80 == 0 else 1 + (stream[fed] % chunk)
            reader.receive_data(stream[fed:fed + size])
            fed += min(size, len(stream) - fed)
            taken = _drain(reader, stream, taken, frame_bytes_max)
            check(reader.buffered_bytes <= FRAME_SIZE.size + frame_bytes_max + size,
                  f"{reader.buffered_bytes} bytes buffered: more than one frame and one read")
            check(reader.buffered_bytes == fed - taken, "buffered bytes disagree with what was fed and taken")
        reader.receive_data(b"")
        taken = _drain(reader, stream, taken, frame_bytes_max)
        check(reader.at_eof and taken == len(stream), "at the end of the stream, bytes are left unread")
    except KafkaProtocolError:
        pass


def _drain(reader: FrameReader, stream: bytes, taken: int, frame_bytes_max: int) -> int:
    while (frame := reader.next_frame()) is not None:
        (size,) = FRAME_SIZE.unpack_from(stream, taken)
        check(size == len(frame) <= frame_bytes_max, f"a frame of {len(frame)} bytes behind a size of {size}")
        check(frame == stream[taken + FRAME_SIZE.size:taken + FRAME_SIZE.size + size],
              "a frame is not the bytes behind its size")
        taken += FRAME_SIZE.size + size
    if not reader.at_eof:
        check(reader.wanted_bytes() >= 1, "wanted_bytes() asks for nothing while a frame is incomplete")
    return taken


def frame_seeds() -> list[bytes]:
    frames = [r for r in request_seeds()[:40:3]]
    stream = b"".join(FRAME_SIZE.pack(len(f)) + f for f in frames[:4])
    return [bytes([16, chunking]) + stream for chunking in (0, 3, 0x85, 255)] + [
        bytes([0, 0]) + FRAME_SIZE.pack(1 << 30),       # a peer claiming a gigabyte
        bytes([0, 0]) + FRAME_SIZE.pack(3) + b"abc",    # shorter than a request header
    ]


# ---------------------------------------------------------------------------------------------------
# Record batches

#: Bounds the target passes to the parsers: a batch of 64 KiB may inflate to at most 256 KiB.
BATCH_BYTES_MAX = 64 << 10
#: A generated record's value is null when both of these bits of its choice byte are set: one time in four.
NULL_VALUE_BITS = 0x11
DECOMPRESSED_BYTES_MAX = 256 << 10
#: Control byte: bit 0 reseals each batch (batchLength of the last batch, CRC of all); bit 7 builds
#: records from the input and round-trips them instead.
RESEAL = 0x01
ROUND_TRIP = 0x80


def reseal_batches(data: bytes) -> bytes:
    """``data`` with every batch's CRC made right, walking batchLength from the start; the last batch's
    batchLength is set to reach the end of the data."""
    out = bytearray(data)
    position = 0
    while len(out) - position >= kr.HEADER_BYTES:
        (length,) = struct.unpack_from(">i", out, position + kr.BATCH_LENGTH_POSITION)
        end = position + kr.LOG_OVERHEAD_BYTES + length
        if not position + kr.HEADER_BYTES <= end <= len(out):
            end = len(out)
            struct.pack_into(">i", out, position + kr.BATCH_LENGTH_POSITION, end - position - kr.LOG_OVERHEAD_BYTES)
        put(out, kr.CRC, position + kr.CRC_POSITION, crc32c(bytes(out[position + kr.CRC_COVERS_FROM_POSITION:end])))
        position = end
    return bytes(out)


def check_batches(data: bytes) -> None:
    reader = Reader(data)
    control = reader.u8()
    if control & ROUND_TRIP:
        _round_trip_batch(reader)
        return
    records = reader.rest()
    if control & RESEAL:
        records = reseal_batches(records)
    for position, header in kr.split_batches(records, batch_bytes_max=BATCH_BYTES_MAX):
        batch = records[position:position + header.batch_bytes]
        _check_one_batch(batch, header)


def check_produced(data: bytes) -> None:
    """The produce-time record check agrees with the decoder: a batch it accepts decodes whole."""
    reader = Reader(data)
    control = reader.u8()
    records = reader.rest()
    if control & RESEAL:
        records = reseal_batches(records)
    for position, header in kr.split_batches(records, batch_bytes_max=BATCH_BYTES_MAX):
        batch = records[position:position + header.batch_bytes]
        check_records(memoryview(batch), header, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX)
        decoded = list(kr.decode_records(batch, start_offset=kr.INT64_MIN,
                                         decompressed_bytes_max=DECOMPRESSED_BYTES_MAX))
        check(len(decoded) == header.record_count, "the record check accepted a batch the decoder cut short")


def check_native_walk(data: bytes) -> None:
    """The compiled record walk against its Python twin: the same end, or the same error and message.
    The first byte is the record count; the rest, records as a batch holds them (a real batch's records
    for the seeds, so mutations land in fields). Without the compiled core only the twin runs."""
    reader = Reader(data)
    count = reader.u8()
    records = reader.rest()

    def outcome(walk: Callable[[bytes, int, int], int]) -> tuple[str, object]:
        try:
            return "returned", walk(records, 0, count)
        except kr.KafkaBatchError as e:
            return type(e).__name__, str(e)

    python = outcome(walk_records)
    if native is not None:
        compiled = outcome(native.walk_records)
        check(compiled == python, f"the compiled walk gave {compiled}, its Python twin {python}")


def check_native_array_counts(data: bytes) -> None:
    """The compiled array-count walk against its Python twin on a request frame, from where kio's header
    ends: the same refusal with the same message, or none from either. Without the compiled core only the
    twin runs."""
    try:
        api_key, api_version, _ = peek_header(data)
        schema = load_request_schema(api_key, api_version)
        _, body_position = entity_reader(schema.__header_schema__)(data, 0)
    except Exception:   # not a request of a known version, or a header kio refuses: nothing to walk
        return
    plan = plan_of(schema)

    def outcome(walk: Callable[[bytes, int, Any], None]) -> tuple[str, object]:
        try:
            walk(data, body_position, plan)
        except ArrayCountError as e:
            return type(e).__name__, str(e)
        return "returned", None

    python = outcome(walk_array_counts)
    if native is not None:
        compiled = outcome(native.check_array_counts)
        check(compiled == python, f"the compiled array-count walk gave {compiled}, its Python twin {python}")


def walk_seeds() -> list[bytes]:
    seeds = []
    for fields in ([(b"k", b"hi", (), 1000), (None, b"yo", (("h", b"v"),), 1005)],
                   [(b"key-%d" % i, b"value " * i, (("n\u00e9", b"%d" % i),), 1_700_000_000_000 + i)
                    for i in range(12)]):
        batch = kr.encode_batch(fields, base_offset=0)
        seeds.append(bytes([len(fields)]) + batch[kr.RECORDS_POSITION:])
    return seeds


def check_native_index(data: bytes) -> None:
    """The compiled record indexes (the Spark source's columns) against their Python twins: the same index,
    or the same error and message. The first byte is the record count; the second picks the encoding
    (bit 0: Kafka's, else the store's) and, for Kafka's, a LogAppendTime (bit 1) and how many offsets the
    batch spans beyond its records (bits 2-7: log compaction's gaps); the rest, the records (a real batch's
    for the seeds, compacted ones among them)."""
    reader = Reader(data)
    count = reader.u8()
    choice = reader.u8()
    records = reader.rest()
    if choice & 1:
        append_ms = 1_700_000_000_000 if choice & 2 else None
        last_offset_delta = count - 1 + (choice >> 2)

        def kafka(index: Callable[..., bytes]) -> bytes:
            return index(records, 0, count, last_offset_delta, 1_000, append_ms)
        run: Callable[[Callable[..., bytes]], bytes] = kafka
        twin: Callable[..., bytes] = index_kafka_records
        compiled = getattr(native, "index_kafka_records", None)
    else:
        def stored(index: Callable[..., bytes]) -> bytes:
            return index(records, 0, len(records), count)
        run, twin, compiled = stored, index_native_records, getattr(native, "index_native_records", None)

    def outcome(index: Callable[..., bytes]) -> tuple[str, object]:
        try:
            return "returned", run(index)
        except (kr.KafkaBatchError, CorruptBatchError) as e:
            return type(e).__name__, str(e)

    python = outcome(twin)
    if compiled is not None:
        got = outcome(compiled)
        check(got == python, f"the compiled index gave {got}, its Python twin {python}")


def index_seeds() -> list[bytes]:
    seeds = [bytes([walk[0], 1 | 2 * n]) + walk[1:] for n, walk in enumerate(walk_seeds())]
    # Batches as log compaction leaves them: every third record kept (offsets with gaps), and none.
    many_fields = [(b"key-%d" % i, b"value " * i, (("n\u00e9", b"%d" % i),), 1_700_000_000_000 + i)
                   for i in range(12)]
    source = kafka_batch_records(kr.encode_batch(many_fields, base_offset=0))
    kept = source.records[1::3]
    gapped = rebuilt_batch(source, kept)
    seeds.append(bytes([len(kept), 1 | (len(many_fields) - len(kept)) << 2]) + gapped[kr.RECORDS_POSITION:])
    seeds.append(bytes([0, 1 | 5 << 2]) + gap_batch(0, 5)[kr.RECORDS_POSITION:])
    many = [NewRecord(b"value " * i, b"key-%d" % i if i % 3 else None, 1_700_000_000_000 + i,
                      (("n\u00e9", b"%d" % i),) if i % 2 else ()) for i in range(12)]
    for records in ([NewRecord(b"hi", b"k", 1000)], many):
        seeds.append(bytes([len(records), 0]) + encode_native_batch(3, 0, records)[0][BATCH_HEADER_BYTES:])
    return seeds


def _check_one_batch(batch: bytes, header: kr.BatchHeader) -> None:
    # From the first offset there can be: a client may send any baseOffset, negative ones too.
    decoded = list(kr.decode_records(batch, start_offset=kr.INT64_MIN, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX))
    check(len(decoded) == header.record_count, f"{len(decoded)} records from a batch of {header.record_count}")
    check([r.offset for r in decoded] == list(range(header.base_offset, header.base_offset + len(decoded))),
          "offsets are not dense from the base offset")
    if header.compression != kr.Compression.NONE:
        payload = sum(len(r.key or b"") + len(r.value) for r in decoded)
        check(payload <= DECOMPRESSED_BYTES_MAX, f"{payload} bytes of keys and values out of a batch bounded "
                                                 f"to {DECOMPRESSED_BYTES_MAX} decompressed")
    stamps = list(kr.record_timestamps(batch, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX))
    check(stamps == [(r.offset, r.timestamp_ms) for r in decoded], "record_timestamps disagrees with decode_records")
    if header.base_offset < 0 or not all(kr.INT64_MIN <= r.timestamp_ms <= kr.INT64_MAX for r in decoded):
        return   # not what encode_batch writes: a negative base offset, or base + delta beyond an int64
    again = kr.encode_batch(decoded, base_offset=header.base_offset)
    back = list(kr.decode_records(again, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX))
    check(back == decoded, "decoded records re-encoded decode to other records")


def _round_trip_batch(reader: Reader) -> None:
    count = 1 + reader.below(16)
    fields: list[kr.RecordFields] = []
    base_ts = reader.uint(6)
    for _ in range(count):
        key = None if reader.u8() & 1 else reader.take(reader.below(40))
        value = None if reader.u8() & NULL_VALUE_BITS == NULL_VALUE_BITS else reader.take(reader.below(300))
        headers = tuple((reader.take(reader.below(8)).decode("utf-8", "replace"),
                         None if reader.u8() & 1 else reader.take(reader.below(16)))
                        for _ in range(reader.below(4)))
        fields.append((key, value, headers, base_ts + reader.uint(3) - (1 << 23)))
    base_offset = reader.uint(6)
    compression = kr.Compression(reader.below(len(kr.Compression)))
    batch = kr.encode_batch(fields, base_offset=base_offset, compression=compression,
                            producer_id=reader.uint(4), is_transactional=bool(reader.u8() & 1))
    ((position, header),) = kr.split_batches(batch, batch_bytes_max=1 << 20)
    check(position == 0 and header.batch_bytes == len(batch) and header.compression == compression,
          "an encoded batch's header reads back otherwise")
    decoded = list(kr.decode_records(batch, decompressed_bytes_max=1 << 20))
    want = [(base_offset + i, ts, key, value or b"", tuple(headers))
            for i, (key, value, headers, ts) in enumerate(fields)]
    check([tuple(r) for r in decoded] == want, "records encoded then decoded are not the records")


def batch_seeds() -> list[bytes]:
    golden = kr.encode_batch([(b"k", b"hi", (), 1000), (None, b"yo", (("h", b"v"),), 1005)], base_offset=0)
    many = [(b"key-%d" % i, b"value " * i, (("n", b"%d" % i),), 1_700_000_000_000 + i) for i in range(12)]
    seeds = [bytes([0]) + golden, bytes([RESEAL]) + golden, bytes([RESEAL]) + golden + golden]
    for compression in kr.Compression:
        seeds.append(bytes([RESEAL]) + kr.encode_batch(many, base_offset=5, compression=compression))
    seeds += [bytes([ROUND_TRIP]) + bytes(range(i, i + 64)) for i in (0, 7, 100)]
    return seeds


def _batch_allocation_bytes_max(input_bytes: int) -> int:
    # Decompression builds the inflated data once and its growing buffer once (see codecs._decompress_growing),
    # and the round trip re-encodes what it decoded.
    return ALLOCATION_BYTES_BASE + 4 * DECOMPRESSED_BYTES_MAX + ALLOCATION_BYTES_PER_INPUT_BYTE * input_bytes


TARGETS = (
    FuzzTarget("kafka_request", "codec.decode_request, every API version the broker serves; re-encode round trip",
               check_request, (KafkaProtocolError, UnsupportedVersionError), request_seeds,
               coverage_functions=lambda: (_request_feature(),)),
    FuzzTarget("kafka_staged_commit", "codec.decode_request of StratalogCommitStaged and StratalogReplaceObjects "
               "(the broker's own APIs); re-encode round trip", check_staged_commit,
               (KafkaProtocolError, UnsupportedVersionError), staged_commit_seeds),
    FuzzTarget("kafka_frames", "connection.FrameReader fed in chunks: frames exact, buffering bounded",
               check_frames, (KafkaProtocolError,), frame_seeds, input_bytes_max=FRAMES_INPUT_BYTES_MAX),
    FuzzTarget("kafka_batch", "records.split_batches/decode_records/record_timestamps, decompression bounds, "
               "round trips", check_batches, (kr.KafkaBatchError,), batch_seeds,
               input_bytes_max=BATCH_BYTES_MAX, allocation_bytes_max=_batch_allocation_bytes_max),
    FuzzTarget("kafka_record_check", "record_check.check_records (produce): accepts only what decode_records reads",
               check_produced, (kr.KafkaBatchError,), batch_seeds,
               input_bytes_max=BATCH_BYTES_MAX, allocation_bytes_max=_batch_allocation_bytes_max),
    FuzzTarget("native_record_walk", "the compiled record walk (produce's check) against its Python twin: "
               "same end, same error", check_native_walk, (kr.KafkaBatchError,), walk_seeds),
    FuzzTarget("native_array_counts", "the compiled array-count walk of a request (before kio reads it) against "
               "its Python twin: same refusal, same message", check_native_array_counts, (), request_seeds),
    FuzzTarget("native_produce_request", "the compiled Produce reader against its Python twin: same values, same "
               "error", check_native_produce, (), produce_seeds),
    FuzzTarget("native_record_index", "the compiled record indexes (the Spark source's columns, both encodings) "
               "against their Python twins: same index, same error", check_native_index,
               (kr.KafkaBatchError, CorruptBatchError), index_seeds),
)
