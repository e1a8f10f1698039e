"""A partition's producer snapshot is written only by the broker that holds the partition, checked in the
snapshot's own transaction. A broker paused past its lease (its partitions taken over meanwhile) wakes
with a snapshot task still due: it must not replace the rows the partition's new leader wrote. Rows from
it would describe a log the cluster no longer has (its own batches after the replay of its log, at
offsets the new leader gave to others, and an end past the batches the new leader wrote): the next
broker to gain the partition would skip those batches when it rebuilds the producers, and write a retry
of one of them a second time (docs/cluster.md, "Why an idempotent record is never written twice")."""

from __future__ import annotations

from stratalog.broker.producer_recovery import ProducerSnapshots
from stratalog.broker.producers import ProducerStates
from stratalog.broker.txn_partitions import PartitionTxns
from stratalog.cluster.assignment import Holder, Kind, Resource
from stratalog.cluster.leases import Cluster
from stratalog.engine.metadata import Metadata
from waiting import wait_until

pytest_plugins = ["pgkit"]

#: The lease of the broker the test lets lapse (it is never renewed), and of the one that must keep its own.
SHORT_LEASE_MS = 1000
LONG_LEASE_MS = 60_000
PARTITION = Resource(Kind.PARTITION, "t/0")
PRODUCER_ID = 7


def test_a_broker_that_lost_a_partition_leaves_its_producer_snapshot_to_the_new_leader(pg_database: str) -> None:
    meta = Metadata(pg_database)
    (stream,) = meta.create_streams([PARTITION.name])
    sid = stream.stream_id
    meta.close()
    old, new = Cluster(pg_database, 1, SHORT_LEASE_MS), Cluster(pg_database, 2, LONG_LEASE_MS)
    old_snapshots, new_snapshots = ProducerSnapshots(pg_database), ProducerSnapshots(pg_database)
    try:
        old.join("127.0.0.1", 9001)
        old.reconcile([PARTITION])
        old_snapshots.held = old.streams_held
        old_snapshots.save([(PRODUCER_ID, sid, 0, [(0, 0, 0)])], {sid: 1}, partitions_only=True)

        # The old leader pauses past its lease; the new one replays its log and takes the partition over.
        new.join("127.0.0.1", 9002)
        new_snapshots.held = new.streams_held
        wait_until(lambda: 1 not in new.live(), "broker 1's lease to run out")
        assert new.claim_dead_log() == Holder(1, old.epoch)
        new.finish_recovery(Holder(1, old.epoch))
        new.reconcile([PARTITION])
        assert new.holds()[PARTITION].holder == Holder(2, new.epoch)
        new_snapshots.save([(PRODUCER_ID, sid, 0, [(0, 0, 0), (1, 1, 1)])], {sid: 2}, partitions_only=True)

        # The old leader wakes: its snapshot task saves what it knew, batches written after the replay
        # included (at offsets the new leader gave to others).
        old_snapshots.save([(PRODUCER_ID, sid, 0, [(0, 0, 0), (1, 1, 1), (2, 2, 2)])], {sid: 3},
                           partitions_only=True)

        states = ProducerStates(entries_max=100)
        assert new_snapshots.load_partition(states, PartitionTxns(), sid) == 2, "the new leader's end stands"
        assert states.entries() == [(PRODUCER_ID, sid, 0, [(0, 0, 0), (1, 1, 1)])]
    finally:
        old_snapshots.close()
        new_snapshots.close()
        new.leave(clean=True)
        old.close()
        new.close()
