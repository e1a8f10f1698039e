"""The data source as a Kafka client of a running broker (librdkafka, through confluent-kafka).

Driver side, :class:`BrokerView`: the topics and partitions and their leaders, each partition's first
and next offset (ListOffsets: the next offset is the high watermark, below which every record is
acknowledged, or for read_committed the last stable offset, below which every transaction has ended),
and the broker's object storage (DescribeConfigs). Executor side, :func:`read_tail`: the records of one
partition in an offset range, through Kafka Fetch, as Arrow batches in the source's schema; as
read_committed, librdkafka drops aborted transactions' records itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from stratalog.errors import StratalogError
from stratalog.objects.uri import OBJECT_STORE_CONFIG
from stratalog.spark.columns import arrow_schema

#: How long the driver waits for the broker's answers, and a task for records the broker acknowledged
#: (they are there: waiting longer only hides a broker that is down).
REQUEST_TIMEOUT_S = 30.0
#: How long the driver asks again for the offsets of a partition without a leader before the read fails: a
#: cluster's failover took 3.9 to 12.6 s under load (docs/cluster.md), and a micro-batch that fails for it
#: stops the query. Between asks: from LEADER_RETRY_S_MIN, doubling up to LEADER_RETRY_S_MAX.
LEADER_WAIT_S_MAX = 90.0
LEADER_RETRY_S_MIN = 0.1
LEADER_RETRY_S_MAX = 2.0
#: Records taken from the client per call: large enough to amortize the call, small enough for a batch.
ROWS_PER_BATCH = 10_000

TopicPartition = tuple[str, int]


class BrokerReadError(StratalogError):
    """The broker did not answer, or answered with an error."""


class DataLossError(BrokerReadError):
    """Records the read was to return are gone (trimmed by retention or DeleteRecords)."""


#: librdkafka logs warnings and errors of the data source's clients, not their routine notices (an admin
#: client dropped after its answers logs one per unserved event); ``kafka.log_level`` overrides it.
CLIENT_LOG_LEVEL = 4


def _client_settings(bootstrap: str, settings: dict[str, str]) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "client.id": "stratalog-spark", "log_level": CLIENT_LOG_LEVEL,
            **settings}


#: The isolation levels a read takes (librdkafka's ``isolation.level`` values), the default first.
READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)


@dataclass(frozen=True, slots=True)
class PartitionEnds:
    """A partition's first offset (the log start) and next offset (the high watermark, or for
    read_committed the last stable offset)."""

    start: int
    end: int


def leader_missing(error: BaseException) -> bool:
    """Whether librdkafka's ``error`` says a partition has no leader now (a failover under way: its leader
    died, or moved and librdkafka's metadata is stale), or another error worth asking again for."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(error, KafkaException) or not error.args or not isinstance(error.args[0], KafkaError):
        return False
    code = error.args[0]
    return bool(code.retriable()) or code.code() in LEADER_MISSING_CODES or code.code() == TIMED_OUT


def _offset(offset: int) -> int:
    """An offset ListOffsets answered; a negative one (OFFSET_INVALID: librdkafka's answer, without an error,
    when the leader it asked is gone) raises as a timeout, to be asked again."""
    from confluent_kafka import KafkaError, KafkaException

    if offset < 0:
        raise KafkaException(KafkaError(TIMED_OUT, f"no offset in the answer ({offset}): the leader is gone"))
    return int(offset)


#: librdkafka's codes for a partition without a leader or a broker that is not there: its own "no leaders
#: found" (_NOENT), transport failure (_TRANSPORT), all brokers down (_ALL_BROKERS_DOWN), and Kafka's
#: LEADER_NOT_AVAILABLE and NOT_LEADER_OR_FOLLOWER.
LEADER_MISSING_CODES = frozenset({-156, -195, -187, 5, 6})
#: librdkafka's own timeout (_TIMED_OUT): a ListOffsets to a leader that died after the client last learnt
#: of it. librdkafka 2.16's admin client then stays stuck on the dead leader (its threads spin, every later
#: ListOffsets times out or answers OFFSET_INVALID, -1001, without an error, also after the failover), so
#: the view asks again through a new client.
TIMED_OUT = -185
#: librdkafka's codes for a login the broker refused (SASL: _AUTHENTICATION) and a TLS handshake that
#: failed (_SSL): asking again changes nothing.
LOGIN_REFUSED_CODES = frozenset({-169, -181})
#: Metadata is asked in slices this long, so that a refused login ends the wait at once.
METADATA_SLICE_S = 1.0
#: How long one ListOffsets may take before it is asked again through a new client: a lookup on the
#: leader, answered in milliseconds by a live one; a stuck client otherwise costs REQUEST_TIMEOUT_S a try.
LIST_OFFSETS_TIMEOUT_S = 5.0


