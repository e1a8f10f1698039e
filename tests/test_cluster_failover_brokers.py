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

import functools
import itertools
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from clusterkit import (
    NONE,
    BrokerCluster,
    PartitionView,
    find_coordinator,
    list_offsets_error,
    metadata,
    running_cluster,
)
from conftest import SeaweedS3
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


#: The kafka-python producer runs in a child process (tests/kafka_python_load.py says why).
KAFKA_PYTHON_LOAD = Path(__file__).with_name("kafka_python_load.py")


class Load:
    """Two idempotent producers writing ``<producer>:<partition>:<seq>`` in rounds until stopped:
    confluent-kafka in a thread here, kafka-python in a child process."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: dict[str, set[tuple[int, int]]] = {"c": set(), "k": set()}
        self.failed: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._confluent = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                    "linger.ms": 5, "message.timeout.ms": 120_000})
        self._kafka_python = subprocess.Popen(
            [sys.executable, "-W", "ignore", str(KAFKA_PYTHON_LOAD), bootstrap, TOPIC, str(PARTITIONS), str(ROUND_S)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._threads = [threading.Thread(target=self._run_confluent, daemon=True),
                         threading.Thread(target=self._run_kafka_python, daemon=True)]
        for thread in self._threads:
            thread.start()

    def acked_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.acked.values())

    def _acked(self, producer: str, partition: int, seq: int) -> None:
        with self._lock:
            self.acked[producer].add((partition, seq))

    def _failed(self, what: str) -> None:
        with self._lock:
            self.failed.append(what)

    def _run_confluent(self) -> None:
        def delivered(error: object, message: object, partition: int, seq: int) -> None:
            if error is None:
                self._acked("c", partition, seq)
            else:
                self._failed(f"confluent {partition}:{seq}: {error}")

        for seq in itertools.count():
            if self._stop.wait(ROUND_S):
                break
            for p in range(PARTITIONS):
                self._confluent.produce(TOPIC, value=f"c:{p}:{seq}".encode(), partition=p,
                                        on_delivery=functools.partial(delivered, partition=p, seq=seq))
            self._confluent.poll(0)
        remaining = self._confluent.flush(150)
        if remaining:
            self._failed(f"confluent: {remaining} records never answered")

    def _run_kafka_python(self) -> None:
        assert self._kafka_python.stdout is not None
        for line in self._kafka_python.stdout:
            word, *rest = line.split(maxsplit=3)
            if word == "ack":
                self._acked("k", int(rest[0]), int(rest[1]))
            elif word == "fail":
                self._failed(f"kafka-python {' '.join(rest)}")
            elif word == "done":
                return
        self._failed(f"kafka-python's process ended early ({self._kafka_python.wait()})")

    def stop(self) -> None:
        self._stop.set()
        assert self._kafka_python.stdin is not None
        self._kafka_python.stdin.write("stop\n")
        self._kafka_python.stdin.close()
        for thread in self._threads:
            thread.join(timeout=300)
            assert not thread.is_alive(), "a producer did not finish"
        assert self._kafka_python.wait(timeout=60) == 0
        self._kafka_python.stdout.close()   # type: ignore[union-attr]

    def kill(self) -> None:
        """At the test's end, whatever happened: no child left behind."""
        if self._kafka_python.poll() is None:
            self._kafka_python.kill()
            self._kafka_python.wait(timeout=30)


class GroupReader:
    """One consumer of the group in a thread of its own: what it reads, committed every 100 records."""

    def __init__(self, bootstrap: str) -> None:
        self.read: list[tuple[int, int, bytes]] = []          # partition, offset, value
        self.commit_errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                                   "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                   "session.timeout.ms": 6000, "heartbeat.interval.ms": 300})
        self._consumer.subscribe([TOPIC])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        since_commit = 0
        while not self._stop.is_set():
            message = self._consumer.poll(0.2)
            if message is not None and message.error() is None:
                with self._lock:
                    self.read.append((message.partition(), message.offset(), message.value()))
                since_commit += 1
            if since_commit >= 100:
                try:
                    self._consumer.commit(asynchronous=False)
                    since_commit = 0
                except KafkaException:
                    self.commit_errors += 1   # the coordinator moved: the next try finds the new one
        self._consumer.commit(asynchronous=False)
        self._consumer.close()

    def values(self) -> set[bytes]:
        with self._lock:
            return {v for _, _, v in self.read}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the consumer did not stop"


def leaders(cluster: BrokerCluster, via: int) -> dict[int, PartitionView]:
    with cluster.connect(via) as connection:
        return metadata(connection, TOPIC)[1]


def served_without(cluster: BrokerCluster, via: int, dead: int | None) -> dict[int, PartitionView] | None:
    """Each partition's leader, once every partition has a live one (not ``dead``) that answers for it."""
    view = leaders(cluster, via)
    if len(view) != PARTITIONS or any(v.error_code or v.leader_id in (dead, -1) for v in view.values()):
        return None
    for partition, v in view.items():
        with cluster.connect(v.leader_id) as connection:
            if list_offsets_error(connection, TOPIC, partition) != NONE:
                return None
    return view


def read_log(bootstrap: str) -> dict[int, list[bytes]]:
    """Every partition read from its start to its end, outside any group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "log-reader", "enable.auto.commit": False})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in range(PARTITIONS)}
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    log: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    positions = {p: 0 for p in range(PARTITIONS)}

    def done() -> bool:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            log[message.partition()].append(message.value())
            positions[message.partition()] = message.offset() + 1
        return all(positions[p] >= ends[p] for p in range(PARTITIONS))

    wait_until(done, lambda: f"the log read to its end ({positions} of {ends})", poll_s=0)
    consumer.close()
    return log


def committed(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    found = consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=30)
    consumer.close()
    return {tp.partition: tp.offset for tp in found}


@pytest.mark.slow
def test_kill9_of_a_broker_under_load_loses_nothing_and_it_gets_partitions_back_when_it_returns(
        tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> None:
    with running_cluster(tmp_path, pg_database, seaweedfs, 3) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=60)
        before = wait_until(lambda: served_without(cluster, 1, None), "every partition served")
        assert sorted(Counter(v.leader_id for v in before.values()).values()) == [2, 2, 2]

        load = Load(cluster.bootstrap())
        try:
            reader = GroupReader(cluster.bootstrap())
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

            cluster.start(victim)   # a new incarnation of the same broker id
            rebalanced = wait_until(
                lambda: (v := served_without(cluster, survivor, None)) and sorted(
                    Counter(x.leader_id for x in v.values()).values()) == [2, 2, 2] and v,
                "the restarted broker leading partitions again", timeout_s=120)
            handed_back = sorted(p for p, v in rebalanced.items() if v.leader_id == victim)
            assert len(handed_back) == 2
            for p in handed_back:
                assert rebalanced[p].leader_epoch > after[p].leader_epoch   # moved by a handoff from a live leader
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

            log = read_log(cluster.bootstrap())
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
            assert lost == set()
            assert duplicated == {}
            assert final_commits == ends
            assert failover_s < FAILOVER_S_MAX
        finally:
            load.kill()
