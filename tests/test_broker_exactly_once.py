"""Exactly once through librdkafka's consume-transform-produce loop (a read_committed consumer, a
transactional producer, send_offsets_to_transaction) while the broker is killed with -9 ROUNDS times:
every input record appears in the output exactly once, read_committed.

The producer keeps its brokers when they are all unreachable (metadata.recovery.strategy=none): with the
default, librdkafka re-bootstraps after a few seconds without a broker and decommissions the one it had
cached as the group's coordinator, and send_offsets_to_transaction then waits for good, past its timeout,
for that handle to come up (its open issues 5511 and 5456), whatever the broker.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from txnkit import INPUT_RECORDS, ROUNDS, assert_each_input_once, through_kills

pytestmark = pytest.mark.slow

#: Records a transaction takes from the input at most.
PER_TXN = 2_000
CALL_S = 60.0


class Pipeline(threading.Thread):
    """Reads ``source``, writes each value with an "out-" prefix into ``sink``, in transactions that also
    commit the consumer's offsets; after a failure it aborts (or starts a new producer) and goes back to the
    group's committed offsets."""

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


def test_consume_transform_produce_writes_each_input_once_across_kill9(tmp_path: Path) -> None:
    values, pipeline = through_kills(tmp_path / "data", lambda bootstrap: Pipeline(bootstrap, "in", "out"))
    assert_each_input_once(values)
    print(f"{INPUT_RECORDS} inputs through {ROUNDS} kills of the broker: each once; the pipeline went back "
          f"{pipeline.restarts} times")
