"""The console producer and consumer: records from lines into a topic, and from a topic into lines.

librdkafka does the Kafka work (batching, idempotence, the group protocol); this module decides what is
sent and where a read starts, and counts what happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stratalog.admin.connect import REQUEST_TIMEOUT_S, AdminError, describe_error
from stratalog.admin.record_format import Record
from stratalog.admin.topics import topic_metadata

#: How long the producer may take to have everything acknowledged at the end: librdkafka's own default
#: message timeout (delivery.timeout.ms) is 300 s; a healthy broker needs milliseconds.
FLUSH_S_MAX = 300.0
#: Records handed to librdkafka before its queue is served (callbacks, sends): keeps its queue, and memory,
#: bounded whatever the input's length.
POLL_EVERY = 1000
#: Delivery errors kept word for word: the first few name the cause; the count says how many failed.
ERRORS_KEPT = 10
#: Errors a consumer without a group passes over: librdkafka wants a group id even to assign partitions,
#: and looks up that group's coordinator, which a principal with topic ACLs alone may not describe.
IGNORED_UNGROUPED = ("GROUP_AUTHORIZATION_FAILED",)
#: One consumer poll: short, so that Ctrl-C and the idle timeout are noticed promptly.
POLL_S = 0.2


@dataclass
class Produced:
    """What a produce run did: records handed over, acknowledged, and the errors of those that failed."""

    sent: int = 0
    acknowledged: int = 0
    errors: list[str] = field(default_factory=list)
    partitions: set[int] = field(default_factory=set)

    def delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            if len(self.errors) < ERRORS_KEPT:
                self.errors.append(f"{error.name()}: {error.str()}")
            return
        self.acknowledged += 1
        self.partitions.add(message.partition())

    @property
    def failed(self) -> int:
        return self.sent - self.acknowledged


def produce(settings: Mapping[str, str], topic: str, records: Iterable[Record], partition: int | None = None,
            headers: tuple[tuple[str, bytes | None], ...] = (), progress: Callable[[int], None] | None = None
            ) -> Produced:
    """Produce every record, acks=all and idempotent, and wait until each is acknowledged or failed.

    ``partition`` (or a record's own) picks the partition, otherwise the key's hash does; ``headers`` are
    added to every record. ``progress`` is told of each record handed over."""
    from confluent_kafka import Producer

    producer = Producer({"linger.ms": 5, **settings, "acks": "all", "enable.idempotence": True})
    try:
        return _produce_all(producer, topic, records, partition, headers, progress)
    finally:
        producer.close()


def _produce_all(producer: Any, topic: str, records: Iterable[Record], partition: int | None,
                 headers: tuple[tuple[str, bytes | None], ...], progress: Callable[[int], None] | None) -> Produced:
    from confluent_kafka import KafkaException

    outcome = Produced()
    for record in records:
        options: dict[str, Any] = {"value": record.value, "key": record.key, "on_delivery": outcome.delivered}
        chosen = record.partition if record.partition is not None else partition
        if chosen is not None:
            options["partition"] = chosen
        if record.timestamp_ms is not None:
            options["timestamp"] = record.timestamp_ms
        if headers or record.headers:
            options["headers"] = list(headers + record.headers)
        while True:
            try:
                producer.produce(topic, **options)
                break
            except BufferError:     # librdkafka's queue is full: let it send, then hand over again
                producer.poll(POLL_S)
            except KafkaException as e:
                raise AdminError(f"produce to {topic}: {describe_error(e)}") from None
        outcome.sent += 1
        if progress is not None:
            progress(1)
        if outcome.sent % POLL_EVERY == 0:
            producer.poll(0)
    left = producer.flush(FLUSH_S_MAX)
    if left:
        outcome.errors.append(f"{left} records not acknowledged within {FLUSH_S_MAX:g} s")
    return outcome


@dataclass(frozen=True)
class Start:
    """Where a consumer starts reading each partition: the beginning, the end, an offset, or a time."""

    beginning: bool = False
    offset: int | None = None
    timestamp_ms: int | None = None


def consume(settings: Mapping[str, str], topic: str, on_record: Callable[[Record], None], start: Start = Start(),
            group: str | None = None, partition: int | None = None, max_records: int | None = None,
            idle_s: float | None = None) -> int:
    """Read ``topic`` and call ``on_record`` for each record, until ``max_records`` were read or no record
    came for ``idle_s``; the count read.

    Without ``group`` the consumer takes every partition (or ``partition``) and commits nothing; with one it
    joins the group, starts where the group committed (``start`` applies to partitions without a commit:
    the beginning or the end) and commits what it read."""
    from confluent_kafka import Consumer, KafkaException

    config: dict[str, Any] = {**settings, "enable.partition.eof": False,
                              "auto.offset.reset": "earliest" if start.beginning else "latest"}
    if group is not None:
        config["group.id"] = group
    else:   # librdkafka wants a group id even to assign; this one never commits, nor joins
        config.update({"group.id": "stratalog-console", "enable.auto.commit": False})
    consumer = Consumer(config)
    assigned = [group is None]   # a group member's idle time counts from its first assignment

    def on_assign(_consumer: Any, _partitions: Any) -> None:
        assigned[0] = True

    try:
        if group is not None:
            consumer.subscribe([topic], on_assign=on_assign)
        else:
            consumer.assign(_assignment(consumer, topic, start, partition))
        return _read(consumer, on_record, max_records, idle_s, lambda: assigned[0], ignored=IGNORED_UNGROUPED
                     if group is None else ())
    except KafkaException as e:
        raise AdminError(f"consume {topic}: {describe_error(e)}") from None
    finally:
        consumer.close()


def _assignment(consumer: Any, topic: str, start: Start, partition: int | None) -> list[Any]:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

    metadata = topic_metadata(consumer, topic)
    numbers = sorted(metadata.partitions)
    if partition is not None:
        if partition not in metadata.partitions:
            raise AdminError(f"topic {topic} has no partition {partition} (it has {len(numbers)})")
        numbers = [partition]
    if start.timestamp_ms is not None:
        wanted = [TopicPartition(topic, p, start.timestamp_ms) for p in numbers]
        found = consumer.offsets_for_times(wanted, timeout=REQUEST_TIMEOUT_S)
        # -1: no record that late in the partition; read from its end.
        return [TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END) for tp in found]
    if start.offset is not None:
        return [TopicPartition(topic, p, start.offset) for p in numbers]
    return [TopicPartition(topic, p, OFFSET_BEGINNING if start.beginning else OFFSET_END) for p in numbers]


def _read(consumer: Any, on_record: Callable[[Record], None], max_records: int | None, idle_s: float | None,
          assigned: Callable[[], bool], ignored: tuple[str, ...] = ()) -> int:
    from confluent_kafka import KafkaException

    read = 0
    last = time.monotonic()
    while max_records is None or read < max_records:
        message = consumer.poll(POLL_S)
        if message is None:
            if not assigned():
                last = time.monotonic()
            elif idle_s is not None and time.monotonic() - last > idle_s:
                break
            continue
        if message.error() is not None:
            if message.error().name() in ignored:
                continue
            raise KafkaException(message.error())
        last = time.monotonic()
        _, timestamp = message.timestamp()
        on_record(Record(value=message.value(), key=message.key(), headers=tuple(message.headers() or ()),
                         partition=message.partition(), timestamp_ms=timestamp if timestamp >= 0 else None,
                         topic=message.topic(), offset=message.offset()))
        read += 1
    return read
