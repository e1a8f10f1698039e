"""What the transaction tests share: a topic read to its end as a consumer of one isolation level reads it,
and an exactly-once run of a client's consume-transform-produce loop while the broker is killed with -9."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import BrokerProcess, start_broker
from waiting import wait_until

WAIT_S = 60.0


def read_to_end(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    """Every value of ``topic`` from its start, as a consumer with ``isolation`` reads it (librdkafka), until
    it reaches the end of every partition: the high watermark, or the last stable offset for read_committed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "isolation.level": isolation,
                         "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, WAIT_S).topics[topic].partitions
        # From each partition's start, not the reading group's offsets: no group coordinator is asked.
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        values: list[bytes] = []
        at_end: set[int] = set()
        while len(at_end) < len(partitions):
            message = consumer.poll(WAIT_S)
            assert message is not None, f"no record nor end within {WAIT_S} s; read {len(values)}"
            if message.error():
                if message.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(message.error())
                at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            values.append(message.value())
        return values
    finally:
        consumer.close()


#: Input records of an exactly-once run, their partitions, and the kills of the broker during it.
INPUT_RECORDS = 100_000
PARTITIONS = 3
ROUNDS = 10
#: Bound on a run's stages: only against a hang (each takes seconds).
STAGE_S = 600.0


class Pipeline(Protocol):
    """A consume-transform-produce loop from "in" to "out" in a thread of its own (each test's client)."""

    group: str
    restarts: int
    failure: BaseException | None
    stopping: threading.Event

    def start(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


def group_done(bootstrap: str, group: str) -> int:
    """Input records ``group`` has committed (its offsets of "in", summed), without joining it; -1 while no
    broker can say (a cluster's group coordinator moving: NOT_COORDINATOR, which the caller asks again)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = consumer.committed([TopicPartition("in", p) for p in range(PARTITIONS)], timeout=WAIT_S)
        return sum(max(tp.offset, 0) for tp in got)
    except KafkaException as e:
        if e.args[0].retriable() or e.args[0].code() == KafkaError.NOT_COORDINATOR:
            return -1
        raise
    finally:
        consumer.close()


def through_kills(data_dir: Path, make_pipeline: Callable[[str], Pipeline]) -> tuple[list[bytes], Pipeline]:
    """A broker with INPUT_RECORDS records in "in", the pipeline run while the broker is killed with -9
    ROUNDS times (each once the group has committed more), until the group has committed every input: the
    values of "out" read back read_committed, and the pipeline."""
    broker: BrokerProcess = start_broker(data_dir)
    port = broker.port
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("in", PARTITIONS), NewTopic("out", PARTITIONS)]).values():
        future.result(WAIT_S)
    plain = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for i in range(INPUT_RECORDS):
        plain.produce("in", b"%d" % i, partition=i % PARTITIONS)
        if i % 10_000 == 0:
            plain.poll(0)
    assert plain.flush(WAIT_S) == 0
    pipeline = make_pipeline(broker.bootstrap)
    pipeline.start()
    try:
        for target in [INPUT_RECORDS * (r + 1) // (ROUNDS + 2) for r in range(ROUNDS)]:
            _wait_done(broker.bootstrap, pipeline, target, "the pipeline progressing between kills")
            broker.kill9()
            broker.close_output()
            broker = start_broker(data_dir, port=port)
        _wait_done(broker.bootstrap, pipeline, INPUT_RECORDS, "the pipeline reaching the end of its input")
    finally:
        pipeline.stopping.set()
        pipeline.join(WAIT_S * 3)
    try:
        assert pipeline.failure is None, pipeline.failure
        return read_to_end(broker.bootstrap, "out"), pipeline
    finally:
        assert broker.stop() == 0, "".join(broker.output)
        broker.close_output()


def _wait_done(bootstrap: str, pipeline: Pipeline, inputs: int, what: str) -> None:
    """Until the group committed ``inputs`` (a commit the client saw fail may have landed: its offsets say)."""
    wait_until(lambda: pipeline.failure is not None or group_done(bootstrap, pipeline.group) >= inputs, what,
               timeout_s=STAGE_S)
    assert pipeline.failure is None, pipeline.failure


def assert_each_input_once(values: list[bytes], inputs: int = INPUT_RECORDS) -> None:
    """"out" holds "out-<i>" for every input i below ``inputs``, once."""
    counts = Counter(values)
    assert [v for v, c in counts.items() if c > 1] == [], "an input written twice"
    assert sorted(int(v[4:]) for v in counts) == list(range(inputs)), "every input once"


#: Records a transaction takes from the input at most.
PER_TXN = 2_000
CALL_S = 60.0


class RdkafkaPipeline(threading.Thread):
    """librdkafka's consume-transform-produce loop: reads ``source``, writes each value with an "out-" prefix
    into ``sink``, in transactions that also commit the consumer's offsets; after a failure it aborts (or
    starts a new producer) and goes back to the group's committed offsets.

    The producer keeps its brokers when they are all unreachable (metadata.recovery.strategy=none): with the
    default, librdkafka re-bootstraps after a few seconds without a broker and decommissions the one it had
    cached as the group's coordinator, and send_offsets_to_transaction then waits for good, past its
    timeout, for that handle to come up (its open issues 5511 and 5456), whatever the broker."""

    def __init__(self, bootstrap: str, source: str, sink: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.source, self.sink = bootstrap, source, sink
        self.group, self.txn_id = f"eos-{uuid.uuid4().hex[:6]}", f"eos-tx-{uuid.uuid4().hex[:6]}"
        self.restarts = 0
        self.stopping = threading.Event()
        self.failure: BaseException | None = None

    def _producer(self) -> Producer:
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.txn_id,
                             "transaction.timeout.ms": 30_000, "linger.ms": 5,
                             "metadata.recovery.strategy": "none"})
        producer.init_transactions(CALL_S)
        return producer

    def _rewind(self, consumer: Consumer) -> None:
        """Back to the group's committed offsets: what an aborted transaction read is read again."""
        assigned = consumer.assignment()
        if not assigned:
            return
        for tp in consumer.committed(assigned, CALL_S):
            consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))

    def run(self) -> None:
        try:
            consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                                 "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                 "isolation.level": "read_committed"})
            consumer.subscribe([self.source])
            producer = self._producer()
            while not self.stopping.is_set():
                messages = [m for m in consumer.consume(PER_TXN, 1.0) if not m.error()]
                if not messages:
                    continue
                try:
                    producer.begin_transaction()
                    for m in messages:
                        producer.produce(self.sink, b"out-" + m.value(), partition=m.partition())
                    ends: dict[int, int] = {}
                    for m in messages:
                        ends[m.partition()] = max(ends.get(m.partition(), 0), m.offset() + 1)
                    producer.send_offsets_to_transaction(
                        [TopicPartition(self.source, p, o) for p, o in ends.items()],
                        consumer.consumer_group_metadata(), CALL_S)
                    producer.commit_transaction(CALL_S)
                except KafkaException as e:
                    self.restarts += 1
                    if e.args[0].txn_requires_abort():
                        try:
                            producer.abort_transaction(CALL_S)
                        except KafkaException:
                            producer = self._producer()
                    else:
                        producer = self._producer()
                    self._rewind(consumer)
            consumer.close()
        except BaseException as e:   # reported by the test
            self.failure = e
