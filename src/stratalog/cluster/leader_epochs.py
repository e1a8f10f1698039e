"""Where each leader epoch of a partition began, in the cluster's PostgreSQL: what OffsetForLeaderEpoch
answers from across failovers (KIP-320; broker/leader_epochs.py answers it).

A partition's leader epoch goes up at every change of holder (leases.py: a takeover or a handoff). The
broker that gains the partition records, in one transaction that checks it holds the partition, the epoch
it holds it at and the offset its log ends at then, where that epoch's records begin: nothing is appended
between the change of holder and the gain (only the holder may commit, and it appends only once it
serves), and a dead holder's log is replayed before anyone may take its partitions over. Then it reads the
partition's history back and serves it from memory while it leads.

Table (PostgreSQL; created with the cluster's others)::

    cluster_leader_epochs  stream_id, leader_epoch, start_offset   (primary key: stream_id, leader_epoch)

Rows are the stream's, not the partition name's: a topic deleted and made again under the same name starts
a history of its own. A partition keeps its last :data:`EPOCHS_KEPT`; an epoch older than all of those is
answered as ending where the oldest kept begins, which is past its true end, never before it (a consumer
that read records of it finds no truncation, and there is none: a log here is never truncated). The rows
of a deleted partition's stream go with the stream.
"""

from __future__ import annotations

from stratalog.engine.metadata_backends import Backend

SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_leader_epochs (
    stream_id BIGINT NOT NULL,
    leader_epoch INTEGER NOT NULL,
    start_offset BIGINT NOT NULL,
    PRIMARY KEY (stream_id, leader_epoch)
);
"""
#: Epochs kept per partition: one per failover or handoff, so a hundred cover far more moves than a
#: consumer sleeps through, and bound the table at a hundred rows a partition.
EPOCHS_KEPT = 100


def record_epoch_start(db: Backend, kind: str, name: str, broker_id: int, broker_epoch: int, stream_id: int,
                       start_offset: int) -> tuple[tuple[int, int], ...]:
    """In a writer transaction that checked this incarnation holds partition ``name``: record that the
    epoch it holds it at begins at ``start_offset`` (kept if that epoch was recorded already: a gain tried
    again), forget epochs past the last EPOCHS_KEPT, and return the history, oldest first."""
    row = db.execute("SELECT leader_epoch FROM cluster_leaders WHERE kind = ? AND name = ? AND broker_id = ? "
                     "AND broker_epoch = ?", (kind, name, broker_id, broker_epoch)).fetchone()
    if row is None:
        raise LookupError(f"{kind} {name!r} is not held by broker {broker_id} (incarnation {broker_epoch})")
    db.execute("INSERT INTO cluster_leader_epochs VALUES (?, ?, ?) ON CONFLICT (stream_id, leader_epoch) DO NOTHING",
               (stream_id, int(row[0]), start_offset))
    rows = db.execute("SELECT leader_epoch, start_offset FROM cluster_leader_epochs WHERE stream_id = ? "
                      "ORDER BY leader_epoch DESC", (stream_id,)).fetchall()
    if len(rows) > EPOCHS_KEPT:
        db.execute("DELETE FROM cluster_leader_epochs WHERE stream_id = ? AND leader_epoch <= ?",
                   (stream_id, int(rows[EPOCHS_KEPT][0])))
    return tuple((int(epoch), int(start)) for epoch, start in reversed(rows[:EPOCHS_KEPT]))


def forget_stream(db: Backend, stream_id: int) -> None:
    """A deleted partition's stream: its history goes too."""
    db.execute("DELETE FROM cluster_leader_epochs WHERE stream_id = ?", (stream_id,))
