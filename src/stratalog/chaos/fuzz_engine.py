"""Fuzz targets of the stream engine's formats: batches, objects, the manifest, bulk records.

``engine_batch``: ``batch.iter_batches`` (CRC-checked) and ``decode_records`` / ``record_timestamps`` /
``stored_records`` of each batch; CorruptBatchError is the contract. Round-trip mode: records built from
the input, ``encode_batch``, decoded back equal.

``engine_object``: an object read as the store reads one: ``decode_footer`` of its last 32 bytes,
``decode_index``, ``check_block`` of each entry, ``placed_batches`` and the records of each batch;
CorruptObjectError or CorruptBatchError.

``engine_manifest``: ``manifest.read_manifest`` over a snapshot and deltas (JSON documents from the
input); ManifestError, and the manifest it returns holds only well-typed streams and blocks.

``bulk_record``: ``queues.format.decode_bulk`` (the queue store's WAL record); CorruptBulkError, message
ends that rise to the data's end; round trip through ``encode_bulk``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from stratalog.chaos.fuzz_targets import FuzzTarget, Reader, check, put
from stratalog.engine import batch as eb
from stratalog.engine import objformat as of
from stratalog.engine.manifest import MANIFEST_PREFIX, ManifestError, read_manifest
from stratalog.objects.store import ObjectInfo, ObjectNotFoundError
from stratalog.queues import format as bf
from stratalog.records import NewRecord, Record
from stratalog.wal.format import crc32c

RESEAL = 0x01
ROUND_TRIP = 0x80


# ---------------------------------------------------------------------------------------------------
# Batches


def reseal_engine_batches(data: bytes) -> bytes:
    """Every batch's CRC made right, walking batch_bytes from the start (the last one cut to the end)."""
    out = bytearray(data)
    position = 0
    while len(out) - position >= eb.BATCH_HEADER_BYTES:
        size = int.from_bytes(out[position + 20:position + 24], "little")
        if not eb.BATCH_HEADER_BYTES <= size <= len(out) - position:
            size = len(out) - position
            out[position + 20:position + 24] = size.to_bytes(4, "little")
        crc = crc32c(bytes(out[position + eb.BATCH_HEADER_BYTES:position + size]))
        out[position + eb.BATCH_HEADER_BYTES - 4:position + eb.BATCH_HEADER_BYTES] = crc.to_bytes(4, "little")
        position += size
    return bytes(out)


def check_engine_batches(data: bytes) -> None:
    reader = Reader(data)
    control = reader.u8()
    if control & ROUND_TRIP:
        _round_trip_engine_batch(reader)
        return
    buf = reader.rest()
    if control & RESEAL:
        buf = reseal_engine_batches(buf)
    for position, info in eb.iter_batches(buf):
        _check_engine_batch(buf, position, info)


def _check_engine_batch(buf: bytes | memoryview, position: int, info: eb.BatchInfo) -> None:
    records = list(eb.decode_records(buf, position, info))
    check([r.offset for r in records] == list(range(info.base_offset, info.base_offset + len(records))),
          "offsets are not dense from the batch's base offset")
    check(len(records) == info.count or info.encoding == eb.ENCODING_KAFKA,
          f"{len(records)} records from a batch of {info.count}")
    stamps = list(eb.record_timestamps(buf, position, info))
    check(stamps == [(r.offset, r.timestamp_ms) for r in records], "record_timestamps disagrees with decode_records")
    stored = eb.stored_batch(buf, position, info)
    check(list(eb.stored_records(stored)) == records, "stored_records disagrees with decode_records")


def _records(reader: Reader) -> Iterator[NewRecord]:
    for _ in range(1 + reader.below(12)):
        headers = tuple((reader.take(reader.below(8)).decode("utf-8", "replace"),
                         None if reader.u8() & 1 else reader.take(reader.below(16)))
                        for _ in range(reader.below(3)))
        yield NewRecord(reader.take(reader.below(200)), None if reader.u8() & 1 else reader.take(reader.below(20)),
                           reader.uint(6) - (1 << 40), headers)


def _round_trip_engine_batch(reader: Reader) -> None:
    stream_id, base = reader.uint(4), reader.uint(5)
    records = list(_records(reader))
    raw, _ = eb.encode_batch(stream_id, base, records)
    ((position, info),) = list(eb.iter_batches(raw))
    back = list(eb.decode_records(raw, position, info))
    want = [Record(base + i, r.timestamp_ms or 0, r.key, r.value, tuple(r.headers)) for i, r in enumerate(records)]
    check(back == want, "records encoded then decoded are not the records")


