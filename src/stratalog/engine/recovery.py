"""Recovery at open: the WAL replayed from its trim point into the log cache, skipping what metadata says
is already in objects; everything replayed uploaded; objects no commit refers to deleted.

A WAL record's batch, against its stream's next offset (from metadata's committed end, then each batch
replayed):

| batch                      | meaning                                                   | recovery          |
|----------------------------|-----------------------------------------------------------|-------------------|
| of a stream not in metadata| the stream was deleted after the append                   | skipped, counted  |
| base offset == next        | appended, maybe acknowledged, not in objects              | replayed          |
| base offset < next         | in objects already (a crash between commit and WAL trim)  | skipped, counted  |
| base offset > next         | after a hole: a batch before it never became durable, so  | dropped, logged   |
|                            | it was never acknowledged (unless a WAL record was damaged)|                   |
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from stratalog.engine.batch import check_batch
from stratalog.engine.core import StoreCore
from stratalog.engine.log_cache import LogEntry
from stratalog.engine.upkeep import delete_orphans
from stratalog.engine.uploads import DATA_PREFIX, Uploads

log = logging.getLogger("stratalog.engine")


@dataclass(slots=True)
class RecoveryReport:
    wal_records: int = 0
    batches_replayed: int = 0
    batches_already_in_objects: int = 0
    batches_not_contiguous: int = 0
    #: Records in those batches: never acknowledged after a plain crash; lost if a WAL record was damaged.
    records_not_contiguous: int = 0
    #: WAL records whose body failed its CRC (bit rot, a torn write): what they held is gone.
    wal_records_damaged: int = 0
    batches_of_unknown_streams: int = 0
    orphan_objects_deleted: int = 0
    seconds: float = 0.0


def recover(core: StoreCore, uploads: Uploads) -> RecoveryReport:
    """Replay the WAL into the log cache and upload it (see the module's table); before the store serves."""
    report = RecoveryReport()
    started = time.monotonic()
    last_wal_offset = -1
    dropped: dict[int, tuple[int, int]] = {}  # stream -> offsets of batches that did not continue it
    for rec in core.wal.recover():
        report.wal_records += 1
        last_wal_offset = rec.offset
        info = check_batch(rec.data)
        st = core.streams.get(info.stream_id)
        if st is None:
            report.batches_of_unknown_streams += 1
            continue
        if info.base_offset != st.next_offset:
            if info.base_offset < st.next_offset:
                report.batches_already_in_objects += 1
            else:
                report.batches_not_contiguous += 1
                report.records_not_contiguous += info.count
                low, high = dropped.get(st.stream_id, (info.base_offset, 0))
                dropped[st.stream_id] = (min(low, info.base_offset), max(high, info.base_offset + info.count))
            continue
        data = bytes(rec.data)
        entry = LogEntry(info.base_offset, info.count, data, info.max_timestamp_ms, rec.offset, time.monotonic())
        core.cache.add(st, entry)
        st.next_offset = st.durable_end = entry.end_offset
        report.batches_replayed += 1
        if core.cache.size_bytes >= core.config.log_cache_bytes_max:
            uploads.upload(trim_wal=False, everything=True)
    report.wal_records_damaged = core.wal.recovery_stats.bad_body_records
    _report_dropped(core, dropped, report.wal_records_damaged)
    uploads.upload(trim_wal=False, everything=True)
    if last_wal_offset > core.wal.trim_offset:
        core.wal.trim(last_wal_offset)
    report.orphan_objects_deleted = _delete_orphans(core)
    if core.manifest_stale:
        core.publish([], snapshot=True)
    report.seconds = time.monotonic() - started
    return report


def _report_dropped(core: StoreCore, dropped: dict[int, tuple[int, int]], damaged: int) -> None:
    """Say which offsets recovery left out. Batches past a hole were never acknowledged after a plain
    crash (the WAL acknowledges in order); after a damaged record they may have been, so say it loudly."""
    if not dropped and not damaged:
        return
    level = logging.ERROR if damaged else logging.INFO
    if damaged:
        log.error("recovery: %d WAL record(s) failed their CRC and were dropped; acknowledged records may "
                  "be lost. Each stream below ends before its first missing batch", damaged)
    for stream_id, (low, high) in sorted(dropped.items()):
        st = core.streams[stream_id]
        log.log(level, "recovery: stream %d ends at offset %d; batches at offsets %d..%d after a hole "
                "were dropped", stream_id, st.next_offset, low, high - 1)


def _delete_orphans(core: StoreCore) -> int:
    """Delete objects an interrupted upload wrote but never committed, and the pieces of cut-off puts.
    Not when other writers share the object store: an object unknown to metadata may be one of theirs,
    put and not yet committed."""
    if core.shared_objects:
        return 0
    return delete_orphans(core.objects, core.meta, DATA_PREFIX)
