"""Producers' state in each partition across restarts: a periodic snapshot, then the batches written after it.

Every ``producer_snapshot_interval_ms`` the broker writes each producer's last batches per partition, the
transactions open in each partition (broker/txn_partitions.py) and each partition's end offset into
``producers.sqlite`` or PostgreSQL (metadata_db.py), in one transaction. At start it loads the last
snapshot and reads each partition's batches from the snapshot's end offset to its end (Kafka batch
headers only: producer id, epoch, base sequence, count, and the markers' types), recording them as a live
broker would have. A producer that retries a batch across a kill -9 then gets the offset the batch got
before, not a second copy, and a transaction open in a partition still holds its last stable offset; the
work at start is bounded by what was written during one snapshot interval.

The same database keeps each partition's aborted ranges, written as each abort marker is (txn_markers.py)
and before a snapshot may end past that marker: so a range lost with a power cut (SQLite's commits are
ordered) is found again by the replay, which reads the marker.

Rows are kept per partition (stream id). A broker of a cluster snapshots only the partitions it leads
and replaces only their rows, so brokers sharing the tables never delete each other's; a broker that
gains a partition loads that partition's rows and replays its batches after them. Which partitions it
leads is asked in the snapshot's own transaction (``held``): one it lost while paused past its lease
keeps the rows its new leader wrote, so a partition's rows always describe a prefix of its log.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.broker.metadata_db import Location, open_metadata
from stratalog.broker.producers import ProducerStates
from stratalog.broker.txn_partitions import AbortedRange, PartitionTxns
from stratalog.engine import Stream
from stratalog.engine.batch import ENCODING_KAFKA, StoredBatch
from stratalog.engine.metadata_backends import Backend, SqliteBackend, writing
from stratalog.kafka.batch_format import CONTROL_BIT, TRANSACTIONAL_BIT
from stratalog.kafka.control_batch import marker_type
from stratalog.kafka.records import HEADER

SCHEMA = """
CREATE TABLE IF NOT EXISTS producer_snapshot (
    producer_id INTEGER NOT NULL, stream_id INTEGER NOT NULL, epoch INTEGER NOT NULL, batches TEXT NOT NULL,
    PRIMARY KEY (producer_id, stream_id)
);
CREATE TABLE IF NOT EXISTS producer_snapshot_ends (stream_id INTEGER PRIMARY KEY, end_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS producer_snapshot_txns (
    stream_id INTEGER NOT NULL, producer_id INTEGER NOT NULL, first_offset INTEGER NOT NULL,
    PRIMARY KEY (stream_id, producer_id)
);
CREATE TABLE IF NOT EXISTS aborted_ranges (
    stream_id INTEGER NOT NULL, last_offset INTEGER NOT NULL, producer_id INTEGER NOT NULL,
    first_offset INTEGER NOT NULL, PRIMARY KEY (stream_id, last_offset)
);
"""
#: Stream ids per ``IN (...)`` list: well under SQLite's bound on a statement's parameters.
IN_LIST_MAX = 500
#: Bytes of batches read per step while replaying a partition after its snapshot.
REPLAY_READ_BYTES = 4 << 20
#: The tables a snapshot replaces (the aborted ranges are not a snapshot's: they are added as markers are).
SNAPSHOT_TABLES = ("producer_snapshot", "producer_snapshot_ends", "producer_snapshot_txns")


#: One snapshot entry of an idempotent producer: (producer id, stream id, epoch, its last batches).
Entry = tuple[int, object, int, list[tuple[int, int, int]]]
#: One open transaction: (stream id, producer id, where it began).
OpenTxn = tuple[int, int, int]


class ProducerSnapshots:
    """The last snapshot, and the aborted ranges. ``location``: ``producers.sqlite``'s path, or a PostgreSQL URI."""

    def __init__(self, location: Location) -> None:
        self._lock = threading.Lock()
        # NORMAL: a snapshot lost to a power cut costs a longer replay, nothing else (see the module's doc
        # for the aborted ranges).
        self._db = open_metadata(location, SCHEMA, synchronous="NORMAL")
        #: A broker of a cluster: called inside a partitions-only snapshot's transaction with the streams it
        #: would replace; returns those it may (Cluster.streams_held: the partitions it still holds under a
        #: live lease). Rows of the others are left as their new leader wrote them.
        self.held: Callable[[Backend, Sequence[int]], set[int]] | None = None

    @classmethod
    def read_only(cls, path: Path) -> ProducerSnapshots:
        """The snapshot in the SQLite file ``path``, opened read-only, for ``load`` alone: a Spark read of a
        data directory at rest tells aborted records by it (spark/rest_txns.py) and writes nothing."""
        self = cls.__new__(cls)
        self._lock = threading.Lock()
        self._db = SqliteBackend(path, SCHEMA, read_only=True)
        self.held = None
        return self

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def save(self, entries: Iterable[Entry], ends: dict[int, int], open_txns: Iterable[OpenTxn] = (), *,
             partitions_only: bool = False) -> None:
        """Replace the snapshot by ``entries``, ``open_txns`` and ``ends``. ``partitions_only``: replace only
        the rows of the streams in ``ends`` (a broker of a cluster snapshots the partitions it leads, and
        leaves the rows of the others' partitions alone); ``entries`` of other streams are left out."""
        rows = [(pid, int(partition), epoch, json.dumps(batches))  # type: ignore[call-overload]
                for pid, partition, epoch, batches in entries]
        txns = list(open_txns)
        with self._lock, writing(self._db):
            if partitions_only:
                if self.held is not None:
                    held = self.held(self._db, list(ends))
                    ends = {stream_id: end for stream_id, end in ends.items() if stream_id in held}
                rows = [r for r in rows if r[1] in ends]
                txns = [t for t in txns if t[0] in ends]
                ids = list(ends)
                for i in range(0, len(ids), IN_LIST_MAX):
                    chunk = ids[i:i + IN_LIST_MAX]
                    marks = ",".join("?" * len(chunk))
                    for table in SNAPSHOT_TABLES:
                        self._db.execute(f"DELETE FROM {table} WHERE stream_id IN ({marks})", chunk)
            else:
                for table in SNAPSHOT_TABLES:
                    self._db.execute(f"DELETE FROM {table}")
            self._db.executemany("INSERT INTO producer_snapshot VALUES (?, ?, ?, ?)", rows)
            self._db.executemany("INSERT INTO producer_snapshot_ends VALUES (?, ?)", list(ends.items()))
            self._db.executemany("INSERT INTO producer_snapshot_txns VALUES (?, ?, ?)", txns)

    def load(self, states: ProducerStates, txns: PartitionTxns) -> dict[int, int]:
        """Restore the snapshot into ``states`` and ``txns`` (with every stream's aborted ranges); return
        each stream's end offset at the snapshot."""
        with self._lock:
            for pid, stream_id, epoch, batches in self._db.execute("SELECT * FROM producer_snapshot").fetchall():
                states.restore(pid, stream_id, epoch, [tuple(b) for b in json.loads(batches)])
            opened: dict[int, dict[int, int]] = {}
            for stream_id, pid, first in self._db.execute("SELECT * FROM producer_snapshot_txns").fetchall():
                opened.setdefault(int(stream_id), {})[int(pid)] = int(first)
            aborted: dict[int, list[AbortedRange]] = {}
            for stream_id, last, pid, first in self._db.execute("SELECT * FROM aborted_ranges").fetchall():
                aborted.setdefault(int(stream_id), []).append(AbortedRange(int(last), int(pid), int(first)))
            ends = dict(self._db.execute("SELECT stream_id, end_offset FROM producer_snapshot_ends").fetchall())
        for stream_id in opened.keys() | aborted.keys():
            txns.restore(stream_id, opened.get(stream_id, {}), aborted.get(stream_id, []))
        return ends

    def load_partition(self, states: ProducerStates, txns: PartitionTxns, stream_id: int) -> int:
        """Restore one stream's rows into ``states`` and ``txns`` (a partition this broker just gained);
        return the stream's end offset at its last snapshot (0 when it has none)."""
        with self._lock:
            for pid, epoch, batches in self._db.execute(
                    "SELECT producer_id, epoch, batches FROM producer_snapshot WHERE stream_id = ?",
                    (stream_id,)).fetchall():
                states.restore(pid, stream_id, epoch, [tuple(b) for b in json.loads(batches)])
            opened = {int(pid): int(first) for pid, first in self._db.execute(
                "SELECT producer_id, first_offset FROM producer_snapshot_txns WHERE stream_id = ?",
                (stream_id,)).fetchall()}
            aborted = [AbortedRange(int(last), int(pid), int(first)) for last, pid, first in self._db.execute(
                "SELECT last_offset, producer_id, first_offset FROM aborted_ranges WHERE stream_id = ?",
                (stream_id,)).fetchall()]
            row = self._db.execute("SELECT end_offset FROM producer_snapshot_ends WHERE stream_id = ?",
                                   (stream_id,)).fetchone()
        txns.restore(stream_id, opened, aborted)
        return 0 if row is None else int(row[0])

    # Aborted ranges ------------------------------------------------------------------------------------

    def add_aborted(self, stream_id: int, ranges: Sequence[AbortedRange]) -> None:
        """Make ranges durable (one already kept is left as it is: a marker read again by a replay)."""
        with self._lock, writing(self._db):
            self._db.executemany("INSERT INTO aborted_ranges VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                                 [(stream_id, r.last_offset, r.producer_id, r.first_offset) for r in ranges])

    def forget_aborted_before(self, stream_id: int, offset: int) -> None:
        """Drop the ranges that end below ``offset`` (the stream's start after a trim; past every offset
        for a deleted stream)."""
        with self._lock, writing(self._db):
            self._db.execute("DELETE FROM aborted_ranges WHERE stream_id = ? AND last_offset < ?", (stream_id, offset))


def replay(states: ProducerStates, txns: PartitionTxns, stream: Stream, from_offset: int) -> ReplayResult:
    """Record the batches of ``stream`` from ``from_offset`` to its end: idempotent ones in ``states``, the
    transactions they open and the markers that end them in ``txns``."""
    position = max(from_offset, stream.start_offset)
    end = stream.end_offset
    result = ReplayResult()
    while position < end:
        batches = stream.fetch_batches(position, REPLAY_READ_BYTES)
        if not batches:
            break
        for batch in batches:
            if batch.end_offset <= position:
                continue
            if batch.encoding == ENCODING_KAFKA:
                _replay_one(states, txns, stream.stream_id, batch, result)
            position = batch.end_offset
    return result


@dataclass(slots=True)
class ReplayResult:
    """What a replay found: idempotent batches, and the ranges of the abort markers it read (to be made
    durable: one may have been lost with the last moments before a crash)."""

    batches: int = 0
    aborted: list[AbortedRange] = field(default_factory=list)


def _replay_one(states: ProducerStates, txns: PartitionTxns, stream_id: int, batch: StoredBatch,
                result: ReplayResult) -> None:
    header = HEADER.unpack_from(batch.body, 0)
    attributes, producer_id, epoch, base_sequence = header[5], header[9], header[10], header[11]
    if producer_id < 0:
        return
    if attributes & CONTROL_BIT:
        # A marker carries its producer's id and epoch but no sequence: as the live broker, the epoch fences
        # older ones, and no batch is recorded.
        kind = marker_type(batch.body)
        states.marked(producer_id, epoch, stream_id)
        aborted = txns.aborts(stream_id, producer_id, kind, batch.base_offset) if kind is not None else None
        txns.ended(stream_id, producer_id, aborted)
        if aborted is not None:
            result.aborted.append(aborted)
        return
    states.record(producer_id, epoch, stream_id, base_sequence, batch.count, batch.base_offset)
    result.batches += 1
    if attributes & TRANSACTIONAL_BIT:
        txns.began(stream_id, producer_id, batch.base_offset)
