"""The transaction coordinator's durable state: each transactional id's last state (broker/txn_state.py's
``Txn``), in ``transactions.sqlite`` or the cluster's PostgreSQL (metadata_db.py). Every change is
committed (SQLite synchronous=FULL, or a PostgreSQL commit) before the request that made it is answered.
Each partition's aborted ranges are its leader's (producer_recovery.py). Spec: docs/formats/transactions.md.
"""

from __future__ import annotations

import json
import threading

from stratalog.broker.metadata_db import Location, open_metadata
from stratalog.broker.txn_state import PendingOffset, Txn, TxnPartition, TxnState
from stratalog.engine.metadata_backends import writing

SCHEMA = """
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY, producer_id INTEGER NOT NULL, producer_epoch INTEGER NOT NULL,
    timeout_ms INTEGER NOT NULL, state TEXT NOT NULL, partitions TEXT NOT NULL, groups_json TEXT NOT NULL,
    offsets TEXT NOT NULL, started_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL
);
"""


class TxnTable:
    """Transactional ids' states. Thread-safe; every write is durable when it returns."""

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

    def save(self, txn: Txn, updated_ms: int) -> None:
        """Store ``txn``."""
        with self._lock, writing(self._db):
            self._db.execute(
                "INSERT INTO transactions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (transactional_id) DO "
                "UPDATE SET producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch, "
                "timeout_ms = excluded.timeout_ms, state = excluded.state, partitions = excluded.partitions, "
                "groups_json = excluded.groups_json, offsets = excluded.offsets, started_ms = excluded.started_ms, "
                "updated_ms = excluded.updated_ms", (*_row(txn), updated_ms))

    def delete(self, txn_id: str) -> None:
        """Forget a transactional id (expired: see transactions.py)."""
        with self._lock, writing(self._db):
            self._db.execute("DELETE FROM transactions WHERE transactional_id = ?", (txn_id,))


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
