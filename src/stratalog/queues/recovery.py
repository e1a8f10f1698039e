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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np

from stratalog.queues.format import BulkRecord, Ids


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
