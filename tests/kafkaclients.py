"""The three Kafka client libraries behind one small synchronous interface, for tests against the broker.

kafka-python (threads), aiokafka (asyncio: every call runs on one event loop in a thread of its own, so
group heartbeats go on between calls) and confluent-kafka (librdkafka). Each adapter speaks only through
its library's public API; what differs between them (how headers, missing offsets, admin futures look)
is made the same here so the tests assert once for all three.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import aiokafka
import aiokafka.admin
import aiokafka.helpers
import confluent_kafka
import confluent_kafka.admin

from waiting import wait_until

with warnings.catch_warnings():
    # kafka-python 3.0 reads its message schemas with importlib.resources.read_text, deprecated in 3.11.
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka
    import kafka.admin
    import kafka.structs

T = TypeVar("T")
Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class Secured:
    """A broker address with how to log in: pass it wherever a bootstrap string goes."""

    address: str
    protocol: str = "SASL_SSL"  # Kafka's security.protocol
    mechanism: str | None = "SCRAM-SHA-256"
    user: str | None = None
    password: str | None = None
    #: The CA that signed the broker's certificate; a client certificate and its key, if the broker asks.
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None


Bootstrap = str | Secured


def _kafka_python(bootstrap: Bootstrap) -> dict[str, Any]:
    if isinstance(bootstrap, str):
        return {"bootstrap_servers": bootstrap}
    out: dict[str, Any] = {"bootstrap_servers": bootstrap.address, "security_protocol": bootstrap.protocol,
                           "ssl_cafile": bootstrap.cafile, "ssl_certfile": bootstrap.certfile,
                           "ssl_keyfile": bootstrap.keyfile}
    if "SASL" in bootstrap.protocol:
        out.update(sasl_mechanism=bootstrap.mechanism, sasl_plain_username=bootstrap.user,
                   sasl_plain_password=bootstrap.password)
    return out


def _aiokafka(bootstrap: Bootstrap) -> dict[str, Any]:
    if isinstance(bootstrap, str):
        return {"bootstrap_servers": bootstrap}
    out: dict[str, Any] = {"bootstrap_servers": bootstrap.address, "security_protocol": bootstrap.protocol}
    if "SSL" in bootstrap.protocol:
        out["ssl_context"] = aiokafka.helpers.create_ssl_context(
            cafile=bootstrap.cafile, certfile=bootstrap.certfile, keyfile=bootstrap.keyfile)
    if "SASL" in bootstrap.protocol:
        out.update(sasl_mechanism=bootstrap.mechanism, sasl_plain_username=bootstrap.user,
                   sasl_plain_password=bootstrap.password)
    return out

#: Well above the broker's group.min.session.timeout.ms (6 s): on a loaded machine kafka-python's
#: heartbeat thread waited longer than 6 s for the GIL, and the broker rightly dropped the member mid-test.
#: Members here leave with LeaveGroup, so no test waits for a session to run out (test_broker_groups.py
#: tests expiry with its own clock).
SESSION_TIMEOUT_MS = 30_000
#: Heartbeats this often, so a member learns of a rebalance in a fraction of a second.
HEARTBEAT_INTERVAL_MS = 300
#: The longest any single client call may take before the test fails.
CALL_TIMEOUT_S = 30.0
#: How long one poll waits for records: short, so tests can poll two consumers in turn.
POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A record to produce."""

    partition: int
    key: bytes | None
    value: bytes
    headers: Headers = ()
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Consumed:
    """A record as a consumer got it, the same whichever library got it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Headers
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class FetchBounds:
    """A consumer's fetch bounds: the records of one Fetch response, and of one partition in it."""

    response_bytes: int
    partition_bytes: int
    #: librdkafka drops a response frame over receive.message.max.bytes (which it requires to be at least
    #: fetch.max.bytes + 512): the frame's room beyond its records, partition headers and all.
    frame_slack_bytes: int = 4096


class Producer(Protocol):
    def send_all(self, records: Sequence[Outgoing], topic: str) -> list[tuple[int, int]]:
        """Produce ``records`` in order; return each one's (partition, offset) once all are acknowledged."""

    def close(self) -> None: ...


