"""A streaming read of and a streaming write into a live broker, both in one driver, killed with SIGKILL
and restarted from their checkpoints: every acknowledged record reaches the sink once; every input row
reaches the topic once. The same against three `serve --cluster` brokers, the leader of the written topic
killed -9 mid-stream too."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import running_broker
from clusterkit import SPARK_CLUSTER_TOML, BrokerCluster, running_cluster, spark_options
from conftest import SeaweedS3
from sparkstreamkit import Inputs, Producing, assert_each_record_once, through_two_drivers
from stratalog.chaos.cluster_probe import served_without
from stratalog.chaos.cluster_process import supervised
from waiting import wait_until

pytestmark = pytest.mark.slow
pytest_plugins = ["pgkit"]

#: The topic the cluster's driver reads.
PARTITIONS = 6


def test_a_driver_killed_mid_stream_and_restarted_reads_and_writes_each_record_once(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[store]\nupload_interval_s = 0.5\n")
    inputs = Inputs(tmp_path / "input")
    with running_broker(tmp_path / "data", "--config", str(config)) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic("events", 3), NewTopic("out", 1)]).values():
            future.result(30)
        producing = Producing(broker.bootstrap, "events", 3)
        producing.start()
        producing.produce(6000)
        inputs.add(4)
        try:
            rows = through_two_drivers(tmp_path, broker.bootstrap, admin, producing, inputs)
        finally:
            producing.stop()
        assert_each_record_once(rows, broker.bootstrap, producing, inputs)
        assert broker.stop() == 0


@pytest.fixture
def cluster(tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> Iterator[BrokerCluster]:
    with running_cluster(tmp_path / "cluster", pg_database, seaweedfs, 3, SPARK_CLUSTER_TOML) as running:
        yield running


def test_against_a_cluster_a_driver_killed_with_the_leader_of_its_output_reads_and_writes_each_record_once(
        cluster: BrokerCluster, seaweedfs: SeaweedS3, tmp_path: Path) -> None:
    """The single-broker kill test's run (sparkstreamkit) against the cluster: a driver reads 6 partitions
    over three brokers into Parquet and writes JSON files into "out"; the leader of "out" is killed -9
    mid-stream (the write's commits move to its successor, the read's partitions on it fail over), then the
    driver is killed -9 and a second one goes on from the checkpoints. The brokers run under a supervisor,
    as in production: a machine paused longer than the lease fences them all, and they come back."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
    for future in admin.create_topics([NewTopic("events", PARTITIONS, 1), NewTopic("out", 1, 1)]).values():
        future.result(timeout=60)
    wait_until(partial(served_without, cluster, 1, "events", PARTITIONS), "every partition of events served")
    victim = wait_until(partial(served_without, cluster, 1, "out", 1), "out served")[0].leader_id
    given = spark_options(cluster, seaweedfs)
    credentials = {k: v for k, v in given.items() if k != "path"}
    bootstrap = cluster.bootstrap()
    inputs = Inputs(tmp_path / "input")
    producing = Producing(bootstrap, "events", PARTITIONS)
    producing.start()
    producing.produce(6000)
    inputs.add(4)

    def kill_the_leader() -> None:   # the process of the moment: a fenced broker is started again
        cluster.brokers[victim].kill9()

    with supervised(cluster) as supervision:
        try:
            rows = through_two_drivers(tmp_path, bootstrap, AdminClient({"bootstrap.servers": bootstrap}), producing,
                                       inputs, credentials, kill_the_leader)
        finally:
            producing.stop()
    assert_each_record_once(rows, bootstrap, producing, inputs)
    print(f"broker {victim} killed; fenced brokers started again: {supervision.restarted}", *supervision.failures,
          sep="\n")
