"""KafkaJS's transactions (npm's kafkajs, tests/kafkajs/) against a real broker, through KafkaJS's own API:
``producer.transaction()``, ``send`` to several topics and partitions, ``sendOffsets``, ``commit`` and
``abort``, read back by KafkaJS consumers with ``readUncommitted: false`` (read_committed) and ``true``.

KafkaJS 2.2.4 speaks the transaction APIs at v0-1 (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, EndTxn) and knows no PRODUCER_FENCED: a fenced producer is told INVALID_PRODUCER_EPOCH, as
Kafka tells clients of those versions (KIP-588), and KafkaJS raises it as its protocol error of that type.
Its read_committed consumer drops aborted records itself, from the aborted transactions the broker lists in
each Fetch answer, so what it reads holds the broker to that list. test_broker_transactions.py holds the
same behaviour through librdkafka and kafka-python.

tests/kafkajs/transactions.js runs once per module (kafkajs_kit.py installs kafkajs and runs it) and prints
what it saw as one JSON document; the tests below assert on it, and read the same topics and the group's
offsets through librdkafka too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from appkit import refused_requests
from brokerkit import BrokerProcess, running_broker
from kafkajs_kit import installed, run_script
from txnkit import read_to_end

pytestmark = pytest.mark.slow

#: The script takes about ten seconds; this only keeps a hang from stalling the run (each of its consumers
#: gives up at 60 s, and it runs three).
SCRIPT_TIMEOUT_S = 300
WAIT_S = 60.0
#: transactions.js's ROUNDS, INPUTS and INPUT_ABORTED.
ROUNDS = [("committed-1", "commit"), ("aborted", "abort"), ("committed-2", "commit")]
INPUTS = ["in0", "in1", "in2", "in3"]
INPUT_ABORTED = "in1"
#: What KafkaJS raises for every request of a fenced producer (the broker's answer at v0-1 and to Produce).
FENCED = {"name": "KafkaJSProtocolError", "type": "INVALID_PRODUCER_EPOCH", "code": 47, "retriable": False}

Values = dict[tuple[str, int], list[str]]


@pytest.fixture(scope="module")
def kafkajs(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return installed(pytestconfig, tmp_path_factory)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("kafkajs-txn") / "data") as process:
        yield process
        assert process.stop() == 0, "".join(process.output)


@pytest.fixture(scope="module")
def seen(kafkajs: Path, broker: BrokerProcess) -> dict[str, Any]:
    """What transactions.js saw: one run of every step, against the module's broker."""
    return run_script(kafkajs, "transactions.js", broker, f"kjs-{uuid.uuid4().hex[:8]}",
                      timeout_s=SCRIPT_TIMEOUT_S)


def by_partition(read: list[dict[str, Any]]) -> Values:
    """The values a consumer read, per topic and partition, in offset order."""
    found: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for record in read:
        found.setdefault((record["topic"], record["partition"]), []).append((int(record["offset"]),
                                                                             record["value"]))
    return {key: [value for _, value in sorted(records)] for key, records in found.items()}


def rounds_of(seen: dict[str, Any], ends: tuple[str, ...]) -> Values:
    """The values the first writer's rounds that ended in one of ``ends`` wrote, per topic and partition."""
    a, b = seen["topics"]["a"], seen["topics"]["b"]
    rounds = [name for name, end in ROUNDS if end in ends]
    return {(a, 0): [f"{r}-a0" for r in rounds], (a, 1): [f"{r}-a1" for r in rounds],
            (b, 0): [f"{r}-b0" for r in rounds]}


def outputs(seen: dict[str, Any], aborted: bool) -> Values:
    """What the consume-transform-produce loop wrote, with the aborted try's output or without."""
    values = []
    for value in INPUTS:
        if aborted and value == INPUT_ABORTED:
            values.append(f"{value}-out-aborted")
        values.append(f"{value}-out")
    return {(seen["topics"]["output"], 0): values}


def test_every_transactional_send_is_acknowledged_and_every_transaction_ends(seen: dict[str, Any]) -> None:
    a, b = seen["topics"]["a"], seen["topics"]["b"]
    sent = [{"topicName": a, "partition": 0, "errorCode": 0}, {"topicName": a, "partition": 1, "errorCode": 0},
            {"topicName": b, "partition": 0, "errorCode": 0}]
    assert seen["rounds"] == [{"round": name, "end": end, "sent": sent, "active": False} for name, end in ROUNDS]


