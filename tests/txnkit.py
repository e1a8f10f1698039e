"""What the transaction tests share: a topic read to its end as a consumer of one isolation level reads it."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

WAIT_S = 60.0


def read_to_end(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    """Every value of ``topic`` from its start, as a consumer with ``isolation`` reads it (librdkafka), until
    it reaches the end of every partition: the high watermark, or the last stable offset for read_committed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "isolation.level": isolation,
                         "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, WAIT_S).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p) for p in partitions])
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
