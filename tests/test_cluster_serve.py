"""`stratalog serve --cluster`: three real brokers over one PostgreSQL and one S3 bucket (SeaweedFS), all on
127.0.0.1. A topic's partitions spread over the brokers; every broker's Metadata names the live brokers
and the same leader for each partition; a broker asked for a partition it does not lead answers
NOT_LEADER_OR_FOLLOWER; every broker names the same coordinator for a group, and the others answer the
group's requests NOT_COORDINATOR; Kafka clients given any one broker produce to and consume from all."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click
import psycopg
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from brokerkit import read_partition
from clusterkit import (
    CLUSTER_TOML,
    NONE,
    NOT_COORDINATOR,
    NOT_LEADER_OR_FOLLOWER,
    BrokerCluster,
    PartitionView,
    delete_records_error,
    fetch_error,
    find_coordinator,
    heartbeat_error,
    list_offsets_error,
    metadata,
    produce_error,
    running_cluster,
)
from conftest import SeaweedS3
from stratalog.broker.cluster_node import EXIT_LEASE_LOST
from stratalog.broker.listeners import Listener
from stratalog.commands.serve import load_config, serve
from waiting import wait_until

pytest_plugins = ["pgkit"]

TOPIC, PARTITIONS = "orders", 6


def settled(cluster: BrokerCluster, topic: str, partitions: int) -> dict[int, PartitionView] | None:
    """Each partition's leader once every broker says the same and each leader answers for it."""
    views = []
    for broker_id in cluster.brokers:
        with cluster.connect(broker_id) as connection:
            _, view = metadata(connection, topic)
        views.append(view)
    first = views[0]
    if len(first) != partitions or any(v != first for v in views) or any(p.error_code for p in first.values()):
        return None
    for partition, view in first.items():
        if view.leader_id not in cluster.brokers:
            return None   # a broker the test stopped, named until the next reconcile finds it gone
        with cluster.connect(view.leader_id) as connection:
            if list_offsets_error(connection, topic, partition) != NONE:
                return None
    return first


#: Log compaction looks for work every 0.3 s, uploads happen every 0.5 s: a compacted topic is cleaned soon.
COMPACTING_TOML = "log_cleaner_interval_ms = 300\n[store]\nupload_interval_s = 0.5\n" + CLUSTER_TOML