def test_read_committed_sees_the_committed_records_and_none_of_the_aborted(seen: dict[str, Any]) -> None:
    read, missing = by_partition(seen["readCommitted"]), seen["readCommittedMissing"]
    assert {key: read.get(key) for key in rounds_of(seen, ("commit",))} == rounds_of(seen, ("commit",)), missing
    assert {key: read.get(key) for key in outputs(seen, aborted=False)} == outputs(seen, aborted=False), missing


def test_read_uncommitted_sees_the_aborted_records_too(seen: dict[str, Any]) -> None:
    read, missing = by_partition(seen["readUncommitted"]), seen["readUncommittedMissing"]
    everything = rounds_of(seen, ("commit", "abort"))
    assert {key: read.get(key) for key in everything} == everything, missing
    assert {key: read.get(key) for key in outputs(seen, aborted=True)} == outputs(seen, aborted=True), missing


def test_librdkafka_reads_what_kafkajs_read(seen: dict[str, Any], broker: BrokerProcess) -> None:
    for isolation, read in (("read_committed", seen["readCommitted"]), ("read_uncommitted", seen["readUncommitted"])):
        kafkajs_values = by_partition(read)
        for topic in seen["topics"]["a"], seen["topics"]["b"], seen["topics"]["output"], seen["topics"]["zombie"]:
            expected = sorted(v for (t, _), values in kafkajs_values.items() if t == topic for v in values)
            assert sorted(v.decode() for v in read_to_end(broker.bootstrap, topic, isolation)) == expected, \
                (topic, isolation)


def test_offsets_sent_in_a_transaction_appear_only_once_it_commits(seen: dict[str, Any]) -> None:
    assert seen["ctpBefore"] == [{"partition": 0, "offset": "-1"}]
    committed = -1
    tries = []
    for step in seen["ctp"]:
        tries.append((step["input"], step["end"]))
        at = [{"partition": 0, "offset": str(committed)}]
        assert step["pending"] == at, f"{step['input']}'s offset {step['sentOffset']} showed before its end"
        if step["end"] == "commit":
            committed = int(step["sentOffset"])
        assert step["ended"] == [{"partition": 0, "offset": str(committed)}], step
    assert tries == [("in0", "commit"), ("in1", "abort"), ("in1", "commit"), ("in2", "commit"), ("in3", "commit")]
    assert seen["ctpAfter"] == [{"partition": 0, "offset": str(len(INPUTS))}]


def test_the_groups_offset_is_the_last_committed_one_for_librdkafka_too(seen: dict[str, Any],
                                                                      broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    asked = ConsumerGroupTopicPartitions(seen["ctpGroup"], [TopicPartition(seen["topics"]["input"], 0)])
    answer = admin.list_consumer_group_offsets([asked])[seen["ctpGroup"]].result(WAIT_S)
    assert [(p.partition, p.offset) for p in answer.topic_partitions] == [(0, len(INPUTS))]


def test_a_second_producer_of_the_id_fences_the_first(seen: dict[str, Any]) -> None:
    zombie = seen["topics"]["zombie"]
    assert seen["beforeFence"] == [{"topicName": zombie, "partition": 0, "errorCode": 0}]
    for step in ("fencedSend", "fencedAddPartition", "fencedCommit"):
        fenced = seen[step]
        assert fenced is not None, f"{step} succeeded after the second producer's init"
        assert {key: fenced[key] for key in FENCED} == FENCED, (step, fenced)
    assert seen["afterFence"] == [{"topicName": zombie, "partition": 0, "errorCode": 0},
                                  {"topicName": zombie, "partition": 1, "errorCode": 0}]


def test_nothing_the_fenced_producer_sent_is_visible_read_committed(seen: dict[str, Any]) -> None:
    zombie = seen["topics"]["zombie"]
    committed, uncommitted = by_partition(seen["readCommitted"]), by_partition(seen["readUncommitted"])
    assert {p: committed.get((zombie, p)) for p in (0, 1)} == {0: ["second-p0"], 1: ["second-p1"]}
    # What it sent before the fence was stored and aborted by the second's init; what it sent after was refused.
    assert {p: uncommitted.get((zombie, p)) for p in (0, 1)} == {0: ["first-before-fence", "second-p0"],
                                                                 1: ["second-p1"]}


def test_kafkajs_asks_for_nothing_the_broker_does_not_serve(seen: dict[str, Any], broker: BrokerProcess) -> None:
    assert "readUncommitted" in seen
    refused = refused_requests(broker)
    assert not refused, f"KafkaJS asked for what the broker does not serve: {refused}"