def engine_batch_seeds() -> list[bytes]:
    golden, _ = eb.encode_batch(1, 0, [NewRecord(b"v", b"k", 5, (("h", b"x"), ("n", None)))])
    two, _ = eb.encode_batch(2, 7, [b"a", b"bb", NewRecord(b"c", None, 9)], now_ms=1000)
    from stratalog.kafka.records import encode_batch as encode_kafka
    kafka = eb.wrap_kafka_batch(3, 40, 2, 1005, encode_kafka([(b"k", b"hi", (), 1000), (None, b"yo", (), 1005)],
                                                              base_offset=0))
    return [bytes([0]) + golden + two, bytes([RESEAL]) + golden, bytes([RESEAL]) + kafka + two,
            bytes([ROUND_TRIP]) + bytes(range(100)), bytes([ROUND_TRIP]) + bytes(range(7, 250, 3))]


# ---------------------------------------------------------------------------------------------------
# Objects


def reseal_object(data: bytes) -> bytes:
    """Block CRCs in the index, the index CRC and the footer CRC made right, as far as the footer's
    positions allow."""
    out = bytearray(data)
    if len(out) < of.FOOTER_BYTES:
        return data
    footer_at = len(out) - of.FOOTER_BYTES
    index_position, _, _, count, *_ = of.FOOTER.unpack_from(out, footer_at)
    index_bytes = count * of.INDEX_ENTRY.size
    if index_position + index_bytes == footer_at:
        for i in range(count):
            at = index_position + i * of.INDEX_ENTRY.size
            entry = of.BlockEntry(*of.INDEX_ENTRY.unpack_from(out, at))
            block = bytes(out[entry.position:entry.position + entry.size_bytes])
            put(out, of.INDEX_ENTRY, at, entry.stream_id, entry.start_offset, entry.end_offset, entry.position,
                entry.size_bytes, entry.record_count, entry.max_timestamp_ms, crc32c(block))
        out[footer_at + 8:footer_at + 12] = index_bytes.to_bytes(4, "little")
        out[footer_at + 12:footer_at + 16] = crc32c(bytes(out[index_position:footer_at])).to_bytes(4, "little")
    out[-4:] = crc32c(bytes(out[footer_at:-4])).to_bytes(4, "little")
    return bytes(out)


def check_object(data: bytes) -> None:
    reader = Reader(data)
    control = reader.u8()
    obj = reader.rest()
    if control & RESEAL:
        obj = reseal_object(obj)
    footer = of.decode_footer(obj[-of.FOOTER_BYTES:], len(obj))
    entries = of.decode_index(obj[footer.index_position:footer.index_position + footer.index_bytes], footer)
    check(len(entries) == footer.entry_count, "the index holds another number of entries than its footer says")
    for entry in entries:
        block = of.check_block(obj[entry.position:entry.position + entry.size_bytes], entry)
        for position, info in of.placed_batches(block, entry):
            eb.check_batch(block, position)
            _check_engine_batch(block, position, eb.read_batch_info(block, position))
            check(info.stream_id == entry.stream_id, "a placed batch is not in its entry's stream")


def object_seeds() -> list[bytes]:
    builder = of.ObjectBuilder(block_bytes_target=64)
    for stream_id in (1, 2):
        batches = []
        for base in (0, 2):
            raw, max_ts = eb.encode_batch(stream_id, base, [b"x" * base, NewRecord(b"y", b"k", 3)], now_ms=1)
            batches.append(of.StreamBatch(base, 2, max_ts, raw))
        builder.add_stream(stream_id, batches)
    obj = builder.finish()
    provisional = of.ObjectBuilder(flags=of.FLAG_PROVISIONAL)
    provisional.add_stream(0, [of.StreamBatch(0, 1, 1, eb.encode_batch(0, 0, [b"v"], now_ms=1)[0])])
    return [bytes([0]) + obj, bytes([RESEAL]) + obj, bytes([RESEAL]) + provisional.finish()]


# ---------------------------------------------------------------------------------------------------
# Manifest