def test_three_brokers_share_a_topic_route_clients_and_refuse_what_they_do_not_lead(
        tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> None:
    with running_cluster(tmp_path, pg_database, seaweedfs, 3, COMPACTING_TOML) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=60)

        leaders = wait_until(lambda: settled(cluster, TOPIC, PARTITIONS), "every partition served by one leader")
        assert sorted(Counter(v.leader_id for v in leaders.values()).values()) == [2, 2, 2]
        with cluster.connect(2) as connection:
            brokers, _ = metadata(connection, TOPIC)
        assert brokers == {i: ("127.0.0.1", cluster.ports[i]) for i in (1, 2, 3)}

        for partition, view in leaders.items():
            other = next(i for i in cluster.brokers if i != view.leader_id)
            with cluster.connect(other) as connection:
                assert produce_error(connection, TOPIC, partition) == NOT_LEADER_OR_FOLLOWER
                assert fetch_error(connection, TOPIC, partition) == NOT_LEADER_OR_FOLLOWER
                assert list_offsets_error(connection, TOPIC, partition) == NOT_LEADER_OR_FOLLOWER
                assert delete_records_error(connection, TOPIC, partition) == NOT_LEADER_OR_FOLLOWER
            with cluster.connect(view.leader_id) as connection:
                assert fetch_error(connection, TOPIC, partition) == NONE
                assert delete_records_error(connection, TOPIC, partition) == NONE

        answers = set()
        for broker_id in cluster.brokers:
            with cluster.connect(broker_id) as connection:
                answers.add(find_coordinator(connection, "audit"))
        assert len(answers) == 1
        error, coordinator, host, port = answers.pop()
        assert (error, host, port) == (NONE, "127.0.0.1", cluster.ports[coordinator])
        for broker_id in cluster.brokers:
            with cluster.connect(broker_id) as connection:
                expected = NOT_COORDINATOR if broker_id != coordinator else 25   # UNKNOWN_MEMBER_ID
                assert heartbeat_error(connection, "audit") == expected

        producer = Producer({"bootstrap.servers": cluster.bootstrap(3), "enable.idempotence": True})
        for partition in range(PARTITIONS):
            for i in range(10):
                producer.produce(TOPIC, value=f"{partition}:{i}".encode(), partition=partition)
        assert producer.flush(60) == 0
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap(2), "group.id": "audit",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([TOPIC])
        got: list[tuple[int, bytes]] = []

        def consumed_all() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append((message.partition(), message.value()))
            return len(got) >= PARTITIONS * 10

        wait_until(consumed_all, lambda: f"60 records consumed through the group (got {len(got)})", poll_s=0)
        consumer.commit(asynchronous=False)
        consumer.close()
        for partition in range(PARTITIONS):
            assert [v for p, v in got if p == partition] == [f"{partition}:{i}".encode() for i in range(10)]

        # A topic's retention is every partition's, whichever broker leads it and whichever is asked.
        retained = ConfigResource("topic", TOPIC, incremental_configs=[
            ConfigEntry("retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([retained])[retained].result(timeout=60)
        with psycopg.connect(pg_database) as conn:
            rows = conn.execute("SELECT name, retention_ms FROM streams WHERE name LIKE 'orders/%'").fetchall()
        assert sorted(rows) == [(f"{TOPIC}/{p}", 86_400_000) for p in range(PARTITIONS)]

        # A deleted topic's streams are deleted by their leaders, whichever broker was asked.
        admin.create_topics([NewTopic("scratch", 3, 1)])["scratch"].result(timeout=60)
        wait_until(lambda: settled(cluster, "scratch", 3), "the scratch topic served")
        elsewhere = AdminClient({"bootstrap.servers": cluster.bootstrap(2)})
        elsewhere.delete_topics(["scratch"])["scratch"].result(timeout=60)

        def scratch_left() -> tuple[int, int]:
            with psycopg.connect(pg_database) as conn:
                streams = conn.execute("SELECT count(*) FROM streams WHERE name LIKE 'scratch/%'").fetchone()
                doomed = conn.execute("SELECT count(*) FROM doomed_streams").fetchone()
            assert streams is not None and doomed is not None
            return int(streams[0]), int(doomed[0])

        wait_until(lambda: scratch_left() == (0, 0), lambda: f"the scratch streams deleted ({scratch_left()} left)")

        # A compacted topic's partitions are cleaned by their leaders: the latest value of each key is left.
        compacted = NewTopic("ledger", 3, 1, config={"cleanup.policy": "compact"})
        admin.create_topics([compacted])["ledger"].result(timeout=60)
        wait_until(lambda: settled(cluster, "ledger", 3), "the ledger topic served")
        for r in range(5):
            for k in range(30):
                producer.produce("ledger", key=f"k{k}".encode(), value=f"{r}".encode(), partition=k % 3)
        assert producer.flush(60) == 0

        def ledger() -> list[tuple[int, bytes, bytes]]:
            return [(p, m.key(), m.value()) for p in range(3)
                    for m in read_partition(cluster.bootstrap(1), "ledger", p, 0, 50)]

        wait_until(lambda: len(ledger()) == 30, lambda: f"every partition compacted ({len(ledger())} records left)")
        assert sorted(ledger()) == sorted((k % 3, f"k{k}".encode(), b"4") for k in range(30))


def test_the_cluster_table_of_the_config_is_read_and_its_bounds_checked(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('metadata = "postgresql://u:p@127.0.0.1:5432/db"\n'
                    "[cluster]\nenabled = true\nbroker_id = 4\nlease_ms = 6000\nrenew_interval_ms = 1000\n")
    config = load_config(path, listeners=(Listener.parse("127.0.0.1:19092"),))
    assert (config.cluster.broker_id, config.cluster.lease_ms, config.cluster.renew_interval_ms) == (4, 6000, 1000)

    path.write_text('metadata = "postgresql://u:p@127.0.0.1:5432/db"\n'
                    "[cluster]\nenabled = true\nlease_ms = 1000\nrenew_interval_ms = 600\n")
    with pytest.raises(click.BadParameter, match="at most half of lease_ms"):
        load_config(path, listeners=(Listener.parse("127.0.0.1:19092"),))
    path.write_text('metadata = "postgresql://u:p@127.0.0.1:5432/db"\n'
                    "[cluster]\nenabled = true\nlease_ms = 3000\nrenew_interval_ms = 750\nlease_margin_ms = 2250\n")
    with pytest.raises(click.BadParameter, match="lease_margin_ms must be at least 0 and below"):
        load_config(path, listeners=(Listener.parse("127.0.0.1:19092"),))
    path.write_text("[cluster]\nenabled = true\n")
    with pytest.raises(click.BadParameter, match="needs its metadata in PostgreSQL"):
        load_config(path, listeners=(Listener.parse("127.0.0.1:19092"),))
    path.write_text('metadata = "postgresql://u:p@127.0.0.1:5432/db"\n[cluster]\nenabled = true\n')
    with pytest.raises(click.BadParameter, match="listen on a fixed port"):
        load_config(path, listeners=(Listener.parse("127.0.0.1:0"),))
    path.write_text("[cluster]\nlease = 3000\n")
    with pytest.raises(click.BadParameter, match="unknown \\[cluster\\] settings lease"):
        load_config(path)


def test_a_clean_stop_hands_everything_over_and_a_lost_lease_stops_the_broker(
        tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> None:
    # No periodic snapshot of idempotent producers: the one the stop takes is the only one.
    config = "producer_snapshot_interval_ms = 3600000\n" + CLUSTER_TOML
    with running_cluster(tmp_path, pg_database, seaweedfs, 2, config) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
        admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(timeout=60)
        leaders = wait_until(lambda: settled(cluster, TOPIC, 2), "both partitions served")
        assert sorted(v.leader_id for v in leaders.values()) == [1, 2]
        led_by_2 = next(p for p, v in leaders.items() if v.leader_id == 2)
        producer = Producer({"bootstrap.servers": cluster.bootstrap(1), "enable.idempotence": True})
        for i in range(5):
            producer.produce(TOPIC, value=str(i).encode(), partition=led_by_2)
        assert producer.flush(60) == 0

        stopped = cluster.brokers.pop(2)
        assert stopped.stop() == 0, "".join(stopped.output)
        with psycopg.connect(pg_database) as conn:
            states = conn.execute("SELECT state FROM cluster_logs WHERE broker_id = 2").fetchall()
            snapshot = conn.execute("SELECT e.end_offset FROM producer_snapshot_ends e JOIN streams s "
                                    "ON s.stream_id = e.stream_id WHERE s.name = %s",
                                    (f"{TOPIC}/{led_by_2}",)).fetchall()
        assert states == [("clean",)]          # everything committed: no replay needed
        assert snapshot == [(5,)]              # its partition's producers, snapshotted as it left
        after = wait_until(lambda: settled(cluster, TOPIC, 2), "broker 1 leading both partitions")
        assert {v.leader_id for v in after.values()} == {1}

        # Another incarnation of broker 1's id took over its row: its next renewal finds the lease gone.
        with psycopg.connect(pg_database) as conn:
            conn.execute("UPDATE cluster_brokers SET epoch = epoch + 1 WHERE broker_id = 1")
        fenced = cluster.brokers[1]
        assert fenced.process.wait(timeout=60) == EXIT_LEASE_LOST
        fenced.close_output()
        assert any("is fenced and stops" in line for line in fenced.output), "".join(fenced.output)


@pytest.mark.parametrize(("args", "said"), [
    (["--cluster"], "--cluster needs --broker-id"),
    (["--cluster", "--broker-id", "1"], "needs --object-store"),
    (["--cluster", "--broker-id", "1", "--object-store", "s3://bucket/prefix"], "needs its metadata in PostgreSQL"),
])
def test_serve_refuses_a_cluster_broker_it_cannot_run(tmp_path: Path, args: list[str], said: str) -> None:
    result = CliRunner().invoke(serve, ["--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:19092", *args],
                                env={"STRATALOG_METADATA": ""})
    assert result.exit_code == 2, result.output
    assert said in result.output
