"""An idempotent producer's retry, sent to a partition's new leader, of a batch its old leader wrote: the
new leader answers it as the duplicate it is, with the offset the batch got the first time, and the log
holds one copy. After a kill -9 (the batch only in the dead broker's object log, its producer state in no
snapshot: the new leader has only the batches themselves to go by) and after a handoff (a snapshot taken
at the handoff, through the check that its broker still holds the partition, and the batches after it).
docs/cluster.md, "Why an idempotent record is never written twice across a failover", lists the paths to
a second copy and what closes each; these hold the first.

Raw requests, so that the test decides exactly what is sent where and when (librdkafka would hide it)."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from clusterkit import (
    LEADER_NOT_AVAILABLE,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    BrokerCluster,
    init_producer_id,
    partition_log,
    produce_batch,
    running_cluster,
    tails,
)
from conftest import SeaweedS3
from stratalog.chaos import cluster_probe
from stratalog.chaos.cluster_probe import PartitionView
from stratalog.chaos.cluster_process import CLUSTER_TOML
from stratalog.kafka.records import encode_batch
from waiting import wait_until

pytest_plugins = ["pgkit"]

TOPIC, PARTITIONS = "retried", 2
#: No periodic snapshot of producers and no upload in the test's time: what a killed broker wrote is in
#: its object log alone, and its producers' state in no snapshot.
CONFIG = "producer_snapshot_interval_ms = 3600000\n[store]\nupload_interval_s = 3600.0\n" + CLUSTER_TOML
#: A failover is the lease (3 s) and a few reconciles; a loaded 2-core machine takes several times that.
FAILOVER_S_MAX = 60.0
#: Between a client's tries while a partition has no leader that answers for it.
RETRY_S = 0.05


def batch(producer: tuple[int, int], sequence: int, partition: int) -> bytes:
    """The one-record batch a producer sends as its ``sequence``-th to ``partition``."""
    producer_id, epoch = producer
    return encode_batch([(None, f"{partition}:{sequence}".encode(), (), 1_000)], base_offset=0,
                        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


def leaders(cluster: BrokerCluster, via: int, dead: frozenset[int] = frozenset()) -> dict[int, PartitionView] | None:
    return cluster_probe.served_without(cluster, via, TOPIC, PARTITIONS, dead)


def snapshot_end(database: str, partition: int) -> int | None:
    """Where the partition's producer snapshot ends, or None without one."""
    with psycopg.connect(database) as connection:
        row = connection.execute("SELECT e.end_offset FROM producer_snapshot_ends e JOIN streams s "
                                 "ON s.stream_id = e.stream_id WHERE s.name = %s", (f"{TOPIC}/{partition}",)).fetchone()
    return None if row is None else int(row[0])


def send_until_served(cluster: BrokerCluster, broker_id: int, partition: int, data: bytes) -> tuple[int, int]:
    """Send ``data`` to ``broker_id`` as a client retries: again and again while it answers that it does not
    lead the partition yet; then its answer."""
    deadline = time.monotonic() + FAILOVER_S_MAX
    with cluster.connect(broker_id) as connection:
        while True:
            answer = produce_batch(connection, TOPIC, partition, data)
            if answer[0] not in (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE) or time.monotonic() > deadline:
                return answer
            time.sleep(RETRY_S)


@pytest.mark.slow
def test_a_retry_at_the_new_leader_of_a_batch_the_old_one_wrote_is_answered_with_its_offset_and_not_written(
        tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> None:
    with running_cluster(tmp_path, pg_database, seaweedfs, 2, CONFIG, verbose=True) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=60)
        before = wait_until(lambda: leaders(cluster, 1), "both partitions served")
        victim = before[0].leader_id
        survivor = next(b for b in cluster.brokers if b != victim)
        with cluster.connect(victim) as connection:
            producer = init_producer_id(connection)
        sent = {p: 0 for p in range(PARTITIONS)}    # the next sequence of each partition

        def send(broker_id: int, partition: int) -> tuple[int, int]:
            with cluster.connect(broker_id) as connection:
                answer = produce_batch(connection, TOPIC, partition, batch(producer, sent[partition], partition))
            sent[partition] += 1
            return answer

        assert [send(before[p].leader_id, p) for p in (0, 0, 0, 1, 1)] == [(NONE, o) for o in (0, 1, 2, 0, 1)]

        # Batch 2 of partition 0 was written and acknowledged, but say the answer never reached the client:
        # it sends the batch again, to whichever broker leads partition 0 next.
        cluster.brokers[victim].kill9()
        first = send_until_served(cluster, survivor, 0, batch(producer, 2, 0))
        assert first == (NONE, 2), f"the retry at the new leader, as soon as it answers\n{tails(cluster)}"
        assert [send_until_served(cluster, survivor, 0, batch(producer, s, 0)) for s in (1, 0)] == \
            [(NONE, 1), (NONE, 0)], "older retries, among the last five batches, answered alike"
        assert send(survivor, 0) == (NONE, 3), "the next batch is written, right after the others"

        # The victim comes back and gets a partition back by a handoff: the same again at its new leader.
        cluster.start(victim)
        handed = wait_until(lambda: (v := leaders(cluster, survivor)) and
                            sorted(x.leader_id for x in v.values()) == sorted(cluster.brokers) and v,
                            lambda: f"a partition handed back to the restarted broker\n{tails(cluster)}",
                            timeout_s=FAILOVER_S_MAX)
        (back,) = [p for p, v in handed.items() if v.leader_id == victim]
        assert snapshot_end(pg_database, back) == sent[back], \
            "the handoff snapshotted the partition's producers (its broker held it: the snapshot's check passed)"
        last = sent[back] - 1
        assert send_until_served(cluster, victim, back, batch(producer, last, back)) == (NONE, last), \
            f"the retry of partition {back}'s last batch at the broker it was handed to\n{tails(cluster)}"
        assert send(victim, back) == (NONE, last + 1)

        for p in range(PARTITIONS):
            with cluster.connect(handed[p].leader_id) as connection:
                log = partition_log(connection, TOPIC, p)
            assert log == [(s, f"{producer[0]}/{producer[1]}/{s}", f"{p}:{s}".encode()) for s in range(sent[p])], \
                f"partition {p}: each batch once, at the offset it got first"