class _DictStore:
    """Just enough of an ObjectStore for read_manifest: keys to bytes."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self._objects = objects

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key not in self._objects:
            raise ObjectNotFoundError(key)
        return self._objects[key][start:end]

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for key in sorted(self._objects):
            if key.startswith(prefix):
                yield ObjectInfo(key, len(self._objects[key]))


#: Documents in a manifest input are separated by this (the first is the snapshot, the rest deltas).
DOCUMENT_SEPARATOR = b"\n\n"


BLOCK_FIELDS = tuple(of.BlockEntry.__dataclass_fields__)


def check_manifest(data: bytes) -> None:
    documents = data.split(DOCUMENT_SEPARATOR)
    objects = {f"{MANIFEST_PREFIX}{1:020d}.snapshot.json": documents[0]}
    for seq, doc in enumerate(documents[1:], 2):
        objects[f"{MANIFEST_PREFIX}{seq:020d}.delta.json"] = doc
    manifest = read_manifest(_DictStore(objects))   # type: ignore[arg-type]
    check(type(manifest.seq) is int, "the manifest's seq is not an int")
    for stream_id, info in manifest.streams.items():
        check(all(type(v) is int for v in (stream_id, info.stream_id, info.start_offset, info.end_offset))
              and (info.name is None or type(info.name) is str), f"stream {stream_id!r} is not well typed")
    for refs in manifest.blocks.values():
        for ref in refs:
            check(type(ref.key) is str and all(type(getattr(ref.entry, f)) is int for f in BLOCK_FIELDS),
                  f"block {ref!r} is not well typed")


def manifest_seeds() -> list[bytes]:
    row = [1, 0, 10, 0, 100, 10, 1000, 12345]
    snapshot = {"format": 1, "kind": "snapshot", "seq": 1, "prev": None,
                "streams": [{"id": 1, "name": "a", "start": 0, "end": 10}],
                "objects": [{"key": "data/1", "blocks": [row]}], "removed": []}
    delta = {"format": 1, "kind": "delta", "seq": 2, "prev": 1,
             "streams": [{"id": 1, "name": "a", "start": 5, "end": 20}, {"id": 2, "name": None, "start": 0, "end": 1}],
             "objects": [{"key": "data/2", "blocks": [[1, 10, 20, 0, 50, 10, 2000, 1], [2, 0, 1, 50, 9, 1, 5, 2]]}],
             "removed": ["data/1"]}
    s, d = json.dumps(snapshot).encode(), json.dumps(delta).encode()
    return [s, s + DOCUMENT_SEPARATOR + d, s + DOCUMENT_SEPARATOR + d + DOCUMENT_SEPARATOR + d]


# ---------------------------------------------------------------------------------------------------
# Bulk records


def check_bulk(data: bytes) -> None:
    reader = Reader(data)
    if reader.u8() & ROUND_TRIP:
        _round_trip_bulk(reader)
        return
    bulk = bf.decode_bulk(reader.rest())
    ends = bulk.ends.astype(np.int64)
    check(len(ends) == 0 or (int(ends[0]) >= 0 and bool(np.all(np.diff(ends) >= 0))
                             and int(ends[-1]) == len(bulk.data)),
          "message ends do not rise to the end of the data")
    check(int(bulk.counts.sum()) == len(ends), "run counts do not add up to the messages")


def _round_trip_bulk(reader: Reader) -> None:
    runs = reader.below(8)
    ids = np.sort(np.unique(np.array([reader.below(1000) for _ in range(runs)], np.int64)))
    counts = np.array([1 + reader.below(5) for _ in ids], np.int64)
    bases = np.array([reader.uint(3) for _ in ids], np.int64)
    lengths = [reader.below(40) for _ in range(int(counts.sum()))]
    data = reader.take(sum(lengths)).ljust(sum(lengths), b"\0")
    ends = np.cumsum(np.array(lengths, np.int64)).astype(np.uint32)
    names = [(int(i), reader.take(reader.below(12)).decode("utf-8", "replace")) for i in ids[:reader.below(3)]]
    stream_count = 1000
    body = b"".join(bf.encode_bulk(ids, bases, counts, names, stream_count, ends, data))
    bulk = bf.decode_bulk(body)
    check(bulk.stream_ids.tolist() == ids.tolist() and bulk.base_offsets.tolist() == bases.tolist()
          and bulk.counts.tolist() == counts.tolist() and bulk.names == names and bulk.stream_count == stream_count
          and bulk.ends.tolist() == ends.tolist() and bytes(bulk.data) == data,
          "a bulk record encoded then decoded is not the record")


def bulk_seeds() -> list[bytes]:
    ids = np.array([0, 3], np.int64)
    body = b"".join(bf.encode_bulk(ids, np.array([0, 5], np.int64), np.array([2, 1], np.int64), [(3, "q3")], 4,
                                   np.array([2, 5, 6], np.uint32), b"abcdef"))
    return [bytes([0]) + body, bytes([ROUND_TRIP]) + bytes(range(200))]


TARGETS = (
    FuzzTarget("engine_batch", "batch.iter_batches/decode_records/record_timestamps/stored_records; round trip",
               check_engine_batches, (eb.CorruptBatchError,), engine_batch_seeds),
    FuzzTarget("engine_object", "objformat footer, index, blocks and their batches, read as the store reads",
               check_object, (of.CorruptObjectError, eb.CorruptBatchError), object_seeds),
    FuzzTarget("engine_manifest", "manifest.read_manifest over a fuzzed snapshot and deltas", check_manifest,
               (ManifestError,), manifest_seeds),
    FuzzTarget("bulk_record", "queues.format.decode_bulk (the queue store's WAL record); round trip", check_bulk,
               (bf.CorruptBulkError,), bulk_seeds),
)