class Consumer(Protocol):
    def poll(self, timeout_s: float = POLL_S) -> list[Consumed]: ...

    def assignment(self) -> set[tuple[str, int]]: ...

    def commit(self) -> None:
        """Commit the positions after the records polled so far (synchronously)."""

    def close(self) -> None: ...


class Client(Protocol):
    name: str

    def create_topic(self, bootstrap: Bootstrap, topic: str, partitions: int) -> None: ...

    def delete_topic(self, bootstrap: Bootstrap, topic: str) -> None: ...

    def list_topics(self, bootstrap: Bootstrap) -> set[str]: ...

    def producer(self, bootstrap: Bootstrap, *, idempotent: bool = False) -> Producer: ...

    def consumer(self, bootstrap: Bootstrap, group: str, topics: Sequence[str],
                 bounds: FetchBounds | None = None) -> Consumer: ...

    def offset_for_time(self, bootstrap: Bootstrap, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The first offset at or after ``timestamp_ms``, or None when there is none."""

    def close(self) -> None: ...


def _headers(raw: Any) -> Headers:
    return tuple((str(k), None if v is None else bytes(v)) for k, v in (raw or ()))


# --- kafka-python ---------------------------------------------------------------------------------------


class KafkaPythonProducer:
    def __init__(self, bootstrap: Bootstrap, idempotent: bool) -> None:
        self._producer = kafka.KafkaProducer(**_kafka_python(bootstrap), acks="all", enable_idempotence=idempotent,
                                             request_timeout_ms=int(CALL_TIMEOUT_S * 1000))

    def send_all(self, records: Sequence[Outgoing], topic: str) -> list[tuple[int, int]]:
        futures = [self._producer.send(topic, value=r.value, key=r.key, headers=list(r.headers),
                                       partition=r.partition, timestamp_ms=r.timestamp_ms) for r in records]
        self._producer.flush(timeout=CALL_TIMEOUT_S)
        done = [f.get(timeout=CALL_TIMEOUT_S) for f in futures]
        return [(m.partition, m.offset) for m in done]

    def close(self) -> None:
        self._producer.close(timeout=CALL_TIMEOUT_S)


class KafkaPythonConsumer:
    def __init__(self, bootstrap: Bootstrap, group: str, topics: Sequence[str], bounds: FetchBounds | None) -> None:
        extra = {} if bounds is None else {"fetch_max_bytes": bounds.response_bytes,
                                           "max_partition_fetch_bytes": bounds.partition_bytes}
        self._consumer = kafka.KafkaConsumer(
            *topics, **_kafka_python(bootstrap), group_id=group, auto_offset_reset="earliest",
            enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS, **extra)

    def poll(self, timeout_s: float = POLL_S) -> list[Consumed]:
        got = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
        self._rejoin_if_assignment_was_dropped()
        return [Consumed(r.topic, r.partition, r.offset, r.key, r.value, _headers(r.headers), r.timestamp)
                for records in got.values() for r in records]

    def _rejoin_if_assignment_was_dropped(self) -> None:
        """Work around a kafka-python 3.0 consumer that would stay without partitions for good.

        When a rebalance that the leader starts itself (the topic's metadata came after its first join, so
        it assigned nothing and rejoins) outlasts a poll, the poll returns with the join task in flight;
        the leader has already recorded the new metadata as assigned, so the next poll sees nothing to
        rejoin for and never applies the SyncGroup answer the task got. The broker answered correctly
        (the debug log shows the assignment in the SyncGroup response); asking for one more rejoin
        recovers."""
        coordinator = self._consumer._coordinator
        task = coordinator._join_task
        if task is not None and task.is_done and not coordinator.need_rejoin():
            coordinator._join_task = None
            coordinator.request_rejoin()

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def commit(self) -> None:
        self._consumer.commit()

    def close(self) -> None:
        self._consumer.close()


class KafkaPythonClient:
    name = "kafka-python"

    @contextmanager
    def _admin(self, bootstrap: Bootstrap) -> Iterator[Any]:
        admin = kafka.admin.KafkaAdminClient(**_kafka_python(bootstrap))
        try:
            yield admin
        finally:
            admin.close()

    def create_topic(self, bootstrap: Bootstrap, topic: str, partitions: int) -> None:
        with self._admin(bootstrap) as admin:
            admin.create_topics([kafka.admin.NewTopic(topic, num_partitions=partitions, replication_factor=1)])

    def delete_topic(self, bootstrap: Bootstrap, topic: str) -> None:
        with self._admin(bootstrap) as admin:
            admin.delete_topics([topic])

    def list_topics(self, bootstrap: Bootstrap) -> set[str]:
        with self._admin(bootstrap) as admin:
            return set(admin.list_topics())

    def producer(self, bootstrap: Bootstrap, *, idempotent: bool = False) -> Producer:
        return KafkaPythonProducer(bootstrap, idempotent)

    def consumer(self, bootstrap: Bootstrap, group: str, topics: Sequence[str],
                 bounds: FetchBounds | None = None) -> Consumer:
        return KafkaPythonConsumer(bootstrap, group, topics, bounds)

    def offset_for_time(self, bootstrap: Bootstrap, topic: str, partition: int, timestamp_ms: int) -> int | None:
        consumer = kafka.KafkaConsumer(**_kafka_python(bootstrap))
        try:
            tp = kafka.structs.TopicPartition(topic, partition)
            found = consumer.offsets_for_times({tp: timestamp_ms})[tp]
            return None if found is None else int(found.offset)
        finally:
            consumer.close()

    def close(self) -> None:
        pass


# --- aiokafka -------------------------------------------------------------------------------------------


class LoopThread:
    """One event loop running in a daemon thread; ``run`` waits for a coroutine's result on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="aiokafka-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        self.loop.close()


class AioProducer:
    def __init__(self, loop: LoopThread, bootstrap: Bootstrap, idempotent: bool) -> None:
        self._loop = loop

        async def start() -> aiokafka.AIOKafkaProducer:
            producer = aiokafka.AIOKafkaProducer(**_aiokafka(bootstrap), acks="all",
                                                 enable_idempotence=idempotent)
            try:
                await producer.start()
            except BaseException:
                await producer.stop()  # a refused start (a failed login) leaves nothing open
                raise
            return producer

        self._producer = loop.run(start())

    def send_all(self, records: Sequence[Outgoing], topic: str) -> list[tuple[int, int]]:
        async def send() -> list[tuple[int, int]]:
            futures = [await self._producer.send(topic, value=r.value, key=r.key, partition=r.partition,
                                                 timestamp_ms=r.timestamp_ms, headers=list(r.headers))
                       for r in records]
            done = [await f for f in futures]
            return [(m.partition, m.offset) for m in done]

        return self._loop.run(send())

    def close(self) -> None:
        self._loop.run(self._producer.stop())


class AioConsumer:
    def __init__(self, loop: LoopThread, bootstrap: Bootstrap, group: str, topics: Sequence[str],
                 bounds: FetchBounds | None) -> None:
        self._loop = loop
        extra = {} if bounds is None else {"fetch_max_bytes": bounds.response_bytes,
                                           "max_partition_fetch_bytes": bounds.partition_bytes}

        async def start() -> aiokafka.AIOKafkaConsumer:
            consumer = aiokafka.AIOKafkaConsumer(
                *topics, **_aiokafka(bootstrap), group_id=group, auto_offset_reset="earliest",
                enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
                heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS, **extra)
            try:
                await consumer.start()
            except BaseException:
                await consumer.stop()
                raise
            return consumer

        self._consumer = loop.run(start())

    def poll(self, timeout_s: float = POLL_S) -> list[Consumed]:
        got = self._loop.run(self._consumer.getmany(timeout_ms=int(timeout_s * 1000)))
        return [Consumed(r.topic, r.partition, r.offset, r.key, r.value, _headers(r.headers), r.timestamp)
                for records in got.values() for r in records]

    def assignment(self) -> set[tuple[str, int]]:
        async def get() -> set[tuple[str, int]]:
            return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

        return self._loop.run(get())

    def commit(self) -> None:
        self._loop.run(self._consumer.commit())

    def close(self) -> None:
        self._loop.run(self._consumer.stop())


@dataclass
class AioKafkaClient:
    name: str = "aiokafka"
    _loop: LoopThread = field(default_factory=LoopThread)

    def _admin(self, bootstrap: Bootstrap, call: str, *args: Any) -> Any:
        async def run() -> Any:
            admin = aiokafka.admin.AIOKafkaAdminClient(**_aiokafka(bootstrap))
            try:
                await admin.start()
                return await getattr(admin, call)(*args)
            finally:
                await admin.close()

        return self._loop.run(run())

    def create_topic(self, bootstrap: Bootstrap, topic: str, partitions: int) -> None:
        response = self._admin(bootstrap, "create_topics",
                               [aiokafka.admin.NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        errors = [t[1] for t in response.topic_errors if t[1] != 0]  # (name, error_code, ...) per topic
        assert not errors, response

    def delete_topic(self, bootstrap: Bootstrap, topic: str) -> None:
        response = self._admin(bootstrap, "delete_topics", [topic])
        errors = [t[1] for t in response.topic_error_codes if t[1] != 0]
        assert not errors, response

    def list_topics(self, bootstrap: Bootstrap) -> set[str]:
        return set(self._admin(bootstrap, "list_topics"))

    def producer(self, bootstrap: Bootstrap, *, idempotent: bool = False) -> Producer:
        return AioProducer(self._loop, bootstrap, idempotent)

    def consumer(self, bootstrap: Bootstrap, group: str, topics: Sequence[str],
                 bounds: FetchBounds | None = None) -> Consumer:
        return AioConsumer(self._loop, bootstrap, group, topics, bounds)

    def offset_for_time(self, bootstrap: Bootstrap, topic: str, partition: int, timestamp_ms: int) -> int | None:
        async def run() -> int | None:
            consumer = aiokafka.AIOKafkaConsumer(**_aiokafka(bootstrap))
            await consumer.start()
            try:
                tp = aiokafka.TopicPartition(topic, partition)
                found = (await consumer.offsets_for_times({tp: timestamp_ms}))[tp]
                return None if found is None else int(found.offset)
            finally:
                await consumer.stop()

        return self._loop.run(run())

    def close(self) -> None:
        self._loop.close()


# --- confluent-kafka ------------------------------------------------------------------------------------


def _common(bootstrap: Bootstrap) -> dict[str, Any]:
    # v4: "localhost"-style names aside, librdkafka would also try ::1 first on some hosts.
    if isinstance(bootstrap, str):
        return {"bootstrap.servers": bootstrap, "broker.address.family": "v4"}
    out: dict[str, Any] = {"bootstrap.servers": bootstrap.address, "broker.address.family": "v4",
                           "security.protocol": bootstrap.protocol}
    for key, value in (("ssl.ca.location", bootstrap.cafile), ("ssl.certificate.location", bootstrap.certfile),
                       ("ssl.key.location", bootstrap.keyfile)):
        if value is not None:
            out[key] = value
    if "SASL" in bootstrap.protocol:
        out.update({"sasl.mechanisms": bootstrap.mechanism, "sasl.username": bootstrap.user,
                    "sasl.password": bootstrap.password})
    return out


class ConfluentProducer:
    def __init__(self, bootstrap: Bootstrap, idempotent: bool) -> None:
        self._producer = confluent_kafka.Producer({**_common(bootstrap), "acks": "all",
                                                   "enable.idempotence": idempotent, "linger.ms": 5})

    def send_all(self, records: Sequence[Outgoing], topic: str) -> list[tuple[int, int]]:
        results: list[tuple[int, int] | None] = [None] * len(records)
        errors: list[Any] = []

        def delivered(index: int) -> Any:
            def report(error: Any, message: Any) -> None:
                if error is not None:
                    errors.append(error)
                else:
                    results[index] = (message.partition(), message.offset())
            return report

        for i, r in enumerate(records):
            self._producer.produce(topic, value=r.value, key=r.key, partition=r.partition,
                                   headers=list(r.headers), timestamp=r.timestamp_ms or 0,
                                   on_delivery=delivered(i))
        left = self._producer.flush(CALL_TIMEOUT_S)
        assert left == 0 and not errors, (left, errors)
        return [r for r in results if r is not None]

    def close(self) -> None:
        left = self._producer.flush(CALL_TIMEOUT_S)
        assert left == 0, f"{left} records still unsent"
        del self._producer  # the handle is destroyed (its connections closed) with its last reference


class ConfluentConsumer:
    def __init__(self, bootstrap: Bootstrap, group: str, topics: Sequence[str], bounds: FetchBounds | None) -> None:
        extra = {} if bounds is None else {
            # librdkafka wants fetch.max.bytes >= message.max.bytes (1 MB by default).
            "fetch.max.bytes": bounds.response_bytes, "message.max.bytes": bounds.response_bytes,
            "max.partition.fetch.bytes": bounds.partition_bytes,
            "receive.message.max.bytes": bounds.response_bytes + bounds.frame_slack_bytes}
        self._consumer = confluent_kafka.Consumer({
            **_common(bootstrap), "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS, **extra})
        self._consumer.subscribe(list(topics))

    def poll(self, timeout_s: float = POLL_S) -> list[Consumed]:
        out = []
        for m in self._consumer.consume(num_messages=1000, timeout=timeout_s):
            error = m.error()
            if error is not None:
                assert error.code() == confluent_kafka.KafkaError._PARTITION_EOF, error
                continue
            _, timestamp_ms = m.timestamp()
            out.append(Consumed(m.topic(), m.partition(), m.offset(), m.key(), m.value(), _headers(m.headers()),
                                timestamp_ms))
        return out

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def commit(self) -> None:
        self._consumer.commit(asynchronous=False)

    def close(self) -> None:
        self._consumer.close()


class ConfluentClient:
    name = "confluent-kafka"

    def _admin(self, bootstrap: Bootstrap) -> confluent_kafka.admin.AdminClient:
        return confluent_kafka.admin.AdminClient(_common(bootstrap))

    def create_topic(self, bootstrap: Bootstrap, topic: str, partitions: int) -> None:
        admin = self._admin(bootstrap)  # held until the result: a dropped client fails its futures
        futures = admin.create_topics(
            [confluent_kafka.admin.NewTopic(topic, num_partitions=partitions, replication_factor=1)],
            request_timeout=CALL_TIMEOUT_S)
        futures[topic].result(CALL_TIMEOUT_S)

    def delete_topic(self, bootstrap: Bootstrap, topic: str) -> None:
        admin = self._admin(bootstrap)
        futures = admin.delete_topics([topic], request_timeout=CALL_TIMEOUT_S)
        futures[topic].result(CALL_TIMEOUT_S)

    def list_topics(self, bootstrap: Bootstrap) -> set[str]:
        return set(self._admin(bootstrap).list_topics(timeout=CALL_TIMEOUT_S).topics)

    def producer(self, bootstrap: Bootstrap, *, idempotent: bool = False) -> Producer:
        return ConfluentProducer(bootstrap, idempotent)

    def consumer(self, bootstrap: Bootstrap, group: str, topics: Sequence[str],
                 bounds: FetchBounds | None = None) -> Consumer:
        return ConfluentConsumer(bootstrap, group, topics, bounds)

    def offset_for_time(self, bootstrap: Bootstrap, topic: str, partition: int, timestamp_ms: int) -> int | None:
        consumer = confluent_kafka.Consumer({**_common(bootstrap), "group.id": "offsets-for-times"})
        try:
            found = consumer.offsets_for_times([confluent_kafka.TopicPartition(topic, partition, timestamp_ms)],
                                               timeout=CALL_TIMEOUT_S)
            assert found[0].error is None, found[0].error
            return None if found[0].offset < 0 else int(found[0].offset)
        finally:
            consumer.close()

    def close(self) -> None:
        pass


CLIENTS = ("kafka-python", "aiokafka", "confluent-kafka")


def make_client(name: str) -> Client:
    if name == "kafka-python":
        return KafkaPythonClient()
    if name == "aiokafka":
        return AioKafkaClient()
    assert name == "confluent-kafka", name
    return ConfluentClient()


# --- waiting ------------------------------------------------------------------------------------------


def consume_until(consumers: Sequence[Consumer], count: int, timeout_s: float = CALL_TIMEOUT_S
                  ) -> list[list[Consumed]]:
    """Poll ``consumers`` in turn until together they got ``count`` records (more fail the caller's checks);
    each one's records, in the order it got them."""
    got: list[list[Consumed]] = [[] for _ in consumers]

    def all_in() -> bool:
        if sum(len(g) for g in got) >= count:
            return True
        for consumer, into in zip(consumers, got, strict=True):
            into.extend(consumer.poll())
        return False

    # A poll blocks a while itself: no pause between polls.
    wait_until(all_in, lambda: f"{count} records (got {sum(len(g) for g in got)} of {count})", timeout_s, poll_s=0)
    return got
