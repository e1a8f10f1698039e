"""kill -9 of one broker of three under load, with real Kafka clients: idempotent producers (kafka-python
and confluent-kafka, acks=all) write to every partition of a 6-partition topic and a consumer group reads
it, while the broker that coordinates the group and leads two partitions is killed.

What must hold: its partitions are served by the others within a bounded time (measured: from the kill
until every partition has a live leader that answers for it); every acknowledged record is in the log
exactly once, each producer's records in order per partition; the group's committed offsets survive and
the consumer reads every acknowledged record; the clients carry on without being restarted. The killed
broker then comes back as a new incarnation and gets partitions back by handoffs, still under load.
"""

from __future__ import annotations

import re
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import console_address, metrics_address, scrape_metrics
from clusterkit import (
    NONE,
    BrokerCluster,
    PartitionView,
    batch_header_at,
    find_coordinator,
    running_cluster,
    tails,
)
from conftest import SeaweedS3
from stratalog.chaos import cluster_load, cluster_probe
from stratalog.chaos.broker_process import BrokerProcess
from stratalog.chaos.cluster_load import GroupReader, Load, read_log
from stratalog.chaos.cluster_process import CLUSTER_TOML
from stratalog.cluster.failover import log_owner
from stratalog.objects.uri import open_object_store
from waiting import wait_until

pytest_plugins = ["pgkit"]

TOPIC, PARTITIONS, GROUP = "payments", 6, "ledger"
#: Between rounds of one record per partition, per producer: about 2 x 6 x 50 = 600 records a second.
ROUND_S = 0.02
#: The bound asserted on failover: the lease (3 s) plus a reconcile, a replay and a restart of clients'
#: requests take a few seconds; a loaded 2-core machine may take several times that.
FAILOVER_S_MAX = 45.0
#: Records acknowledged after the kill (and after the restart) before the next step: load that goes on.
AFTER_STEP_RECORDS = 600


def served_without(cluster: BrokerCluster, via: int, dead: int | None) -> dict[int, PartitionView] | None:
    """Each partition's leader, once every partition has a live one (not ``dead``) that answers for it."""
    return cluster_probe.served_without(cluster, via, TOPIC, PARTITIONS,
                                        frozenset() if dead is None else frozenset({dead}))


def committed(bootstrap: str) -> dict[int, int]:
    return cluster_load.committed(bootstrap, TOPIC, PARTITIONS, GROUP)


