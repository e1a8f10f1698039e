"""Spark reads a running broker: uploaded records from objects, the acknowledged tail from the broker."""

from __future__ import annotations

import gc
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import BrokerProcess, running_broker
from stratalog.engine.manifest import ManifestError, read_manifest
from stratalog.objects.local import LocalDirStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.spark import kafka_client
from stratalog.spark.broker_source import BrokerBatchReader, BrokerStreamReader
from stratalog.spark.kafka_client import BrokerView
from stratalog.spark.location import locate
from waiting import wait_until

pytestmark = pytest.mark.slow

Row = tuple[str, int, bytes | None, bytes]


def broker_config(tmp_path: Path, upload_interval_s: float) -> Path:
    path = tmp_path / "broker.toml"
    # The machine's own free space never refuses a test's appends (a test writes kilobytes).
    path.write_text(f"[store]\nupload_interval_s = {upload_interval_s}\nfree_bytes_min = 0\nfree_percent_min = 0.0\n")
    return path


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions)]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, partitions: int, first: int, count: int) -> list[Row]:
    """Produce ``count`` records round-robin over the partitions, acks=all; the acknowledged rows."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    acked: list[Row] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        acked.append((f"{topic}/{message.partition()}", message.offset(), message.key(), message.value()))

    for i in range(first, first + count):
        key = None if i % 7 == 0 else b"k%d" % i
        producer.produce(topic, value=b"v%d" % i, key=key, partition=i % partitions, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert len(acked) == count
    return acked


def uploaded(broker: BrokerProcess) -> int:
    """Records of all streams in the broker's published manifest."""
    try:
        manifest = read_manifest(LocalDirStore(broker.data_dir / LOCAL_DIR_NAME))
    except ManifestError:  # not published yet
        return 0
    return sum(s.end_offset - s.start_offset for s in manifest.streams.values())


def rows_of(df: Any) -> list[Row]:
    return sorted((r.stream, r.offset, r.key, r.value) for r in df.collect())


def test_batch_read_of_a_live_broker_returns_every_acknowledged_record(spark: Any, tmp_path: Path) -> None:
    with running_broker(tmp_path / "data", "--config", str(broker_config(tmp_path, 2.0))) as broker:
        create_topic(broker.bootstrap, "clicks", 3)
        acked = produce(broker.bootstrap, "clicks", 3, 0, 3000)
        wait_until(lambda: uploaded(broker) >= 3000, "the first records to be uploaded")
        acked += produce(broker.bootstrap, "clicks", 3, 3000, 2000)

        view = BrokerView(broker.bootstrap, {})
        assert view.object_store_uri() == (broker.data_dir / LOCAL_DIR_NAME).absolute().as_uri()
        # The uploader may take the new records at any moment; planned right after producing, they are
        # nearly always still in the tail. Produce a little more until a plan shows both kinds of read.
        for attempt in range(20):
            planned = BrokerBatchReader(locate({"path": f"kafka://{broker.bootstrap}"}), {}).partitions()
            if {type(p.value).__name__ for p in planned} == {"ObjectsPartition", "TailPartition"}:
                break
            acked += produce(broker.bootstrap, "clicks", 3, 5000 + 10 * attempt, 10)
        else:
            raise AssertionError("no plan read both from objects and from the broker")
        acked.sort()

        reader = spark.read.format("stratalog").option("path", f"kafka://{broker.bootstrap}")
        assert rows_of(reader.load()) == acked
        assert rows_of(reader.option("coldReads", "broker").load()) == acked, "everything through Kafka Fetch"
        narrowed = reader.load().where("stream = 'clicks/1' AND offset >= 100 AND offset < 1200")
        assert rows_of(narrowed) == [r for r in acked if r[0] == "clicks/1" and 100 <= r[1] < 1200]
        assert reader.load().where("offset >= 1000000").count() == 0, "an empty plan reads nothing"
        assert broker.stop() == 0


# Transactions ----------------------------------------------------------------------------------------

#: Records each transaction writes, alternating between the topic's two partitions.
TXN_RECORDS = 6


