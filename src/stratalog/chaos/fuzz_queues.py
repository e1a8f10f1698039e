"""Fuzz targets of the queue store's formats: run objects and their index, the queue manifest, names.

``queue_object``: a run object read as recovery and a reader read it: ``decode_footer``,
``decode_index``, ``RunIndex.with_object`` and ``lookup``, then each stream's run through
``check_pages``, ``frame_run`` and ``run_messages``; CorruptBulkError is the contract, and the messages
of a run are exactly its bytes. Round-trip mode: ``build_object`` of messages from the input, read back.

``queue_manifest``: ``manifest.decode_manifest``; CorruptBulkError; round trip with ``encode_manifest``.

``queue_names``: ``names.NameIndex`` against a dict: names from the input added with ids, then looked
up with others; a lookup answers the id added or -1, never another id.

``native_run_read``: a random get's read of a run from the page cache, compiled
(``_native.read_messages_cached``) against its twin (``queues.objects.read_messages_cached``), and a
sequential get's (``read_run_cached``, both ways): runs of the input's bytes in a file, page CRCs right or
cut short, any bounds; the same messages (the same run) or the same error.
"""

from __future__ import annotations

import array
import os
import tempfile
from typing import Any

import numpy as np

from stratalog.chaos.fuzz_targets import FuzzTarget, Reader, check
from stratalog.native import native_crc
from stratalog.queues import format as bf
from stratalog.queues.index import RunIndex
from stratalog.queues.manifest import (
    MANIFEST_CRC,
    QueueManifest,
    QueueObjectRef,
    decode_manifest,
    encode_manifest,
)
from stratalog.queues.names import NameIndex
from stratalog.queues.objects import read_messages_cached, read_random_cached, read_run_cached
from stratalog.wal.format import crc32c

RESEAL = 0x01
ROUND_TRIP = 0x80
KEY = "queues/fuzz.slq"


def reseal_run_object(data: bytes) -> bytes:
    """Page CRCs, the index CRC and the footer CRC made right, as far as the footer's sizes allow."""
    out = bytearray(data)
    if len(out) < bf.OBJECT_FOOTER_BYTES:
        return data
    at = len(out) - bf.OBJECT_FOOTER_BYTES
    fields = list(bf.OBJECT_FOOTER.unpack_from(out, at))
    footer = bf.ObjectFooter(*fields[:6])
    if footer.index_position + footer.index_bytes == at and footer.first_stream <= footer.stream_count:
        crcs = bf.page_crcs(bytes(out[:footer.names_position]))
        pages_at = footer.index_position + 8 * footer.stream_count + 4
        out[pages_at:pages_at + 4 * len(crcs)] = crcs.tobytes()
        fields[5] = crc32c(bytes(out[footer.names_position:at]))
    fields[-1] = 0
    head = bf.OBJECT_FOOTER.pack(*fields)[:bf.FOOTER_CRC_COVERS_BYTES]
    out[at:] = head + crc32c(head).to_bytes(4, "little")
    return bytes(out)


def check_run_object(data: bytes) -> None:
    reader = Reader(data)
    control = reader.u8()
    if control & ROUND_TRIP:
        _round_trip_object(reader)
        return
    obj = reader.rest()
    if control & RESEAL:
        obj = reseal_run_object(obj)
    read_run_object(obj)


def read_run_object(obj: bytes) -> dict[int, list[bytes]]:
    """Every stream's messages in a run object (the only object: offsets start at 0), read and checked
    as the store reads them."""
    size = len(obj)
    footer = bf.decode_footer(obj[size - bf.OBJECT_FOOTER_BYTES:] if size >= bf.OBJECT_FOOTER_BYTES else obj, size)
    names, ends, positions, pages = bf.decode_index(obj[footer.names_position:size - bf.OBJECT_FOOTER_BYTES], footer)
    check(len(ends) == footer.stream_count and len(positions) == footer.stream_count + 1,
          "the index arrays disagree with the footer's stream count")
    check([i for i, _ in names] == list(range(footer.first_stream, footer.stream_count)) or not names,
          "names are not for the streams the footer says")
    index = RunIndex.empty().with_object(ends, positions)
    messages: dict[int, list[bytes]] = {}
    for stream_id in range(footer.stream_count):
        stream_ends, starts, stops = index.lookup(stream_id)
        count, start, stop = stream_ends[0], starts[0], stops[0]
        if count == 0 or stop <= start:
            continue
        lo, hi = bf.page_span(start, stop, footer.names_position)
        bf.check_pages(obj[lo:hi], lo, pages, KEY)
        raw = obj[start:stop]
        bf.frame_run(raw, count, KEY, stream_id)
        got = bf.run_messages(raw, count, 0, count)
        check(len(got) == count and b"".join(got) == raw[4 * count:],
              f"the messages of stream {stream_id} are not the bytes of its run")
        messages[stream_id] = got
    return messages


