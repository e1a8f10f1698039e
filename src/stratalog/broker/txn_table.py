"""The transaction coordinator's durable state: each transactional id's last state (broker/txn_state.py's
``Txn``), in ``transactions.sqlite`` or the cluster's PostgreSQL (metadata_db.py). Every change is
committed (SQLite synchronous=FULL, or a PostgreSQL commit) before the request that made it is answered.
Each partition's aborted ranges are its leader's (producer_recovery.py). Spec: docs/formats/transactions.md.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence

from kio.schema.errors import ErrorCode

from stratalog.broker.metadata_db import Location, open_metadata
from stratalog.broker.txn_state import OPEN_STATES, PendingOffset, Txn, TxnPartition, TxnState, on_offset_commit
from stratalog.engine.metadata_backends import Backend, writing

#: The columns a transaction's row is read with (``_txn`` and its update time).
_COLUMNS = ("transactional_id, producer_id, producer_epoch, timeout_ms, state, partitions, groups_json, offsets, "
            "started_ms, updated_ms")
#: States after which the offsets kept for a transaction elsewhere are stored or dropped.
ENDED_STATES = frozenset((TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT))
#: OPEN_STATES as stored, and their placeholders in a query.
_OPEN_VALUES = tuple(sorted(s.value for s in OPEN_STATES))
_OPEN_MARKS = ", ".join("?" * len(_OPEN_VALUES))

SCHEMA = """
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY, producer_id INTEGER NOT NULL, producer_epoch INTEGER NOT NULL,
    timeout_ms INTEGER NOT NULL, state TEXT NOT NULL, partitions TEXT NOT NULL, groups_json TEXT NOT NULL,
    offsets TEXT NOT NULL, started_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS txn_offsets (
    transactional_id TEXT NOT NULL, producer_id INTEGER NOT NULL, producer_epoch INTEGER NOT NULL,
    group_id TEXT NOT NULL, topic TEXT NOT NULL, partition_index INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL, leader_epoch INTEGER NOT NULL, metadata TEXT,
    PRIMARY KEY (transactional_id, group_id, topic, partition_index)
);
"""


class TxnTable:
    """Transactional ids' states. Thread-safe; every write is durable when it returns."""

    def __init__(self, location: Location) -> None:
        self._lock = threading.Lock()
        self._db = open_metadata(location, SCHEMA)
        #: A broker of a cluster: what a change of an id's state checks in its transaction (Cluster.txn_fence:
        #: that this broker still coordinates the id), so a coordinator that lost it changes nothing.
        self.fence: Callable[[Backend, str], None] | None = None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def load(self) -> list[tuple[Txn, int]]:
        """Every transactional id's state, with when it last changed (ms)."""
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM transactions").fetchall()
        return [(_txn(row[:-1]), int(row[-1])) for row in rows]

    def load_one(self, txn_id: str) -> tuple[Txn, int] | None:
        """One transactional id's state and when it last changed, or None (a broker of a cluster loads the ids
        it coordinates as it gets them)."""
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM transactions WHERE transactional_id = ?",
                                   (txn_id,)).fetchone()
        return None if row is None else (_txn(row[:-1]), int(row[-1]))

    def save(self, txn: Txn, updated_ms: int) -> None:
        """Store ``txn``; once it is complete, the offsets other brokers kept for it go."""
        with self._lock, writing(self._db):
            if self.fence is not None:
                self.fence(self._db, txn.transactional_id)
            if txn.state in ENDED_STATES:
                self._db.execute("DELETE FROM txn_offsets WHERE transactional_id = ?", (txn.transactional_id,))
            self._db.execute(
                "INSERT INTO transactions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (transactional_id) DO "
                "UPDATE SET producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch, "
                "timeout_ms = excluded.timeout_ms, state = excluded.state, partitions = excluded.partitions, "
                "groups_json = excluded.groups_json, offsets = excluded.offsets, started_ms = excluded.started_ms, "
                "updated_ms = excluded.updated_ms", (*_row(txn), updated_ms))

    def delete(self, txn_id: str) -> None:
        """Forget a transactional id (expired: see transactions.py)."""
        with self._lock, writing(self._db):
            if self.fence is not None:
                self.fence(self._db, txn_id)
            self._db.execute("DELETE FROM transactions WHERE transactional_id = ?", (txn_id,))

    # Offsets kept by another broker ----------------------------------------------------------------------

    def offset_commit_elsewhere(self, txn_id: str, producer_id: int, producer_epoch: int, group_id: str,
                                offsets: Sequence[PendingOffset]) -> ErrorCode:
        """TxnOffsetCommit at a group's coordinator that does not coordinate the transaction (a cluster): the
        transaction's state, read and locked (FOR SHARE: its coordinator's next change waits) in the same
        database transaction, must take them (txn_state.on_offset_commit); they are kept beside it for its
        coordinator to store on commit."""
        with self._lock, writing(self._db):
            row = self._db.execute(f"SELECT {_COLUMNS} FROM transactions WHERE transactional_id = ? FOR SHARE",
                                   (txn_id,)).fetchone()
            outcome = on_offset_commit(None if row is None else _txn(row[:-1]), producer_id, producer_epoch,
                                       group_id, tuple(offsets))
            if outcome.error:
                return outcome.error
            self._db.executemany(
                "INSERT INTO txn_offsets VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (transactional_id, group_id, "
                "topic, partition_index) DO UPDATE SET producer_id = excluded.producer_id, producer_epoch = "
                "excluded.producer_epoch, committed_offset = excluded.committed_offset, leader_epoch = "
                "excluded.leader_epoch, metadata = excluded.metadata",
                [(txn_id, producer_id, producer_epoch, o.group_id, o.topic, o.partition, o.offset, o.leader_epoch,
                  o.metadata) for o in offsets])
        return ErrorCode.none

    def offsets_elsewhere(self, txn: Txn) -> tuple[PendingOffset, ...]:
        """The offsets other brokers kept for ``txn``'s transaction (its producer and epoch)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT group_id, topic, partition_index, committed_offset, leader_epoch, metadata FROM txn_offsets "
                "WHERE transactional_id = ? AND producer_id = ? AND producer_epoch = ?",
                (txn.transactional_id, txn.producer_id, txn.producer_epoch)).fetchall()
        return tuple(PendingOffset(str(g), str(t), int(p), int(o), int(e), m) for g, t, p, o, e, m in rows)

    def pending_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """The (topic, partition) pairs of ``group_id`` that a transaction not ended yet has offsets for
        (taken by TxnOffsetCommit; the group's only if it commits): Kafka's unstable offsets (KIP-447),
        kept with the transaction's row or, taken by another broker, beside it."""
        with self._lock:
            rows = self._db.execute(f"SELECT offsets FROM transactions WHERE state IN ({_OPEN_MARKS})",
                                    _OPEN_VALUES).fetchall()
            kept = self._db.execute("SELECT topic, partition_index FROM txn_offsets WHERE group_id = ?",
                                    (group_id,)).fetchall()
        pending = {(str(topic), int(partition)) for topic, partition in kept}
        for (offsets,) in rows:
            pending.update((o[1], int(o[2])) for o in json.loads(str(offsets)) if o[0] == group_id)
        return pending


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
