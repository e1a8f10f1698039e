"""The queue manifest: the queue store's live run objects, published in its object store for readers
that have only the store (the Spark data source). Spec: docs/formats/queues.md, "Queue manifest".

::

    queue_manifest = header entry{object_count} crc32c:u32
    header         = magic:u32 version:u16 flags:u16 seq:u64 stream_count:u32 object_count:u32
    entry          = size_bytes:u64 key_bytes:u16 key:utf8{key_bytes}    -- objects in the order of their places

One object under a fixed key, replaced whole (``ObjectStore.put`` is atomic) each time the set of live run
objects changes: after an upload's commit, after a merge's commit, and at open once recovery is done. It
lists objects only, never per-queue data, so it stays a few KiB however many queues there are; a reader
finds the queues in the objects' footers and index sections.

The key lies outside ``queues/``: the store deletes everything under ``queues/`` that its metadata does not
know (orphans of interrupted uploads), and the manifest is not a run object.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from stratalog.errors import StratalogError
from stratalog.objects.store import ObjectNotFoundError, ObjectStore
from stratalog.queues.format import CorruptBulkError
from stratalog.wal.format import crc32c

QUEUE_MANIFEST_KEY = "queue-manifest"
MANIFEST_MAGIC = 0x4D514C53  # "SLQM"
MANIFEST_VERSION = 1
MANIFEST_HEADER = struct.Struct("<IHHQII")
MANIFEST_ENTRY = struct.Struct("<QH")
MANIFEST_CRC = struct.Struct("<I")
#: Keys are length-prefixed with a u16 (object keys are far shorter: "queues/<16 hex>-<16 hex>.slq").
KEY_BYTES_MAX = 0xFFFF


class QueueManifestError(StratalogError):
    """No queue manifest in the object store: not a queue store's objects, or one never opened."""


@dataclass(frozen=True, slots=True)
class QueueObjectRef:
    key: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class QueueManifest:
    """Live run objects, oldest place first, and the streams they name (ids ``0 .. stream_count - 1``)."""

    seq: int
    stream_count: int
    objects: tuple[QueueObjectRef, ...]


def encode_manifest(manifest: QueueManifest) -> bytes:
    parts = [MANIFEST_HEADER.pack(MANIFEST_MAGIC, MANIFEST_VERSION, 0, manifest.seq, manifest.stream_count,
                                  len(manifest.objects))]
    for obj in manifest.objects:
        raw = obj.key.encode()
        if len(raw) > KEY_BYTES_MAX:
            raise ValueError(f"object key of {len(raw)} bytes: at most {KEY_BYTES_MAX}")
        parts.append(MANIFEST_ENTRY.pack(obj.size_bytes, len(raw)))
        parts.append(raw)
    body = b"".join(parts)
    return body + MANIFEST_CRC.pack(crc32c(body))


def decode_manifest(buf: bytes) -> QueueManifest:
    """Decode a queue manifest; CorruptBulkError when it is short, fails its CRC or does not add up."""
    if len(buf) < MANIFEST_HEADER.size + MANIFEST_CRC.size:
        raise CorruptBulkError(f"queue manifest of {len(buf)} bytes is shorter than its header")
    body = memoryview(buf)[:-MANIFEST_CRC.size]
    if crc32c(body) != MANIFEST_CRC.unpack_from(buf, len(body))[0]:
        raise CorruptBulkError("queue manifest failed its CRC")
    magic, version, _, seq, stream_count, object_count = MANIFEST_HEADER.unpack_from(body)
    if magic != MANIFEST_MAGIC or version != MANIFEST_VERSION:
        raise CorruptBulkError(f"not a queue manifest this stratalog reads (magic {magic:#x}, version {version})")
    pos = MANIFEST_HEADER.size
    objects: list[QueueObjectRef] = []
    for _ in range(object_count):
        if pos + MANIFEST_ENTRY.size > len(body):
            raise CorruptBulkError("queue manifest: an entry runs past its end")
        size_bytes, key_bytes = MANIFEST_ENTRY.unpack_from(body, pos)
        pos += MANIFEST_ENTRY.size
        if pos + key_bytes > len(body):
            raise CorruptBulkError("queue manifest: a key runs past its end")
        try:
            key = bytes(body[pos:pos + key_bytes]).decode()
        except UnicodeDecodeError:   # escaped the decoder before (found by fuzzing)
            raise CorruptBulkError("queue manifest: an object key is not UTF-8") from None
        objects.append(QueueObjectRef(key, size_bytes))
        pos += key_bytes
    if pos != len(body):
        raise CorruptBulkError("queue manifest: bytes left after its last entry")
    return QueueManifest(seq, stream_count, tuple(objects))


def read_queue_manifest(store: ObjectStore) -> QueueManifest:
    """The published queue manifest; QueueManifestError when there is none."""
    try:
        raw = store.get(QUEUE_MANIFEST_KEY)
    except ObjectNotFoundError:
        raise QueueManifestError(f"no {QUEUE_MANIFEST_KEY!r} in this object store: is it a queue store's "
                                 "object storage (<data_dir>/objects), and was the store opened since it gained "
                                 "one?") from None
    return decode_manifest(raw)


def last_manifest_seq(store: ObjectStore) -> int:
    """The sequence number of the published manifest (0 when none is readable): the next one follows it."""
    try:
        return read_queue_manifest(store).seq
    except (QueueManifestError, CorruptBulkError):
        return 0


def publish_manifest(store: ObjectStore, seq: int, stream_count: int,
                     objects: Sequence[QueueObjectRef]) -> QueueManifest:
    manifest = QueueManifest(seq, stream_count, tuple(objects))
    store.put(QUEUE_MANIFEST_KEY, encode_manifest(manifest))
    return manifest
