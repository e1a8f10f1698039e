"""The transaction coordinator's durable state: each transactional id's last state (broker/txn_state.py's
``Txn``) and each partition's aborted transactions, in ``transactions.sqlite`` or the cluster's PostgreSQL
(metadata_db.py). Every change is committed (SQLite synchronous=FULL, or a PostgreSQL commit) before the
request that made it is answered. Spec: docs/formats/transactions.md.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from stratalog.broker.metadata_db import Location, open_metadata
from stratalog.broker.txn_state import PendingOffset, Txn, TxnPartition, TxnState
from stratalog.engine.metadata_backends import writing

SCHEMA = """
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY, producer_id INTEGER NOT NULL, producer_epoch INTEGER NOT NULL,
    timeout_ms INTEGER NOT NULL, state TEXT NOT NULL, partitions TEXT NOT NULL, groups_json TEXT NOT NULL,
    offsets TEXT NOT NULL, started_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS aborted_transactions (
    topic TEXT NOT NULL, partition_index INTEGER NOT NULL, producer_id INTEGER NOT NULL,
    first_offset INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition_index, last_offset)
);
"""


@dataclass(frozen=True, slots=True)
class AbortedRange:
    """Records of ``producer_id`` from ``first_offset`` up to its abort marker at ``last_offset`` were
    aborted (what Fetch's aborted_transactions lists for read_committed consumers)."""

    producer_id: int
    first_offset: int
    last_offset: int


class TxnTable:
    """Transactions and aborted ranges. Thread-safe; every write is durable when it returns."""

    def __init__(self, location: Location) -> None:
        self._lock = threading.Lock()
        self._db = open_metadata(location, SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def load(self) -> list[tuple[Txn, int]]:
        """Every transactional id's state, with when it last changed (ms)."""
        with self._lock:
            rows = self._db.execute("SELECT transactional_id, producer_id, producer_epoch, timeout_ms, state, "
                                    "partitions, groups_json, offsets, started_ms, updated_ms FROM transactions"
                                    ).fetchall()
        return [(_txn(row[:-1]), int(row[-1])) for row in rows]

    def save(self, txn: Txn, updated_ms: int, aborted: Sequence[tuple[str, int, AbortedRange]] = ()) -> None:
        """Store ``txn`` (and, with its completed abort, the ranges it aborted) in one transaction."""
        with self._lock, writing(self._db):
            self._db.execute(
                "INSERT INTO transactions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (transactional_id) DO "
                "UPDATE SET producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch, "
                "timeout_ms = excluded.timeout_ms, state = excluded.state, partitions = excluded.partitions, "
                "groups_json = excluded.groups_json, offsets = excluded.offsets, started_ms = excluded.started_ms, "
                "updated_ms = excluded.updated_ms", (*_row(txn), updated_ms))
            if aborted:
                self._db.executemany(
                    "INSERT INTO aborted_transactions VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [(topic, partition, r.producer_id, r.first_offset, r.last_offset)
                     for topic, partition, r in aborted])

    def aborted(self) -> dict[tuple[str, int], list[AbortedRange]]:
        """Every partition's aborted ranges, by their markers' offsets."""
        with self._lock:
            rows = self._db.execute("SELECT topic, partition_index, producer_id, first_offset, last_offset FROM "
                                    "aborted_transactions ORDER BY topic, partition_index, last_offset").fetchall()
        found: dict[tuple[str, int], list[AbortedRange]] = {}
        for topic, partition, producer_id, first, last in rows:
            found.setdefault((str(topic), int(partition)), []).append(AbortedRange(int(producer_id), int(first),
                                                                                    int(last)))
        return found

    def delete(self, txn_id: str) -> None:
        """Forget a transactional id (expired: see transactions.py)."""
        with self._lock, writing(self._db):
            self._db.execute("DELETE FROM transactions WHERE transactional_id = ?", (txn_id,))

    def forget_aborted_before(self, topic: str, partition: int, offset: int) -> None:
        """Drop the ranges that end below ``offset`` (the partition's start after a trim)."""
        with self._lock, writing(self._db):
            self._db.execute("DELETE FROM aborted_transactions WHERE topic = ? AND partition_index = ? AND "
                             "last_offset < ?", (topic, partition, offset))


def _row(txn: Txn) -> tuple[object, ...]:
    partitions = json.dumps([[p.topic, p.partition, p.first_offset] for p in txn.partitions])
    offsets = json.dumps([[o.group_id, o.topic, o.partition, o.offset, o.leader_epoch, o.metadata]
                          for o in txn.offsets])
    return (txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.timeout_ms, txn.state.value, partitions,
            json.dumps(list(txn.groups)), offsets, txn.started_ms)


def _txn(row: tuple[object, ...]) -> Txn:
    txn_id, producer_id, epoch, timeout_ms, state, partitions, groups, offsets, started_ms = row
    return Txn(str(txn_id), int(producer_id), int(epoch), int(timeout_ms), TxnState(state),  # type: ignore[call-overload]
               tuple(TxnPartition(t, p, f) for t, p, f in json.loads(str(partitions))),
               tuple(json.loads(str(groups))),
               tuple(PendingOffset(*o) for o in json.loads(str(offsets))), int(started_ms))  # type: ignore[call-overload]
