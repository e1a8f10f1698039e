"""Queue recovery's decision: what one bulk record found in the WAL at open is, and what replay does with it.

Open first loads every committed run object's index, which says each queue's end in objects; then the WAL
is replayed from its trim point one bulk record at a time, each judged against the queues as objects and
the records replayed before it left them. The table (docs/formats/queues.md, "Recovery rules"), checked
in this order:

| # | the record                                                                | case               | action    |
|---|---------------------------------------------------------------------------|--------------------|-----------|
| 1 | a run of a stream at or past the record's ``stream_count``                | UNKNOWN_STREAM     | drop rest |
| 2 | runs, each ending at or below its stream's end                            | UPLOADED           | skip      |
| 3 | names only, every one known under the same id                             | NAMES_UPLOADED     | skip      |
| 4 | new names not continuing the ids, or ``stream_count`` not known + new     | NAMES_OUT_OF_ORDER | drop rest |
| 5 | a run that does not start at its stream's next offset                     | RUN_OUT_OF_PLACE   | drop rest |
| 6 | anything else (names continue the ids, runs start at their streams' ends) | FOLLOWS_ON         | replay    |

New names already known under the same ids (row 3's, beside runs) count as none in rows 4 to 6.
Skipped records are in objects already: the WAL trim after the upload that took them was not durable
before the crash. A dropped record lies after a hole the WAL skipped: a record lost before it was never
acknowledged, so neither was this one nor any after it.

:func:`recover` runs it all: objects, the WAL, then the upload of what was replayed and the deletion of
objects no commit names.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum

import numpy as np

from stratalog.engine.metadata import Metadata
from stratalog.engine.upkeep import delete_orphans
from stratalog.objects.store import ObjectStore
from stratalog.queues.format import (
    I64,
    OBJECT_FOOTER_BYTES,
    BulkRecord,
    CorruptBulkError,
    Ids,
    decode_bulk,
    decode_footer,
    decode_index,
)
from stratalog.queues.index import RunIndex
from stratalog.queues.logcache import CachedRecord, LogCache
from stratalog.queues.objects import QUEUE_PREFIX, RunObject, object_order
from stratalog.queues.uploader import Uploader
from stratalog.queues.writer import Writer
from stratalog.wal import WriteAheadLog


class Action(Enum):
    """What replay does with a record."""

    SKIP = "skip"
    REPLAY = "replay into the log cache"
    DROP_REST = "drop it and every later record"


class RecordCase(Enum):
    """What a bulk record found in the WAL at open is, next to the queues recovered before it."""

    UNKNOWN_STREAM = "a run of a stream the record itself does not count"
    UPLOADED = "uploaded; the WAL trim after the commit did not happen"
    NAMES_UPLOADED = "a record of names an upload took, its WAL trim not durable"
    NAMES_OUT_OF_ORDER = "names that do not continue the ids: a hole the WAL skipped"
    RUN_OUT_OF_PLACE = "a run that does not start at its stream's end: a hole the WAL skipped"
    FOLLOWS_ON = "written after the last upload"


#: The decision table: one row per case, in the order :func:`classify` tries them.
ACTIONS: Mapping[RecordCase, Action] = {
    RecordCase.UNKNOWN_STREAM: Action.DROP_REST,
    RecordCase.UPLOADED: Action.SKIP,
    RecordCase.NAMES_UPLOADED: Action.SKIP,
    RecordCase.NAMES_OUT_OF_ORDER: Action.DROP_REST,
    RecordCase.RUN_OUT_OF_PLACE: Action.DROP_REST,
    RecordCase.FOLLOWS_ON: Action.REPLAY,
}


def classify(bulk: BulkRecord, next_offsets: Ids, stream_count: int, ids: Mapping[str, int]) -> RecordCase:
    """Which row of the table ``bulk`` falls in, given each known stream's next offset (``next_offsets``,
    at least ``stream_count`` long; longer entries are 0), the streams known and the names known."""
    stream_ids = bulk.stream_ids
    if len(stream_ids) and int(stream_ids.max()) >= bulk.stream_count:
        return RecordCase.UNKNOWN_STREAM
    known = stream_ids < len(next_offsets)
    nxt = np.where(known, next_offsets[np.where(known, stream_ids, 0)], 0)
    if len(stream_ids) and bool(np.all(known)) and bool(np.all(bulk.base_offsets + bulk.counts <= nxt)):
        return RecordCase.UPLOADED
    new = [i for i, _ in bulk.names]
    if new and new[-1] < stream_count and all(ids.get(name) == i for i, name in bulk.names):
        # Names the objects already hold (a record of names an upload took, still in the WAL because the
        # trim after the upload was not yet durable). Taken for a hole, it dropped every record after it,
        # flushed ones too.
        if not len(stream_ids):
            return RecordCase.NAMES_UPLOADED
        new = []
    if (new and new != list(range(stream_count, stream_count + len(new)))) \
            or bulk.stream_count != stream_count + len(new):
        return RecordCase.NAMES_OUT_OF_ORDER
    # Streams this record creates have no offsets yet: their next offset is 0.
    if not bool(np.all(bulk.base_offsets == nxt)):
        return RecordCase.RUN_OUT_OF_PLACE
    return RecordCase.FOLLOWS_ON


@dataclass(slots=True)
class QueueRecoveryReport:
    """What an open found and did (``QueueStore.recovery``)."""

    objects: int = 0
    index_bytes: int = 0
    wal_records: int = 0
    records_in_objects: int = 0
    records_replayed: int = 0
    messages_replayed: int = 0
    #: Records after the first one that does not follow on (a hole the WAL skipped): never acknowledged.
    records_dropped: int = 0
    orphan_objects_deleted: int = 0
    #: Objects a merge replaced whose deletion a crash or a close cut off.
    merged_away_deleted: int = 0
    #: Objects that are merges of several uploads.
    merged_objects: int = 0
    seconds: float = 0.0


def recover(*, objects: ObjectStore, meta: Metadata, wal: WriteAheadLog, writer: Writer, log_cache: LogCache,
            uploader: Uploader, upload_bytes_threshold: int) -> QueueRecoveryReport:
    """Bring a store's queues back: load the objects' indexes, replay the WAL into the log cache, upload
    what was replayed, trim the WAL and delete what no commit names (docs/formats/queues.md)."""
    report = QueueRecoveryReport()
    started = time.monotonic()
    loaded, index = _load_objects(objects, meta, writer, uploader, report)
    writer.adopt_ends(index.last_ends())
    log_cache.set_objects(tuple(loaded), index)
    last_wal_offset = -1
    stopped = False
    for rec in wal.recover():
        report.wal_records += 1
        last_wal_offset = rec.offset
        if stopped:
            report.records_dropped += 1
            continue
        body = bytes(rec.data)
        bulk = decode_bulk(body)
        action = ACTIONS[classify(bulk, writer.next_offsets, writer.stream_count, writer.ids)]
        if action is Action.SKIP:
            report.records_in_objects += 1
            continue
        if action is Action.DROP_REST:
            stopped = True
            report.records_dropped += 1
            continue
        _replay(bulk, body, rec.offset, writer, log_cache)
        report.records_replayed += 1
        report.messages_replayed += len(bulk.ends)
        if log_cache.cache_bytes >= upload_bytes_threshold:
            uploader.upload(everything=True)
    uploader.upload(everything=True)
    writer.index_names()
    if last_wal_offset > wal.trim_offset:
        wal.trim(last_wal_offset)
    # Before deleting merged-away objects: a manifest published before a crash may still name them.
    uploader.publish_manifest()
    _delete_orphans(objects, meta, report)
    report.merged_objects = sum("-" in o.key for o in log_cache.view.objects)
    report.seconds = time.monotonic() - started
    return report


def _load_objects(objects: ObjectStore, meta: Metadata, writer: Writer, uploader: Uploader,
                  report: QueueRecoveryReport) -> tuple[list[RunObject], RunIndex]:
    """Each committed object's footer and index section (never its runs), in the order of their places."""
    loaded: list[RunObject] = []
    index = RunIndex.empty()
    live = [m for m in meta.objects() if m.key.startswith(QUEUE_PREFIX) and m.unreferenced_ms is None]
    for row in sorted(live, key=lambda m: object_order(m.key, m.object_id)):
        size = row.size_bytes
        footer = decode_footer(objects.get(row.key, size - OBJECT_FOOTER_BYTES, size), size)
        raw = objects.get(row.key, footer.names_position, size - OBJECT_FOOTER_BYTES)
        names, ends, positions, pages = decode_index(raw, footer)
        if footer.first_stream != writer.stream_count:
            raise CorruptBulkError(f"queue object {row.key} names streams from {footer.first_stream}; "
                                   f"{writer.stream_count} are known")
        writer.adopt_object_names(names, footer.stream_count)
        loaded.append(RunObject(row.object_id, row.key, uploader.open_reader(row.key), size, pages,
                                footer.names_position))
        index = index.with_object(ends, positions)
        report.objects += 1
        report.index_bytes += ends.nbytes + positions.nbytes + pages.nbytes
    return loaded, index


