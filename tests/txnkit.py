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
    """Input records ``group`` has committed (its offsets of "in", summed), without joining it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = consumer.committed([TopicPartition("in", p) for p in range(PARTITIONS)], timeout=WAIT_S)
        return sum(max(tp.offset, 0) for tp in got)
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


def assert_each_input_once(values: list[bytes]) -> None:
    """"out" holds "out-<i>" for every input i, once."""
    counts = Counter(values)
    assert [v for v, c in counts.items() if c > 1] == [], "an input written twice"
    assert sorted(int(v[4:]) for v in counts) == list(range(INPUT_RECORDS)), "every input once"