class Transactions:
    """Two transactional producers whose transactions interleave batch by batch in both partitions of a
    topic, and a plain (idempotent) producer between them: what each wrote, by fate."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.txn = [Producer({"bootstrap.servers": bootstrap, "transactional.id": f"spark-read-{n}", "linger.ms": 0})
                    for n in range(2)]
        for producer in self.txn:
            producer.init_transactions(30)
        self.plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
        self.committed: list[bytes] = []
        self.aborted: list[bytes] = []
        self.rounds = 0

    def send(self, producer: Any, value: bytes, partition: int) -> None:
        producer.produce(self.topic, value=value, partition=partition)
        assert producer.flush(30) == 0  # one batch each: the producers' batches alternate in the log

    def round(self, commits: tuple[bool, bool]) -> None:
        """One transaction of each producer, at once; each committed or aborted as ``commits`` says; a
        plain record between each of their batches."""
        self.rounds += 1
        written: list[list[bytes]] = [[], []]
        for producer in self.txn:
            producer.begin_transaction()
        for i in range(TXN_RECORDS):
            for n, producer in enumerate(self.txn):
                value = b"txn%d-r%d-%d" % (n, self.rounds, i)
                self.send(producer, value, i % 2)
                written[n].append(value)
            self.send(self.plain, b"plain-r%d-%d" % (self.rounds, i), i % 2)
            self.committed.append(b"plain-r%d-%d" % (self.rounds, i))
        for n, producer in enumerate(self.txn):
            if commits[n]:
                producer.commit_transaction(30)
                self.committed += written[n]
            else:
                producer.abort_transaction(30)
                self.aborted += written[n]


def values_of(df: Any) -> list[bytes]:
    return sorted(r.value for r in df.collect())


def micro_batch(path: str) -> list[bytes]:
    """The values of a streaming query's first micro-batch from the start, everything available, its tasks
    run here (without Spark): each partition ends at its last stable offset."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = BrokerStreamReader(locate({"path": path}), {"topics": "ledger"})
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        stable = BrokerView(path.removeprefix("kafka://"), {}).ends([("ledger", 0), ("ledger", 1)], committed=True)
        assert end == {"ledger": {str(p): e.end for (_, p), e in stable.items()}}
        return sorted(v for part in reader.partitions(start, end) for batch in reader.read(part)
                      for v in batch.column("value").to_pylist())
    finally:
        reader.stop()
        kafka_client._consumers.close_expired(float("inf"))   # no consumer left knocking once the broker stops


def test_read_committed_drops_aborted_transactions_from_objects_and_the_tail(spark: Any, tmp_path: Path) -> None:
    with running_broker(tmp_path / "data", "--config", str(broker_config(tmp_path, 1.0))) as broker:
        create_topic(broker.bootstrap, "ledger", 2)
        txns = Transactions(broker.bootstrap, "ledger")
        for commits in ((True, False), (False, True), (True, True), (False, False)):
            txns.round(commits)
        ends = BrokerView(broker.bootstrap, {}).ends([("ledger", 0), ("ledger", 1)])
        written = sum(e.end for e in ends.values())   # records and markers
        wait_until(lambda: uploaded(broker) >= written, "the first transactions to be uploaded")
        txns.round((False, True))   # in the tail, most likely (the plan below says)
        txns.round((True, False))

        path = f"kafka://{broker.bootstrap}"
        planned = BrokerBatchReader(locate({"path": path}), {}).partitions()
        kinds = {type(p.value).__name__ for p in planned}
        aborted_in_tasks = {r for p in planned if type(p.value).__name__ == "ObjectsPartition"
                            for _, ranges in p.value.aborted for r in ranges}
        assert "ObjectsPartition" in kinds and len(aborted_in_tasks) >= 4, (kinds, aborted_in_tasks)

        def read(**options: str) -> list[bytes]:   # a reader of its own each time: option() changes a reader
            return values_of(spark.read.format("stratalog").option("path", path).option("topics", "ledger")
                             .options(**options).load())

        assert read() == sorted(txns.committed), "read_committed is the default"
        assert read(coldReads="broker") == sorted(txns.committed)
        everything = sorted(txns.committed + txns.aborted)
        assert read(isolationLevel="read_uncommitted") == everything, "every record, and no marker"
        assert read(**{"kafka.isolation.level": "read_uncommitted"}) == everything

        # An open transaction: read_committed stops at its first offset in each partition, so a plain record
        # after it is not read yet; read_uncommitted reads both.
        opener = txns.txn[0]
        opener.begin_transaction()
        for partition in (0, 1):
            txns.send(opener, b"open-%d" % partition, partition)
            txns.send(txns.plain, b"late-%d" % partition, partition)
        assert read() == sorted(txns.committed)
        late = [b"late-0", b"late-1"]
        assert read(isolationLevel="read_uncommitted") == sorted([*everything, b"open-0", b"open-1", *late])
        assert micro_batch(path) == sorted(txns.committed), "a micro-batch ends at the last stable offset too"
        opener.abort_transaction(30)
        assert read() == sorted([*txns.committed, *late]), "the abort makes what follows it stable"
        assert broker.stop() == 0