@pytest.mark.slow
def test_kill9_of_a_broker_under_load_loses_nothing_and_it_gets_partitions_back_when_it_returns(
        tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> None:
    # Each broker serves /metrics too: the survivors say what the failover did.
    config = 'metrics_listen = "127.0.0.1:0"\nconsole_listen = "127.0.0.1:0"\n' + CLUSTER_TOML
    with running_cluster(tmp_path, pg_database, seaweedfs, 3, config, verbose=True) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=60)
        before = wait_until(lambda: served_without(cluster, 1, None), "every partition served")
        assert sorted(Counter(v.leader_id for v in before.values()).values()) == [2, 2, 2]

        load = Load(cluster.bootstrap(), TOPIC, PARTITIONS, ROUND_S)
        try:
            reader = GroupReader(cluster.bootstrap(), TOPIC, GROUP)
            wait_until(lambda: load.acked_count() >= AFTER_STEP_RECORDS and len(reader.read) >= 200,
                       "records acknowledged and read before the kill")
            with cluster.connect(1) as connection:
                error, victim, _, _ = find_coordinator(connection, GROUP)
            assert error == NONE
            wait_until(lambda: all(o >= 0 for o in committed(cluster.bootstrap()).values()) or None,
                       "the group's first commits", timeout_s=120)
            committed_before = committed(cluster.bootstrap())
            survivor = next(i for i in cluster.brokers if i != victim)
            victims_partitions = sorted(p for p, v in before.items() if v.leader_id == victim)

            acked_at_kill = load.acked_count()
            killed_at = time.monotonic()
            cluster.brokers[victim].kill9()
            after = wait_until(lambda: served_without(cluster, survivor, victim), "the victim's partitions served",
                               timeout_s=FAILOVER_S_MAX, poll_s=0.05)
            failover_s = time.monotonic() - killed_at
            assert sorted(Counter(v.leader_id for v in after.values()).values()) == [3, 3]
            for p in victims_partitions:
                assert after[p].leader_epoch > before[p].leader_epoch
            wait_until(lambda: load.acked_count() >= acked_at_kill + AFTER_STEP_RECORDS,
                       "acknowledgements after the failover", timeout_s=120)
            assert all(o >= committed_before[p] for p, o in committed(cluster.bootstrap(survivor)).items())
            survivors = [scrape(cluster.brokers[i]) for i in cluster.brokers if i != victim]
            assert [m["stratalog_cluster_partitions_led"] for m in survivors] == [3.0, 3.0]
            assert all(m["stratalog_cluster_lease_confirmed"] == 1 for m in survivors)
            assert sum(m["stratalog_cluster_logs_replayed_total"] for m in survivors) >= 1, "the failover counted"
            assert sum(m["stratalog_cluster_partitions_gained_total"] for m in survivors) >= 4 + 2
            wait_until(lambda: all(m["stratalog_cluster_partitions_without_leader"] == 0 and
                                   m["stratalog_cluster_live_brokers"] == 2 for m in
                                   [scrape(cluster.brokers[i]) for i in cluster.brokers if i != victim]),
                       "each survivor to see two live brokers and no partition without a leader")
            page = console_page(cluster.brokers[survivor])
            assert re.search(r"live brokers</th><td class=\"n\">2<", page) and "partitions led here" in page

            # What a broker cut off from the database may still put to its log after the log was replayed: the
            # restarted broker's first sweep deletes it.
            objects = open_object_store(cluster.objects, tmp_path / "probe")
            dead_log = f"wal/{log_owner(victim, 1)}/"     # its first incarnation (a database of this test's own)
            objects.put(dead_log + "00000000000000ff", b"put after the replay")
            cluster.start(victim)   # a new incarnation of the same broker id
            rebalanced = wait_until(
                lambda: (v := served_without(cluster, survivor, None)) and sorted(
                    Counter(x.leader_id for x in v.values()).values()) == [2, 2, 2] and v,
                lambda: f"the restarted broker leading partitions again\n{tails(cluster)}", timeout_s=120)
            handed_back = sorted(p for p, v in rebalanced.items() if v.leader_id == victim)
            assert len(handed_back) == 2
            for p in handed_back:
                assert rebalanced[p].leader_epoch > after[p].leader_epoch   # moved by a handoff from a live leader
            wait_until(lambda: not list(objects.list(dead_log)), "the late put under the replayed log swept")
            acked_at_return = load.acked_count()
            wait_until(lambda: load.acked_count() >= acked_at_return + AFTER_STEP_RECORDS,
                       "acknowledgements after the handoffs", timeout_s=120)

            load.stop()
            failed, acked = load.failed, {f"{producer}:{p}:{seq}".encode() for producer, pairs in load.acked.items()
                                          for p, seq in pairs}
            assert failed == []
            wait_until(lambda: acked <= reader.values(),
                       lambda: f"the group to read every acknowledged record ({len(acked - reader.values())} missing)",
                       timeout_s=120)
            reader.stop()

            log = read_log(cluster.bootstrap(), TOPIC, PARTITIONS)
            in_log = Counter(v for values in log.values() for v in values)
            lost = acked - set(in_log)
            duplicated = {v: n for v, n in in_log.items() if n > 1}
            for partition, values in log.items():
                for producer in ("c", "k"):
                    seqs = [int(v.split(b":")[2]) for v in values if v.startswith(producer.encode() + b":")]
                    assert seqs == sorted(seqs), f"{producer} out of order in partition {partition}"
                    assert all(v.split(b":")[1] == str(partition).encode() for v in values)
            read_counts = Counter(v for _, _, v in reader.read)
            group_duplicates = sum(n - 1 for n in read_counts.values() if n > 1)
            ends = {p: len(values) for p, values in log.items()}
            final_commits = committed(cluster.bootstrap())
            print(f"\nfailover: {failover_s:.2f} s from kill -9 of broker {victim} until all {PARTITIONS} partitions "
                  f"were served; acknowledged {len(acked)}, in the log {sum(in_log.values())} "
                  f"({len(set(in_log) - acked)} written but never acknowledged), lost {len(lost)}, duplicated in the "
                  f"log {len(duplicated)}; read by the group {len(reader.read)} ({group_duplicates} read twice), "
                  f"commit errors {reader.commit_errors}", file=sys.stderr)
            assert lost == set(), tails(cluster, 400)
            if duplicated:
                leaders = served_without(cluster, survivor, None) or {}
                where = []
                for v in duplicated:
                    for p, values in log.items():
                        for offset in (i for i, x in enumerate(values) if x == v):
                            with cluster.connect(leaders[p].leader_id if p in leaders else survivor) as c:
                                where.append(f"{v!r} in partition {p} at offset {offset}: "
                                             f"{batch_header_at(c, TOPIC, p, offset)}")
                raise AssertionError("records written twice:\n" + "\n".join(where) + "\n" + tails(cluster, 400))
            assert final_commits == ends
            assert failover_s < FAILOVER_S_MAX
        finally:
            load.kill()


def scrape(broker: BrokerProcess) -> dict[str, float]:
    """The samples without labels of a broker's /metrics, by name."""
    return {name: value for (name, labels), value in scrape_metrics(metrics_address(broker.output)).items()
            if not labels}


def console_page(broker: BrokerProcess) -> str:
    """The broker's console's first page (its cluster section among the rest)."""
    with urllib.request.urlopen(console_address(broker.output) + "/", timeout=30) as response:
        return str(response.read().decode())
