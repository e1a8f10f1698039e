"""Transactions in a cluster of three brokers (`stratalog serve --cluster`): a transactional id's coordinator
is the broker that holds it, its markers reach partitions led by the other two through the database
(broker/txn_marker_queue.py), each partition's leader answers read_committed from its own state, and offsets
committed in a transaction at the group's coordinator are stored when the transaction commits, wherever
the transaction's coordinator runs. librdkafka's consume-transform-produce loop stays exact while brokers
are killed with -9 and restarted, coordinators and leaders moving each time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.types import TransactionalId

from clusterkit import NOT_COORDINATOR, running_cluster, tails
from conftest import SeaweedS3
from stratalog.chaos.cluster_process import CLUSTER_TOML, BrokerCluster
from stratalog.kafka.api_keys import ApiKey
from txnkit import RdkafkaPipeline, assert_each_input_once, group_done, read_to_end
from waiting import wait_until

pytestmark = pytest.mark.slow
pytest_plugins = ["pgkit"]

TOPIC = "ledger"
#: Two per broker: every transaction writes into partitions led by all three.
PARTITIONS = 6
CALL_S = 60.0
#: The coordinator aborts a lapsed transaction within this of its timeout (the tests' brokers look often).
TXN_TOML = "transaction_abort_interval_ms = 200\n" + CLUSTER_TOML
#: How long a read_committed consumer is let ask for an offset a transaction under way holds (it is
#: told UNSTABLE_OFFSET_COMMIT until the transaction ends, so its call runs out of time).
UNSTABLE_WAIT_S = 3.0


def transactional(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    producer.init_transactions(CALL_S)
    return producer


def write(producer: Producer, tag: str, commit: bool) -> None:
    """One transaction: a record ``<tag>-<p>`` into every partition, committed or aborted."""
    producer.begin_transaction()
    for p in range(PARTITIONS):
        producer.produce(TOPIC, f"{tag}-{p}".encode(), partition=p)
    producer.flush(CALL_S)
    if commit:
        producer.commit_transaction(CALL_S)
    else:
        producer.abort_transaction(CALL_S)


def by_partition(bootstrap: str, isolation: str) -> dict[int, list[str]]:
    values: dict[int, list[str]] = {}
    for value in read_to_end(bootstrap, TOPIC, isolation):
        text = value.decode()
        values.setdefault(int(text.rsplit("-", 1)[1]), []).append(text.rsplit("-", 1)[0])
    return values


def test_transactions_span_the_brokers_and_read_committed_sees_only_commits(
        tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> None:
    with running_cluster(tmp_path, pg_database, seaweedfs, 3, TXN_TOML) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1), NewTopic("in", 1, 1)])[TOPIC].result(timeout=CALL_S)
        producer = transactional(cluster.bootstrap(1, 2, 3), "across")
        try:
            write(producer, "a", commit=True)
            write(producer, "b", commit=False)
            write(producer, "c", commit=True)
        except KafkaException as e:
            raise AssertionError(f"{e}\n{tails(cluster)}") from e
        committed = by_partition(cluster.bootstrap(2), "read_committed")
        assert committed == {p: ["a", "c"] for p in range(PARTITIONS)}, tails(cluster)
        assert by_partition(cluster.bootstrap(3), "read_uncommitted") == {p: ["a", "b", "c"] for p in range(PARTITIONS)}

        # Offsets in a transaction: stored at its commit, whichever broker coordinates the group.
        group = "copier"
        producer.begin_transaction()
        producer.produce(TOPIC, b"d-0", partition=0)
        metadata = Consumer({"bootstrap.servers": cluster.bootstrap(1), "group.id": group})   # read_committed
        uncommitted = Consumer({"bootstrap.servers": cluster.bootstrap(1), "group.id": group,
                                "isolation.level": "read_uncommitted"})
        try:
            producer.send_offsets_to_transaction([TopicPartition("in", 0, 17)], metadata.consumer_group_metadata(),
                                                 CALL_S)
            # Until the transaction ends, its offset is unstable to a read_committed consumer (KIP-447): it asks
            # again until its call runs out of time. A read_uncommitted one is told what is stored: nothing yet.
            with pytest.raises(KafkaException) as waited:
                metadata.committed([TopicPartition("in", 0)], UNSTABLE_WAIT_S)
            assert waited.value.args[0].code() == KafkaError._TIMED_OUT, waited.value
            assert uncommitted.committed([TopicPartition("in", 0)], CALL_S)[0].offset < 0, "not before the commit"
            producer.commit_transaction(CALL_S)
            assert metadata.committed([TopicPartition("in", 0)], CALL_S)[0].offset == 17
        finally:
            metadata.close()
            uncommitted.close()

        # A second producer of the id fences the first, wherever it is coordinated.
        zombie = producer
        successor = transactional(cluster.bootstrap(3), "across")
        zombie.begin_transaction()
        zombie.produce(TOPIC, b"z-1", partition=1)
        with pytest.raises(KafkaException) as fenced:
            zombie.commit_transaction(CALL_S)
        assert fenced.value.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                               KafkaError.INVALID_PRODUCER_EPOCH)
        del fenced
        write(successor, "e", commit=True)
        wait_until(lambda: by_partition(cluster.bootstrap(1), "read_committed")[1] == ["a", "c", "e"],
                   lambda: f"the fenced producer's record never read:\n{tails(cluster)}")

        # The admin APIs answer at the id's coordinator; the others send the client there.
        states = {b: describe_transaction(cluster, b, "across") for b in (1, 2, 3)}
        coordinators = [b for b, (error, _) in states.items() if error == 0]
        assert len(coordinators) == 1, states
        assert all(error == NOT_COORDINATOR for b, (error, _) in states.items() if b not in coordinators), states
        assert states[coordinators[0]][1] == "CompleteCommit"


def describe_transaction(cluster: BrokerCluster, broker_id: int, txn_id: str) -> tuple[int, str]:
    """DescribeTransactions of one id at one broker: (error code, state)."""
    with cluster.connect(broker_id) as connection:
        response: Any = connection.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, DescribeTransactionsRequest(
            transactional_ids=(TransactionalId(txn_id),)))
    state = response.transaction_states[0]
    return int(state.error_code), state.transaction_state


#: Inputs of the loop through kills, and the kills: each broker killed twice, in turn.
LOOP_INPUTS = 20_000
LOOP_KILLS = 6
#: Bound on each stage of the loop (only against a hang: failover takes seconds).
STAGE_S = 600.0


def test_consume_transform_produce_is_exact_while_brokers_are_killed(
        tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> None:
    with running_cluster(tmp_path, pg_database, seaweedfs, 3, TXN_TOML) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
        for future in admin.create_topics([NewTopic("in", 3, 1), NewTopic("out", 3, 1)]).values():
            future.result(timeout=CALL_S)
        plain = Producer({"bootstrap.servers": cluster.bootstrap(), "enable.idempotence": True, "linger.ms": 20})
        for i in range(LOOP_INPUTS):
            plain.produce("in", b"%d" % i, partition=i % 3)
            plain.poll(0)
        assert plain.flush(CALL_S) == 0
        pipeline = RdkafkaPipeline(cluster.bootstrap(), "in", "out")
        pipeline.start()

        def wait_done(inputs: int, what: str) -> None:
            wait_until(lambda: pipeline.failure is not None or group_done(cluster.bootstrap(), pipeline.group)
                       >= inputs, lambda: f"{what}:\n{tails(cluster)}", timeout_s=STAGE_S)
            assert pipeline.failure is None, pipeline.failure

        try:
            for kill in range(LOOP_KILLS):
                wait_done(LOOP_INPUTS * (kill + 1) // (LOOP_KILLS + 2), "the loop progressing between kills")
                victim = 1 + kill % 3
                cluster.brokers[victim].kill9()
                cluster.start(victim)
            wait_done(LOOP_INPUTS, "the loop reaching the end of its input")
        finally:
            pipeline.stopping.set()
            pipeline.join(CALL_S * 3)
        assert pipeline.failure is None, pipeline.failure
        assert_each_input_once(read_to_end(cluster.bootstrap(), "out"), LOOP_INPUTS)
        print(f"{LOOP_INPUTS} inputs through {LOOP_KILLS} kills of brokers: each once; the loop went back "
              f"{pipeline.restarts} times")