def _replay(bulk: BulkRecord, body: bytes, wal_offset: int, writer: Writer, log_cache: LogCache) -> None:
    writer.replay(bulk)
    message_at = np.zeros(len(bulk.ends) + 1, np.int32)
    message_at[1:] = bulk.ends
    first_msg = np.zeros(len(bulk.stream_ids) + 1, I64)
    np.cumsum(bulk.counts, out=first_msg[1:])
    done: Future[int] = Future()
    done.set_result(wal_offset)
    log_cache.add(CachedRecord(log_cache.next_seq(), wal_offset, done, bulk.stream_ids, bulk.base_offsets,
                               bulk.counts, first_msg, bulk.data, message_at.data, bulk.names, bulk.stream_count,
                               len(body), time.monotonic()))


def _delete_orphans(objects: ObjectStore, meta: Metadata, report: QueueRecoveryReport) -> None:
    """Delete objects an interrupted upload or merge wrote but never committed, the pieces of cut-off
    puts, and objects a merge replaced (nothing reads them before the open returns)."""
    for row in meta.collect_unreferenced(int(time.time() * 1000) + 1):
        if row.key.startswith(QUEUE_PREFIX):
            objects.delete(row.key)
            meta.forget_object(row.object_id)
            report.merged_away_deleted += 1
    report.orphan_objects_deleted = delete_orphans(objects, meta, QUEUE_PREFIX)