def _round_trip_object(reader: Reader) -> None:
    streams = 1 + reader.below(6)
    present = sorted({reader.below(streams) for _ in range(reader.below(streams + 1))})
    counts = [1 + reader.below(4) for _ in present]
    lengths = [reader.below(30) for _ in range(sum(counts))]
    data = reader.take(sum(lengths)).ljust(sum(lengths), b"\0")
    ends = np.cumsum(np.array(lengths, np.int64)).astype(np.uint32)
    names = [(i, f"q{i}") for i in range(streams)]
    obj, _, _ = bf.build_object(np.zeros(0, np.uint32), streams, 0, names, np.array(present, np.int64),
                                np.array(counts, np.int64), ends, memoryview(data))
    got = read_run_object(bytes(obj))
    want: dict[int, list[bytes]] = {}
    at = 0
    i = 0
    for stream_id, count in zip(present, counts, strict=True):
        want[stream_id] = [data[at + sum(lengths[i:i + k]):at + sum(lengths[i:i + k + 1])] for k in range(count)]
        at += sum(lengths[i:i + count])
        i += count
    check(got == want, "a run object built then read gives other messages")


def run_object_seeds() -> list[bytes]:
    obj, _, _ = bf.build_object(np.zeros(0, np.uint32), 3, 0, [(0, "a"), (1, "b"), (2, "c")],
                                np.array([0, 2], np.int64), np.array([2, 1], np.int64),
                                np.array([3, 5, 9], np.uint32), memoryview(b"xyzabwxyz"))
    return [bytes([0]) + bytes(obj), bytes([RESEAL]) + bytes(obj), bytes([ROUND_TRIP]) + bytes(range(120))]


def check_queue_manifest(data: bytes) -> None:
    reader = Reader(data)
    control = reader.u8()
    if control & ROUND_TRIP:
        manifest = QueueManifest(reader.uint(8), reader.uint(4), tuple(
            QueueObjectRef(reader.take(reader.below(80)).decode("utf-8", "replace"), reader.uint(8))
            for _ in range(reader.below(5))))
        check(decode_manifest(encode_manifest(manifest)) == manifest, "a queue manifest encoded then decoded differs")
        return
    raw = reader.rest()
    if control & RESEAL and len(raw) >= MANIFEST_CRC.size:
        raw = raw[:-MANIFEST_CRC.size] + MANIFEST_CRC.pack(crc32c(raw[:-MANIFEST_CRC.size]))
    manifest = decode_manifest(raw)
    check(decode_manifest(encode_manifest(manifest)) == manifest, "a decoded queue manifest does not round-trip")


def queue_manifest_seeds() -> list[bytes]:
    golden = encode_manifest(QueueManifest(7, 3, (QueueObjectRef("queues/0000000000000001-0000000000000005.slq", 1000),
                                                  QueueObjectRef("queues/0000000000000006.slq", 20))))
    return [bytes([0]) + golden, bytes([RESEAL]) + golden, bytes([ROUND_TRIP]) + bytes(range(90))]


def check_names(data: bytes) -> None:
    reader = Reader(data)
    added: dict[str, int] = {}
    for _ in range(reader.below(40)):
        name = reader.take(1 + reader.below(24)).decode("utf-8", "replace")
        if name not in added:
            added[name] = len(added) + reader.below(3)
    lookups = [reader.take(1 + reader.below(24)).decode("utf-8", "replace") for _ in range(reader.below(40))]
    index = NameIndex()
    if added:
        index.add(list(added), np.array(list(added.values()), np.int64))
    import pyarrow as pa

    asked = list(added) + lookups
    found = index.lookup(pa.array(asked, pa.string())).tolist()
    for name, got in zip(asked, found, strict=True):
        check(got in (-1, added.get(name, -1)), f"name {name!r} looked up as id {got}, added as {added.get(name)}")