class _AskAgain:
    """The driver's rule for asking again: while a failure is one asking again can mend (leader_missing: a
    failover under way, a broker killed and not yet left out, a client stuck on a dead leader), for up to
    LEADER_WAIT_S_MAX, through a new client each time, after a pause from LEADER_RETRY_S_MIN doubling up to
    LEADER_RETRY_S_MAX."""

    def __init__(self, renew: Callable[[], None], clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._renew, self._clock, self._sleep = renew, clock, sleep
        self._deadline = clock() + LEADER_WAIT_S_MAX
        self._pause_s = LEADER_RETRY_S_MIN

    def mends(self, error: BaseException) -> bool:
        """Whether to ask again after ``error``: one asking again can mend, and time is left."""
        return leader_missing(error) and self._clock() <= self._deadline

    def pause(self) -> None:
        """A new client, then the pause before the next ask."""
        self._renew()
        self._sleep(self._pause_s)
        self._pause_s = min(2 * self._pause_s, LEADER_RETRY_S_MAX)


class _LoginRefusal:
    """The view's librdkafka error callback: keeps what librdkafka said when a broker refused the login (or
    the TLS handshake), where no retry helps. Apart from the view, so that the client holds no reference
    back to it: a view dropped without close would otherwise live, with its client's threads and their
    connection retries, until the garbage collector next looked for cycles."""

    def __init__(self) -> None:
        self.said: str | None = None

    def __call__(self, error: Any) -> None:
        if error.code() in LOGIN_REFUSED_CODES:
            self.said = str(error.str())


class BrokerView:
    """The driver's questions to the broker. Close it when done."""

    def __init__(self, bootstrap: str, settings: dict[str, str]) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self._refusal = _LoginRefusal()
        client_settings = {**_client_settings(bootstrap, settings), "error_cb": self._refusal}
        self._make_admin: Callable[[], Any] = lambda: AdminClient(client_settings)
        self._admin: Any = self._make_admin()

    def _renew(self) -> None:
        """A new librdkafka client in place of one that may be stuck on a dead leader (TIMED_OUT)."""
        self._admin = self._make_admin()

    def close(self) -> None:
        self._admin = None  # librdkafka's admin client has no close; its threads end with the object

    def _list_topics(self) -> Any:
        """Metadata within REQUEST_TIMEOUT_S, asked in slices of METADATA_SLICE_S: librdkafka waits out the
        whole timeout when a broker refuses the login, so the view looks for that between slices and
        says it at once (BrokerReadError)."""
        from confluent_kafka import KafkaException

        until = time.monotonic() + REQUEST_TIMEOUT_S
        while True:
            try:
                return self._admin.list_topics(timeout=max(min(METADATA_SLICE_S, until - time.monotonic()), 0.01))
            except KafkaException as e:
                self._admin.poll(0)   # serves the error callback
                if self._refusal.said is not None:
                    raise BrokerReadError(f"broker {self.bootstrap} refused the login: {self._refusal.said}") from e
                if e.args[0].code() != TIMED_OUT or time.monotonic() >= until:
                    raise

    def _metadata(self) -> Any:
        """Metadata from any broker, asked again while librdkafka says the broker it asked is not there (one
        of the bootstrap brokers killed and not yet left out: its answer can be a transport failure rather
        than another broker's metadata), for up to LEADER_WAIT_S_MAX."""
        again = _AskAgain(self._renew)
        while True:
            try:
                return self._list_topics()
            except Exception as e:
                if not again.mends(e):
                    raise
            again.pause()

    def topics(self, wanted: list[str] | None) -> dict[str, int]:
        """Partition count of each topic in ``wanted`` (every topic when None). A topic that does not exist
        raises BrokerReadError naming it."""
        try:
            metadata = self._metadata()
        except Exception as e:
            raise BrokerReadError(f"broker {self.bootstrap} did not list its topics: {e}") from e
        found = {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}
        if wanted is None:
            return dict(sorted(found.items()))
        missing = [name for name in wanted if name not in found]
        if missing:
            raise BrokerReadError(f"broker {self.bootstrap} has no topic {', '.join(map(repr, missing))}; "
                                  f"it has {', '.join(sorted(found)) or 'none'}")
        return {name: found[name] for name in wanted}

    def ends(self, partitions: list[TopicPartition], committed: bool = False) -> dict[TopicPartition, PartitionEnds]:
        """Each partition's first and next offset, in two ListOffsets round trips; with ``committed``, the
        next offset is the last stable offset (ListOffsets read_committed)."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka import TopicPartition as KafkaPartition
        from confluent_kafka.admin import OffsetSpec

        if not partitions:
            return {}
        isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED

        def ask(spec: Any) -> dict[TopicPartition, int]:
            out: dict[TopicPartition, int] = {}
            wanted = list(partitions)
            again = _AskAgain(self._renew)
            while wanted:
                futures = self._admin.list_offsets({KafkaPartition(t, p): spec for t, p in wanted},
                                                   isolation_level=isolation, request_timeout=LIST_OFFSETS_TIMEOUT_S)
                wanted = []
                for tp, future in futures.items():
                    try:
                        out[(tp.topic, tp.partition)] = _offset(future.result().offset)
                    except Exception as e:
                        if not again.mends(e):
                            raise BrokerReadError(f"broker {self.bootstrap}: offsets of {tp.topic}/{tp.partition}: "
                                                  f"{e}") from e
                        wanted.append((tp.topic, tp.partition))   # a failover under way: ask again
                if wanted:
                    again.pause()
            return out

        firsts = ask(OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        nexts = ask(OffsetSpec.latest())  # type: ignore[no-untyped-call]
        return {tp: PartitionEnds(firsts[tp], nexts[tp]) for tp in partitions}

    def leaders(self, partitions: list[TopicPartition]) -> dict[TopicPartition, str]:
        """The ``host:port`` of each partition's leader, from fresh metadata; BrokerReadError for a
        partition that has none (or that does not exist)."""
        out = {}
        for tp, leader in self.leaders_known(partitions).items():
            if leader is None:
                raise BrokerReadError(f"broker {self.bootstrap} names no leader of {tp[0]}/{tp[1]}")
            out[tp] = leader
        return out

    def brokers(self) -> list[str]:
        """The ``host:port`` of every broker Metadata names."""
        try:
            metadata = self._metadata()
        except Exception as e:
            raise BrokerReadError(f"broker {self.bootstrap} did not list its brokers: {e}") from e
        return sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values())

    def leaders_known(self, partitions: list[TopicPartition]) -> dict[TopicPartition, str | None]:
        """From fresh metadata, the ``host:port`` of the leader of each of ``partitions`` that exists (None
        while it has none: a failover under way); a partition that does not exist is left out."""
        try:
            metadata = self._metadata()
        except Exception as e:
            raise BrokerReadError(f"broker {self.bootstrap} did not list its topics: {e}") from e
        out: dict[TopicPartition, str | None] = {}
        for topic, partition in partitions:
            found = metadata.topics.get(topic)
            leader = found.partitions.get(partition) if found is not None else None
            if leader is None:
                continue
            node = metadata.brokers.get(leader.leader)
            out[(topic, partition)] = None if node is None else f"{node.host}:{node.port}"
        return out

    def object_store_uri(self) -> str | None:
        """The broker's object storage as it advertises it (None: it does not say). In a cluster every
        broker advertises the same store: every broker Metadata names is asked at once and the first answer
        counts, so one just killed (still named until the others notice) costs nothing and a slow one on a
        loaded machine is waited for, up to REQUEST_TIMEOUT_S. When none answers (each a transport failure:
        a killed broker, or a client stuck on it), they are asked again through a new client, for up to
        LEADER_WAIT_S_MAX, as the offsets are."""
        again = _AskAgain(self._renew)
        while True:
            try:
                metadata = self._metadata()
            except Exception as e:
                raise BrokerReadError(f"broker {self.bootstrap} did not list its brokers: {e}") from e
            answered, uri, failures = self._ask_object_store(sorted(metadata.brokers))
            if answered:
                return uri
            if not any(again.mends(e) for e in failures.values()):
                said = "; ".join(f"broker {node}: {error}" for node, error in failures.items())
                raise BrokerReadError(f"broker {self.bootstrap} did not describe its configs: {said}")
            again.pause()

    def _ask_object_store(self, nodes: list[int]) -> tuple[bool, str | None, dict[int, Exception]]:
        """Whether one of ``nodes`` described its configs, the object store it names, and each failure."""
        from confluent_kafka.admin import ConfigResource, ResourceType

        asked = {next(iter(self._admin.describe_configs([ConfigResource(ResourceType.BROKER, str(node))],
                                                        request_timeout=REQUEST_TIMEOUT_S).values())): node
                 for node in nodes}
        failures: dict[int, Exception] = {}
        pending = set(asked)
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while pending:
            done, pending = wait(pending, max(0.0, deadline - time.monotonic()), FIRST_COMPLETED)
            if not done:
                failures |= {asked[f]: TimeoutError(f"no answer in {REQUEST_TIMEOUT_S:g} s") for f in pending}
                break
            for future in sorted(done, key=asked.__getitem__):
                try:
                    entries = future.result()
                except Exception as e:
                    failures[asked[future]] = e
                    continue
                entry = entries.get(OBJECT_STORE_CONFIG)
                return True, None if entry is None or not entry.value else str(entry.value), failures
        return False, None, failures


# Executor side -------------------------------------------------------------------------------------

#: A consumer given back is closed once it has been idle this long. An idle consumer keeps its connections to
#: its broker, and once that broker is gone it retries them for as long as it lives: a Spark worker would
#: knock on a closed port for good, and whatever binds that port next would get a stranger's connection
#: (Spark's own local sockets serve the first connection that comes, and refuse the one they wait for).
IDLE_CONSUMER_S_MAX = 5.0
#: How often a worker with idle consumers looks for ones to close.
IDLE_SWEEP_S = 1.0

_ConsumerKey = tuple[str, tuple[tuple[str, str], ...]]


class IdleConsumers:
    """The consumers this Python worker keeps between tasks, by bootstrap and settings; each is closed
    once it has been idle IDLE_CONSUMER_S_MAX (by a sweeper thread that runs while any is kept)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._idle: dict[_ConsumerKey, list[tuple[Any, float]]] = {}   # consumer, when given back
        self._lock = threading.Lock()
        self._sweeping = False

    def take(self, key: _ConsumerKey) -> Any | None:
        with self._lock:
            idle = self._idle.get(key)
            if not idle:
                return None
            consumer, _ = idle.pop()
            if not idle:
                del self._idle[key]
            return consumer

    def give_back(self, consumer: Any, key: _ConsumerKey) -> None:
        consumer.unassign()
        with self._lock:
            self._idle.setdefault(key, []).append((consumer, self._clock()))
            if not self._sweeping:
                self._sweeping = True
                threading.Thread(target=self._sweep, name="stratalog-spark-idle-consumers", daemon=True).start()

    def close_expired(self, now: float) -> int:
        """Close the consumers given back more than IDLE_CONSUMER_S_MAX before ``now``; return how many."""
        expired = []
        with self._lock:
            for key, idle in list(self._idle.items()):
                expired += [c for c, at in idle if now - at > IDLE_CONSUMER_S_MAX]
                keep = [(c, at) for c, at in idle if now - at <= IDLE_CONSUMER_S_MAX]
                if keep:
                    self._idle[key] = keep
                else:
                    del self._idle[key]
        for consumer in expired:
            consumer.close()
        return len(expired)

    def kept(self) -> int:
        with self._lock:
            return sum(map(len, self._idle.values()))

    def _sweep(self) -> None:
        """Close idle consumers as they expire; leave once none is kept (the next give-back starts another)."""
        while True:
            time.sleep(IDLE_SWEEP_S)
            self.close_expired(self._clock())
            with self._lock:
                if not self._idle:
                    self._sweeping = False
                    return


_consumers = IdleConsumers()


def _take_consumer(bootstrap: str, settings: dict[str, str]) -> tuple[Any, _ConsumerKey]:
    """A consumer for these settings: one kept from an earlier task of this Python worker (within
    IDLE_CONSUMER_S_MAX), or a new one (a consumer's bootstrap costs round trips; Spark runs many tasks in
    one worker)."""
    key = (bootstrap, tuple(sorted(settings.items())))
    kept = _consumers.take(key)
    if kept is not None:
        return kept, key
    from confluent_kafka import Consumer

    config = {**_client_settings(bootstrap, settings), "group.id": "stratalog-spark", "enable.auto.commit": False,
              "enable.auto.offset.store": False, "auto.offset.reset": "error", "enable.partition.eof": True,
              "fetch.wait.max.ms": 100}
    return Consumer(config), key


def read_tail(bootstrap: str, settings: dict[str, str], topic: str, partition: int, start: int, end: int, *,
              headers: bool = False, fail_on_data_loss: bool = True, isolation: str = READ_COMMITTED,
              timeout_s: float = REQUEST_TIMEOUT_S) -> Iterator[pa.RecordBatch]:
    """Records ``[start, end)`` of a partition, fetched from the broker, in batches of the source's schema.

    Every offset below the end the driver saw holds a record unless it was trimmed since, or log
    compaction took it, or it is a transaction's marker, or (``isolation`` read_committed, below the last
    stable offset) an aborted transaction wrote it: the read goes on to the next record. Offsets trimmed
    before they were read raise DataLossError, or with ``fail_on_data_loss`` False the read goes on from
    the partition's new start. No record arrives within ``timeout_s``: BrokerReadError.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka import TopicPartition as KafkaPartition

    consumer, key = _take_consumer(bootstrap, {**settings, "isolation.level": isolation})
    healthy = False
    label = f"{topic}/{partition}"
    try:
        consumer.assign([KafkaPartition(topic, partition, start)])
        at = start
        rows = _Rows(label, headers)
        deadline = time.monotonic() + timeout_s
        while at < end:
            messages = consumer.consume(num_messages=min(ROWS_PER_BATCH, end - at), timeout=1.0)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # The end of the log (read_committed: the last stable offset), every record before it
                        # taken: past ``end``, what was left in range is records log compaction took (as it may
                        # take a log's last ones: expired tombstones), markers, or aborted records.
                        if message.offset() >= end:
                            at = end
                            break
                        continue
                    if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        at = _after_loss(consumer, topic, partition, at, end, fail_on_data_loss)
                        break
                    raise BrokerReadError(f"fetching {label} from {bootstrap} at offset {at}: {error.str()}")
                offset = message.offset()
                if offset < at:
                    continue
                # A record past ``at``: log compaction took the ones between. (Never trimming: a fetch of
                # a trimmed offset is refused, OFFSET_OUT_OF_RANGE above, not answered from further on.)
                if offset >= end:
                    at = end
                    break
                rows.add(message)
                at = offset + 1
            if len(rows) >= ROWS_PER_BATCH or (at >= end and len(rows)):
                yield rows.finish()
                rows = _Rows(label, headers)
            if messages:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                raise BrokerReadError(f"fetching {label} from {bootstrap}: no record at offset {at} within "
                                      f"{timeout_s:.0f} s (the driver saw records up to {end - 1})")
        healthy = True
    finally:
        if healthy:
            _consumers.give_back(consumer, key)
        else:
            consumer.close()


def _after_loss(consumer: Any, topic: str, partition: int, at: int, end: int, fail_on_data_loss: bool) -> int:
    from confluent_kafka import TopicPartition as KafkaPartition

    first, _ = consumer.get_watermark_offsets(KafkaPartition(topic, partition), timeout=REQUEST_TIMEOUT_S,
                                              cached=False)
    if first <= at:
        raise BrokerReadError(f"{topic}/{partition}: offset {at} is out of range though the partition starts "
                              f"at {first}")
    if fail_on_data_loss:
        raise DataLossError(f"{topic}/{partition}: offsets {at} to {min(first, end) - 1} are gone (trimmed before "
                            "they were read); set failOnDataLoss=false to read on from the partition's start")
    at = min(first, end)
    if at < end:
        consumer.assign([KafkaPartition(topic, partition, at)])
    return at


class _Rows:
    """Messages of one partition gathered into a RecordBatch of the source's schema."""

    def __init__(self, label: str, headers: bool) -> None:
        self.label = label
        self.headers = headers
        self.offsets: list[int] = []
        self.stamps_us: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.header_lists: list[list[dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, message: Any) -> None:
        self.offsets.append(message.offset())
        self.stamps_us.append(message.timestamp()[1] * 1000)
        self.keys.append(message.key())
        self.values.append(message.value() or b"")
        if self.headers:
            self.header_lists.append([{"key": k, "value": v} for k, v in message.headers() or ()])

    def finish(self) -> pa.RecordBatch:
        count = len(self.offsets)
        columns: list[Any] = [pa.array([self.label] * count, pa.string()), pa.array(self.offsets, pa.int64()),
                              pa.array(self.stamps_us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                              pa.array(self.keys, pa.binary()), pa.array(self.values, pa.binary())]
        schema = arrow_schema(self.headers)
        if self.headers:
            columns.append(pa.array(self.header_lists, schema.field("headers").type))
        return pa.RecordBatch.from_arrays(columns, schema=schema)
