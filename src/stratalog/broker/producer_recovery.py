"""Idempotent producers' state across restarts: a periodic snapshot, then the batches written after it.

Every ``producer_snapshot_interval_ms`` the broker writes each producer's last batches per partition and
each partition's end offset into ``producers.sqlite`` or PostgreSQL (metadata_db.py), in one
transaction. At start it loads the last snapshot and reads each partition's batches from the snapshot's
end offset to its end (Kafka batch headers only: producer id, epoch, base sequence, count), recording
them as a live broker would have. A producer that
retries a batch across a kill -9 then gets the offset the batch got before, not a second copy; the
work at start is bounded by what was written during one snapshot interval.

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

from stratalog.broker.metadata_db import Location, open_metadata
from stratalog.broker.producers import ProducerStates
from stratalog.engine import Stream
from stratalog.engine.batch import ENCODING_KAFKA
from stratalog.engine.metadata_backends import Backend, writing
from stratalog.kafka.batch_format import CONTROL_BIT
from stratalog.kafka.records import HEADER

SCHEMA = """
CREATE TABLE IF NOT EXISTS producer_snapshot (
    producer_id INTEGER NOT NULL, stream_id INTEGER NOT NULL, epoch INTEGER NOT NULL, batches TEXT NOT NULL,
    PRIMARY KEY (producer_id, stream_id)
);
CREATE TABLE IF NOT EXISTS producer_snapshot_ends (stream_id INTEGER PRIMARY KEY, end_offset INTEGER NOT NULL);
"""
#: Stream ids per ``IN (...)`` list: well under SQLite's bound on a statement's parameters.
IN_LIST_MAX = 500
#: Bytes of batches read per step while replaying a partition after its snapshot.
REPLAY_READ_BYTES = 4 << 20


class ProducerSnapshots:
    """The last snapshot. ``location``: ``producers.sqlite``'s path, or a PostgreSQL URI."""

    def __init__(self, location: Location) -> None:
        self._lock = threading.Lock()
        # NORMAL: a snapshot lost to a power cut costs a longer replay, nothing else.
        self._db = open_metadata(location, SCHEMA, synchronous="NORMAL")
        #: A broker of a cluster: called inside a partitions-only snapshot's transaction with the streams it
        #: would replace; returns those it may (Cluster.streams_held: the partitions it still holds under a
        #: live lease). Rows of the others are left as their new leader wrote them.
        self.held: Callable[[Backend, Sequence[int]], set[int]] | None = None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def save(self, entries: Iterable[tuple[int, object, int, list[tuple[int, int, int]]]],
             ends: dict[int, int], *, partitions_only: bool = False) -> None:
        """Replace the snapshot by ``entries`` and ``ends``. ``partitions_only``: replace only the rows of
        the streams in ``ends`` (a broker of a cluster snapshots the partitions it leads, and leaves the
        rows of the others' partitions alone); ``entries`` of other streams are left out."""
        rows = [(pid, int(partition), epoch, json.dumps(batches))  # type: ignore[call-overload]
                for pid, partition, epoch, batches in entries]
        with self._lock, writing(self._db):
            if partitions_only:
                if self.held is not None:
                    held = self.held(self._db, list(ends))
                    ends = {stream_id: end for stream_id, end in ends.items() if stream_id in held}
                rows = [r for r in rows if r[1] in ends]
                ids = list(ends)
                for i in range(0, len(ids), IN_LIST_MAX):
                    chunk = ids[i:i + IN_LIST_MAX]
                    marks = ",".join("?" * len(chunk))
                    self._db.execute(f"DELETE FROM producer_snapshot WHERE stream_id IN ({marks})", chunk)
                    self._db.execute(f"DELETE FROM producer_snapshot_ends WHERE stream_id IN ({marks})", chunk)
            else:
                self._db.execute("DELETE FROM producer_snapshot")
                self._db.execute("DELETE FROM producer_snapshot_ends")
            self._db.executemany("INSERT INTO producer_snapshot VALUES (?, ?, ?, ?)", rows)
            self._db.executemany("INSERT INTO producer_snapshot_ends VALUES (?, ?)", list(ends.items()))

    def load(self, states: ProducerStates) -> dict[int, int]:
        """Restore the snapshot into ``states``; return each stream's end offset at the snapshot."""
        with self._lock:
            for pid, stream_id, epoch, batches in self._db.execute("SELECT * FROM producer_snapshot").fetchall():
                states.restore(pid, stream_id, epoch, [tuple(b) for b in json.loads(batches)])
            return dict(self._db.execute("SELECT stream_id, end_offset FROM producer_snapshot_ends").fetchall())

    def load_partition(self, states: ProducerStates, stream_id: int) -> int:
        """Restore one stream's rows into ``states`` (a partition this broker just gained); return the
        stream's end offset at its last snapshot (0 when it has none)."""
        with self._lock:
            for pid, epoch, batches in self._db.execute(
                    "SELECT producer_id, epoch, batches FROM producer_snapshot WHERE stream_id = ?",
                    (stream_id,)).fetchall():
                states.restore(pid, stream_id, epoch, [tuple(b) for b in json.loads(batches)])
            row = self._db.execute("SELECT end_offset FROM producer_snapshot_ends WHERE stream_id = ?",
                                   (stream_id,)).fetchone()
        return 0 if row is None else int(row[0])


def replay(states: ProducerStates, stream: Stream, from_offset: int) -> int:
    """Record the idempotent batches of ``stream`` from ``from_offset`` to its end; return how many."""
    position = max(from_offset, stream.start_offset)
    end = stream.end_offset
    seen = 0
    while position < end:
        batches = stream.fetch_batches(position, REPLAY_READ_BYTES)
        if not batches:
            break
        for batch in batches:
            if batch.end_offset <= position:
                continue
            if batch.encoding == ENCODING_KAFKA:
                fields = HEADER.unpack_from(batch.body, 0)
                attributes, producer_id, epoch, base_sequence = fields[5], fields[9], fields[10], fields[11]
                # A transaction marker carries its producer's id but no sequence: the live broker records
                # none for it either (transactions.py).
                if producer_id >= 0 and not attributes & CONTROL_BIT:
                    states.record(producer_id, epoch, stream.stream_id, base_sequence, batch.count, batch.base_offset)
                    seen += 1
            position = batch.end_offset
    return seen