def names_seeds() -> list[bytes]:
    return [bytes([10, 3]) + b"orders" * 20, bytes(range(256)), b"\x20" + "é名".encode() * 40]


_run_file: list[int] = []


def check_native_run_read(data: bytes) -> None:
    """The compiled cached reads of a run against their twins: a random get's cut of it, a sequential get's
    whole run, and a random get through a RunIndex whose one object holds it. The runs go to a file (its
    pages then in the page cache, which the read takes from); without the compiled core only the twin runs."""
    reader = Reader(data)
    start = reader.uint(2)
    end = start + reader.uint(2) - 8
    count, first, stop = reader.u8(), reader.u8(), reader.u8()
    cut_pages = reader.u8()
    runs = reader.rest()
    pages = bf.page_crcs(runs)
    if cut_pages & 1:
        pages = pages[:cut_pages >> 1]
    if not _run_file:
        _run_file.append(_open_run_file())
    fd = _run_file[0]
    os.ftruncate(fd, 0)
    os.pwrite(fd, runs, 0)
    args = (fd, len(runs), pages, KEY, start, end, count, 5, first, stop)

    def outcome(read: Any, arguments: tuple[Any, ...] = args) -> tuple[str, object]:
        try:
            return "returned", read(*arguments)
        except (bf.CorruptBulkError, ValueError) as e:
            return type(e).__name__, str(e)

    python = outcome(read_messages_cached)
    if native_crc is not None:
        compiled = outcome(native_crc.read_messages_cached)
        check(compiled == python, f"the compiled read gave {compiled}, its Python twin {python}")
    python = outcome(read_run_cached, args[:8])
    if native_crc is not None:
        compiled = outcome(native_crc.read_run_cached, args[:8])
        check(compiled == python, f"the compiled read of the run gave {compiled}, its Python twin {python}")
    # The same run as the one object of a RunIndex of one stream: a random get's whole read.
    matrix = (memoryview(array.array("I", [count])), memoryview(array.array("I", [start & 0xFFFF_FFFF,
                                                                                 end & 0xFFFF_FFFF])))
    random_args = (*matrix, 1, ((fd, len(runs), pages, KEY),), 0, first, stop)
    python = outcome(read_random_cached, random_args)
    if native_crc is not None:
        compiled = outcome(native_crc.read_random_cached, random_args)
        check(compiled == python, f"the compiled random get gave {compiled}, its Python twin {python}")


def _open_run_file() -> int:
    """A file for the runs, gone when the process ends (unlinked at once; its descriptor kept)."""
    fd, path = tempfile.mkstemp(prefix="stratalog-fuzz-runs-")
    os.unlink(path)
    return fd


def run_read_seeds() -> list[bytes]:
    def seed(start: int, messages: list[bytes], first: int, stop: int, before: bytes = b"") -> bytes:
        ends, total = [], 0
        for m in messages:
            total += len(m)
            ends.append(total.to_bytes(4, "little"))
        run = b"".join(ends) + b"".join(messages)
        head = start.to_bytes(2, "little") + (len(run) + 8).to_bytes(2, "little")
        return head + bytes([len(messages), first, stop, 0]) + before + run

    return [seed(0, [b"hello", b"world"], 0, 2), seed(100, [b"x" * 58] * 30, 3, 13, bytes(100)),
            seed(4000, [b"a" * 90, b"bb"], 1, 2, bytes(4000)), seed(0, [], 0, 0)]


TARGETS = (
    FuzzTarget("native_run_read", "the compiled cached read of a queue's run (a random get) against its Python "
               "twin: same messages, same error", check_native_run_read, (), run_read_seeds),
    FuzzTarget("queue_object", "run object footer, index, RunIndex, pages and runs, as recovery and readers "
               "read them; round trip", check_run_object, (bf.CorruptBulkError,), run_object_seeds),
    FuzzTarget("queue_manifest", "queues.manifest.decode_manifest; round trip", check_queue_manifest,
               (bf.CorruptBulkError,), queue_manifest_seeds),
    FuzzTarget("queue_names", "queues.names.NameIndex against a dict: an id added, or -1", check_names, (),
               names_seeds),
)