class FailoverAdmin:
    """A stand-in for librdkafka's admin client whose ListOffsets for one partition finds no leader the
    first ``misses`` times (a failover under way), then answers."""

    def __init__(self, misses: int, error_code: int) -> None:
        self.misses, self.error_code = misses, error_code
        self.asked: list[list[tuple[str, int]]] = []

    def list_offsets(self, specs: dict[Any, Any], **_: Any) -> dict[Any, Future[Any]]:
        from confluent_kafka import KafkaError, KafkaException

        self.asked.append(sorted((tp.topic, tp.partition) for tp in specs))
        out: dict[Any, Future[Any]] = {}
        for tp in specs:
            future: Future[Any] = Future()
            if tp.partition == 1 and self.misses > 0:
                future.set_exception(KafkaException(KafkaError(self.error_code)))
            else:
                future.set_result(SimpleNamespace(offset=10 * tp.partition))
            out[tp] = future
        self.misses -= any(tp.partition == 1 for tp in specs)
        return out


def view_with(admin: Any, *renewed: Any) -> BrokerView:
    """A view over a stand-in admin client; each renewal (a client stuck on a dead leader replaced) takes
    the next of ``renewed``, or the same stand-in again."""
    view = BrokerView.__new__(BrokerView)
    clients = list(renewed)
    view.bootstrap, view._admin, view._refusal = "b:9092", admin, kafka_client._LoginRefusal()
    view._make_admin = lambda: clients.pop(0) if clients else view._admin
    return view


class StuckAdmin:
    """librdkafka 2.16's admin client after the leader it knew was killed: every ListOffsets of partition 1
    times out, or answers OFFSET_INVALID (-1001) without an error."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    def list_offsets(self, specs: dict[Any, Any], **_: Any) -> dict[Any, Future[Any]]:
        from confluent_kafka import KafkaError, KafkaException

        out: dict[Any, Future[Any]] = {}
        for tp in specs:
            future: Future[Any] = Future()
            if tp.partition != 1:
                future.set_result(SimpleNamespace(offset=0))
            elif self.answer == "timeout":
                future.set_exception(KafkaException(KafkaError(kafka_client.TIMED_OUT)))
            else:
                future.set_result(SimpleNamespace(offset=-1001))
            out[tp] = future
        return out


def test_the_rule_for_asking_again_renews_the_client_doubles_its_pause_and_ends_at_the_wait() -> None:
    from confluent_kafka import KafkaError, KafkaException

    now = [0.0]
    pauses: list[float] = []
    renewed: list[bool] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    again = kafka_client._AskAgain(lambda: renewed.append(True), clock=lambda: now[0], sleep=sleep)
    gone = KafkaException(KafkaError(-195))   # _TRANSPORT: asking again can mend it
    while again.mends(gone):
        again.pause()
    assert pauses[:6] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0] and set(pauses[5:]) == {kafka_client.LEADER_RETRY_S_MAX}
    assert len(renewed) == len(pauses) and kafka_client.LEADER_WAIT_S_MAX < now[0] <= kafka_client.LEADER_WAIT_S_MAX + 2
    fresh = kafka_client._AskAgain(lambda: None, clock=lambda: 0.0, sleep=sleep)
    assert not fresh.mends(KafkaException(KafkaError(3)))   # UNKNOWN_TOPIC_OR_PARTITION: no wait makes it exist
    assert not fresh.mends(ValueError("not librdkafka's"))


@pytest.mark.parametrize("answer", ["timeout", "offset -1001"])
def test_a_client_stuck_on_a_dead_leader_is_replaced_and_the_offsets_asked_again(
        answer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_client, "LEADER_RETRY_S_MIN", 0.001)
    fresh = FailoverAdmin(0, 0)
    view = view_with(StuckAdmin(answer), fresh)
    ends = view.ends([("t", 0), ("t", 1)])
    assert ends == {("t", 0): kafka_client.PartitionEnds(0, 0), ("t", 1): kafka_client.PartitionEnds(10, 10)}
    assert view._admin is fresh and fresh.asked[0] == [("t", 1)], "asked again through a new client"


@pytest.mark.parametrize("code", [-156, 5, 6])   # no leaders found, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER
def test_the_offsets_of_a_partition_without_a_leader_are_asked_again_until_it_has_one(
        code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_client, "LEADER_RETRY_S_MIN", 0.001)
    view = view_with(FailoverAdmin(2, code))
    ends = view.ends([("t", 0), ("t", 1)])
    assert ends == {("t", 0): kafka_client.PartitionEnds(0, 0), ("t", 1): kafka_client.PartitionEnds(10, 10)}
    assert view._admin.asked[:3] == [[("t", 0), ("t", 1)], [("t", 1)], [("t", 1)]], "only the one without a leader"


def test_a_partition_without_a_leader_past_the_wait_or_another_error_fails_the_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_client, "LEADER_RETRY_S_MIN", 0.001)
    monkeypatch.setattr(kafka_client, "LEADER_WAIT_S_MAX", 0.05)
    view = view_with(FailoverAdmin(10**9, -156))
    with pytest.raises(kafka_client.BrokerReadError, match="offsets of t/1"):
        view.ends([("t", 0), ("t", 1)])
    view = view_with(FailoverAdmin(1, 3))   # UNKNOWN_TOPIC_OR_PARTITION: no failover makes it exist
    with pytest.raises(kafka_client.BrokerReadError, match="offsets of t/1"):
        view.ends([("t", 1)])
    assert len(view._admin.asked) == 1


def test_metadata_is_asked_again_while_the_broker_asked_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh client that first asks a killed bootstrap broker gets a transport failure, not another
    broker's metadata: the driver asks again (a write query's start failed on it mid-failover)."""
    from confluent_kafka import KafkaError, KafkaException

    monkeypatch.setattr(kafka_client, "LEADER_RETRY_S_MIN", 0.001)
    answers: list[Any] = [KafkaException(KafkaError(-195)), KafkaException(KafkaError(-187)),
                          SimpleNamespace(topics={"t": SimpleNamespace(partitions={0: None, 1: None}, error=None)})]

    def list_topics(**_: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    view = view_with(SimpleNamespace(list_topics=list_topics, poll=lambda _: 0))
    assert view.topics(["t"]) == {"t": 2}
    assert answers == []


def test_a_view_dropped_without_close_leaves_no_cycle_to_keep_its_client_alive() -> None:
    """librdkafka's client lives, retrying its connections, as long as the object does: a view that
    failed before its close must free it when dropped, not when the garbage collector next runs."""
    gc.collect()
    gc.disable()
    try:
        view = BrokerView("127.0.0.1:1", {})
        assert view._admin is not None
        del view
        assert gc.collect() == 0, "the view and its client were left in a reference cycle"
    finally:
        gc.enable()


def test_a_refused_login_ends_the_wait_for_metadata_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka waits out the whole request timeout when the broker refuses the login; it says so only to
    the error callback, which the view looks at between slices of the wait."""
    from confluent_kafka import KafkaError, KafkaException

    monkeypatch.setattr(kafka_client, "REQUEST_TIMEOUT_S", 600.0)
    slices: list[float] = []

    def list_topics(timeout: float) -> Any:
        slices.append(timeout)
        raise KafkaException(KafkaError(kafka_client.TIMED_OUT))

    def poll(_: float) -> int:
        if len(slices) == 2:   # the broker's refusal arrives during the second slice
            view._refusal(KafkaError(-169, "SASL authentication error: Authentication failed"))
        return 0

    view = view_with(SimpleNamespace(list_topics=list_topics, poll=poll))
    with pytest.raises(kafka_client.BrokerReadError, match="refused the login: SASL authentication error"):
        view.topics(["t"])
    assert slices == [kafka_client.METADATA_SLICE_S] * 2


class ConfigsAdmin:
    """A cluster's brokers asked for their configs: the first ``fails`` rounds every one answers ``code``
    (a transport failure while one of them is killed), then each names the object store."""

    def __init__(self, fails: int, code: int) -> None:
        self.fails, self.code, self.rounds = fails, code, 0

    def list_topics(self, **_: Any) -> Any:
        return SimpleNamespace(brokers={1: None, 2: None, 3: None}, topics={})

    def describe_configs(self, resources: list[Any], **_: Any) -> dict[Any, Future[Any]]:
        from confluent_kafka import KafkaError, KafkaException

        future: Future[Any] = Future()
        if resources[0].name == "1":
            self.rounds += 1
        if self.rounds <= self.fails:
            future.set_exception(KafkaException(KafkaError(self.code)))
        else:
            future.set_result({kafka_client.OBJECT_STORE_CONFIG: SimpleNamespace(value="s3://bucket/p")})
        return {resources[0]: future}


def test_the_object_store_is_asked_again_when_every_broker_failed_to_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A streaming write's start asked the brokers for their configs as the leader it knew was killed, and
    every answer was a transport failure: it asks again through a new client (a busy machine's make test)."""
    monkeypatch.setattr(kafka_client, "LEADER_RETRY_S_MIN", 0.001)
    admin = ConfigsAdmin(2, -195)   # _TRANSPORT
    view = view_with(admin)
    assert view.object_store_uri() == "s3://bucket/p"
    assert admin.rounds == 3


def test_a_configs_answer_that_asking_again_cannot_change_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_client, "LEADER_RETRY_S_MIN", 0.001)
    admin = ConfigsAdmin(10**9, 29)   # CLUSTER_AUTHORIZATION_FAILED
    with pytest.raises(kafka_client.BrokerReadError, match="did not describe its configs: broker 1: "):
        view_with(admin).object_store_uri()
    assert admin.rounds == 1
    monkeypatch.setattr(kafka_client, "LEADER_WAIT_S_MAX", 0.05)
    with pytest.raises(kafka_client.BrokerReadError, match="did not describe its configs"):
        view_with(ConfigsAdmin(10**9, -195)).object_store_uri()
