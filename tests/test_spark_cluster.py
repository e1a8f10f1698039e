"""The Spark data source against three `stratalog serve --cluster` brokers (PostgreSQL, SeaweedFS), a topic of
6 partitions spread over them: a batch write commits each partition at its leader, once; a commit sent to
one broker commits what it leads and leaves the rest for their leaders; a micro-batch retried after some
partitions were committed commits only the rest (the streaming copy with its driver killed is in
test_spark_broker_stream.py, beside its single-broker twin); 30,000
records over the three brokers' partitions are read from objects alone once uploaded (the brokers'
manifests merged), materialized whole, and compacted by leader."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from clusterkit import SPARK_CLUSTER_TOML, BrokerCluster, partition_log, running_cluster, spark_options
from conftest import SeaweedS3
from stratalog.chaos.cluster_probe import served_without
from stratalog.engine.manifest import Manifest, ManifestError, read_manifest
from stratalog.engine.staging import STAGING_PREFIX
from stratalog.kafka import staged_commit
from stratalog.objects.uri import open_object_store
from stratalog.records import NewRecord
from stratalog.spark.broker_plan import TailPartition
from stratalog.spark.broker_source import BrokerBatchReader, ObjectsPartition
from stratalog.spark.broker_write import BrokerWriteError, commit_through_broker, replace_through_broker
from stratalog.spark.jobs import CompactionOutput, compact_live, write_compacted
from stratalog.spark.kafka_client import BrokerView
from stratalog.spark.location import locate
from stratalog.spark.materialize import load, materialize
from stratalog.spark.write import StagingWriter
from waiting import wait_progressing, wait_until

pytestmark = pytest.mark.slow
pytest_plugins = ["pgkit"]

PARTITIONS = 6
#: A broker's failover took 3.9 to 12.6 s under load (docs/cluster.md); a loaded machine may take longer.
FAILOVER_S_MAX = 90.0
#: How long the manifest may show no progress (no new record covered) before the test calls it stuck.
STALL_S = 240.0


@pytest.fixture
def cluster(tmp_path: Path, pg_database: str, seaweedfs: SeaweedS3) -> Iterator[BrokerCluster]:
    with running_cluster(tmp_path, pg_database, seaweedfs, 3, SPARK_CLUSTER_TOML) as running:
        yield running


def create_topics(cluster: BrokerCluster, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
    for future in admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names]).values():
        future.result(timeout=60)
    for name in names:
        wait_until(partial(served_without, cluster, 1, name, PARTITIONS), f"every partition of {name} served")


def topic_log(cluster: BrokerCluster, topic: str, dead: frozenset[int] = frozenset()) -> dict[int, list[bytes]]:
    """Every record of each partition, read with Fetch from its leader (offsets checked dense)."""
    via = next(i for i in cluster.live() if i not in dead)
    view = wait_until(lambda: served_without(cluster, via, topic, PARTITIONS, dead), f"{topic} served")
    out = {}
    for partition, v in view.items():
        with cluster.connect(v.leader_id) as connection:
            out[partition] = [value for _, _, value in partition_log(connection, topic, partition)]
    return out


def leaders(cluster: BrokerCluster, topic: str) -> dict[int, int]:
    view = wait_until(lambda: served_without(cluster, 1, topic, PARTITIONS), f"{topic} served")
    return {p: v.leader_id for p, v in view.items()}


def stage(cluster: BrokerCluster, seaweedfs: SeaweedS3, write: str, partitions: list[int],
          topic: str = "t") -> list[tuple[int, Any]]:
    """One task's staged objects (one per partition) of 10 records ``<write>:<partition>:<i>`` each."""
    del seaweedfs
    store = open_object_store(cluster.objects, Path("."))  # the test's URI carries the credentials
    writer = StagingWriter(store, f"{STAGING_PREFIX}{write}/000000-", split=True)
    for p in partitions:
        writer.add(f"{topic}/{p}", [NewRecord(b"%s:%d:%d" % (write.encode(), p, i)) for i in range(10)])
    return [(0, writer.finish())]


def test_a_batch_write_commits_each_partition_at_its_leader_once(spark: Any, cluster: BrokerCluster,
                                                                  seaweedfs: SeaweedS3) -> None:
    create_topics(cluster, "written")
    assert sorted(Counter(leaders(cluster, "written").values()).values()) == [2, 2, 2]
    rows = [(f"k{i}", f"w{i}") for i in range(6000)]
    writer = spark.createDataFrame(rows, "key string, value string").repartition(4).write.format("stratalog")
    writer.options(**spark_options(cluster, seaweedfs)).option("topic", "written").mode("append").save()

    logs = topic_log(cluster, "written")
    values = Counter(v for log in logs.values() for v in log)
    assert values == Counter(v.encode() for _, v in rows), "each row once"
    assert all(logs.values()), f"rows in every partition: {[len(v) for v in logs.values()]}"
    given = spark_options(cluster, seaweedfs)
    read = spark.read.format("stratalog").options(**given).option("topics", "written").load()
    assert read.count() == len(rows)
    store = open_object_store(cluster.objects, Path("."))
    assert not list(store.list(STAGING_PREFIX)), "no staged object left"


def test_a_commit_sent_to_one_broker_commits_what_it_leads_and_the_rest_go_to_their_leaders(
        cluster: BrokerCluster, seaweedfs: SeaweedS3) -> None:
    create_topics(cluster, "t")
    led = leaders(cluster, "t")
    staged = stage(cluster, seaweedfs, "w1", list(range(PARTITIONS)))
    request = staged_commit.CommitStagedRequest(None, -1, tuple(
        staged_commit.StagedObjectEntry(task, o.key, o.size_bytes, tuple(
            staged_commit.StagedStreamEntry(s.name, s.start, s.count) for s in o.streams))
        for task, objects in staged for o in objects))
    with cluster.connect(1) as connection:
        answer = connection.exchange(staged_commit.encode_request(connection.next_correlation_id(), None, request))
    _, response = staged_commit.decode_response(answer, 1)
    by_name = {p.name: p for p in response.partitions}
    assert {name: (p.error_code, p.committed, p.records) for name, p in by_name.items()} == {
        f"t/{p}": (0, True, 10) if led[p] == 1 else (6, False, 0) for p in range(PARTITIONS)}

    # The rest, sent as the driver sends a write: each to its leader; broker 1's are gone from staging.
    rest = [(task, tuple(o for o in objects if led[int(o.streams[0].name.split("/")[1])] != 1))
            for task, objects in staged]
    result = commit_through_broker(cluster.bootstrap(), {}, rest, None)
    assert (result.committed, result.records) == (True, 40)
    logs = topic_log(cluster, "t")
    assert {p: sorted(log) for p, log in logs.items()} == {
        p: sorted(b"w1:%d:%d" % (p, i) for i in range(10)) for p in range(PARTITIONS)}


def test_a_broker_of_a_cluster_refuses_an_object_of_several_partitions_and_answers_v0_with_one_error(
        cluster: BrokerCluster, seaweedfs: SeaweedS3) -> None:
    create_topics(cluster, "t")
    led = leaders(cluster, "t")
    store = open_object_store(cluster.objects, Path("."))
    writer = StagingWriter(store, f"{STAGING_PREFIX}joined/000000-")   # one object for both partitions
    for p in (0, 1):
        writer.add(f"t/{p}", [NewRecord(b"x")])
    [joined] = writer.finish()
    entry = staged_commit.StagedObjectEntry(0, joined.key, joined.size_bytes, tuple(
        staged_commit.StagedStreamEntry(s.name, s.start, s.count) for s in joined.streams))
    with cluster.connect(1) as connection:
        frame = staged_commit.encode_request(connection.next_correlation_id(), None,
                                             staged_commit.CommitStagedRequest(None, -1, (entry,)))
        _, response = staged_commit.decode_response(connection.exchange(frame), 1)
    assert (response.error_code, response.partitions) == (42, ())   # INVALID_REQUEST, nothing committed
    assert "objects of one partition each" in (response.error_message or "")

    # An older driver's v0 request: the first partition refused is the answer's error.
    [(_, [single])] = stage(cluster, seaweedfs, "v0", [next(p for p, b in led.items() if b != 1)])
    entry = staged_commit.StagedObjectEntry(0, single.key, single.size_bytes, tuple(
        staged_commit.StagedStreamEntry(s.name, s.start, s.count) for s in single.streams))
    with cluster.connect(1) as connection:
        frame = staged_commit.encode_request(connection.next_correlation_id(), None,
                                             staged_commit.CommitStagedRequest(None, -1, (entry,)), 0)
        _, response = staged_commit.decode_response(connection.exchange(frame), 0)
    assert response.error_code == 6 and "led by another broker" in (response.error_message or "")
    assert sum(len(log) for log in topic_log(cluster, "t").values()) == 0

def test_a_commit_sent_by_stale_metadata_is_refused_and_sent_again_to_the_leaders(
        cluster: BrokerCluster, seaweedfs: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's first look at Metadata names broker 1 as every partition's leader (as after a leader
    change it has not seen): broker 1 commits its own, refuses the rest, and they go to their leaders."""
    create_topics(cluster, "t")
    led = leaders(cluster, "t")
    real = BrokerView.leaders_known
    looks: list[int] = []

    def stale_once(view: BrokerView, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], str | None]:
        looks.append(len(partitions))
        if len(looks) == 1:
            return dict.fromkeys(partitions, cluster.brokers[1].bootstrap)
        return real(view, partitions)

    monkeypatch.setattr(BrokerView, "leaders_known", stale_once)
    result = commit_through_broker(cluster.bootstrap(), {}, stage(cluster, seaweedfs, "s", list(range(PARTITIONS))),
                                   ("stale", 0))
    assert (result.committed, result.records) == (True, 10 * PARTITIONS)
    assert looks == [PARTITIONS, sum(1 for p in led.values() if p != 1)], "the refused partitions, asked again"
    logs = topic_log(cluster, "t")
    assert {p: sorted(log) for p, log in logs.items()} == {
        p: sorted(b"s:%d:%d" % (p, i) for i in range(10)) for p in range(PARTITIONS)}


def test_a_micro_batch_retried_after_some_partitions_committed_commits_only_the_rest(
        cluster: BrokerCluster, seaweedfs: SeaweedS3) -> None:
    create_topics(cluster, "t")
    led = leaders(cluster, "t")
    first = [p for p in range(PARTITIONS) if led[p] == 2]
    # Batch 7 reached broker 2 alone (its answer lost, or the driver died), then the whole batch is
    # replayed, staged again by new tasks.
    early = commit_through_broker(cluster.bootstrap(), {}, stage(cluster, seaweedfs, "a", first), ("copy", 7))
    assert (early.committed, early.records) == (True, 10 * len(first))
    replay = commit_through_broker(cluster.bootstrap(), {}, stage(cluster, seaweedfs, "b", list(range(PARTITIONS))),
                                   ("copy", 7))
    assert (replay.committed, replay.records) == (True, 10 * (PARTITIONS - len(first)))
    again = commit_through_broker(cluster.bootstrap(), {}, stage(cluster, seaweedfs, "c", list(range(PARTITIONS))),
                                  ("copy", 7))
    assert (again.committed, again.records) == (False, 0), "a batch committed everywhere writes nothing"
    logs = topic_log(cluster, "t")
    for p in range(PARTITIONS):
        assert sorted(logs[p]) == sorted(b"%s:%d:%d" % (b"a" if p in first else b"b", p, i) for i in range(10))
    store = open_object_store(cluster.objects, Path("."))
    assert not list(store.list(STAGING_PREFIX)), "the brokers delete the staged objects of a replay"


class Feeding(threading.Thread):
    """Produces ``count`` records to a topic (idempotent, acks=all), remembering the acknowledged ones."""

    def __init__(self, bootstrap: str, topic: str, count: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.count = bootstrap, topic, count
        self.acked: list[bytes] = []
        self.errors: list[str] = []

    def run(self) -> None:
        def delivered(error: Any, message: Any) -> None:
            if error is None:
                self.acked.append(message.value())
            else:
                self.errors.append(str(error))

        # Made and dropped here: a producer kept alive would knock on the brokers' ports after they stop.
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 5,
                             "enable.idempotence": True})
        for i in range(self.count):
            producer.produce(self.topic, value=b"in-%d" % i, partition=i % PARTITIONS, on_delivery=delivered)
            producer.poll(0)
        producer.flush(FAILOVER_S_MAX * 2)


def merged_manifest(cluster: BrokerCluster) -> Manifest:
    """The cluster's objects as a reader sees them: every broker's manifests merged."""
    store = open_object_store(cluster.objects, Path("."))
    try:
        return read_manifest(store)
    finally:
        store.close()


def uploaded(cluster: BrokerCluster, topic: str) -> int:
    """Records of ``topic`` the merged manifest covers."""
    try:
        manifest = merged_manifest(cluster)
    except ManifestError:
        return 0
    return sum(s.end_offset - s.start_offset for s in manifest.streams.values()
               if s.name is not None and s.name.startswith(f"{topic}/"))


def shared_objects(cluster: BrokerCluster) -> int:
    """Objects of the merged manifest that hold blocks of more than one partition."""
    manifest = merged_manifest(cluster)
    streams_of: dict[str, set[int]] = {}
    for stream_id, refs in manifest.blocks.items():
        for ref in refs:
            streams_of.setdefault(ref.key, set()).add(stream_id)
    return sum(1 for streams in streams_of.values() if len(streams) > 1)


def refused_by_a_follower(cluster: BrokerCluster) -> None:
    """Ask a broker to swap an object of two partitions another broker leads: NOT_LEADER_OR_FOLLOWER."""
    manifest = merged_manifest(cluster)
    led = leaders(cluster, "events")
    leader_of_key: dict[str, set[int]] = {}
    for stream_id, refs in manifest.blocks.items():
        name = manifest.streams[stream_id].name or ""
        for ref in refs:
            leader_of_key.setdefault(ref.key, set()).add(led[int(name.split("/")[1])])
    key, owners = next((k, o) for k, o in sorted(leader_of_key.items()) if len(o) == 1)
    other = next(i for i in cluster.live() if i not in owners)
    # One of its streams rewritten as a compaction writes it, staged.
    stream_id, refs = next((sid, refs) for sid, refs in sorted(manifest.blocks.items()) if refs[0].key == key)
    output = CompactionOutput(0, f"{STAGING_PREFIX}refused/0.slo", stream_id, (refs[0],))
    staged = list(write_compacted(cluster.objects, [output]))
    with pytest.raises(BrokerWriteError, match=r"error 6\b"):
        replace_through_broker(cluster.bootstrap(other), {}, [key], [(o.key, o.size_bytes) for o in staged])


def test_every_partition_of_the_cluster_is_read_and_materialized_from_objects(
        spark: Any, cluster: BrokerCluster, seaweedfs: SeaweedS3) -> None:
    create_topics(cluster, "events")
    count = 30_000
    feeding = Feeding(cluster.bootstrap(), "events", count)
    feeding.start()
    feeding.join(FAILOVER_S_MAX * 2)
    assert len(feeding.acked) == count, feeding.errors[:5]
    wait_progressing(lambda: uploaded(cluster, "events") >= count, lambda: uploaded(cluster, "events"),
                     "every record in the merged manifest", STALL_S, 0.2)
    given = {**spark_options(cluster, seaweedfs), "topics": "events"}

    as_spark_passes = {k.lower(): v for k, v in given.items()}   # Spark lower-cases option names
    planned = [p.value for p in BrokerBatchReader(locate(as_spark_passes), as_spark_passes).partitions()]
    from_objects = sum(p.part.rows for p in planned if isinstance(p, ObjectsPartition))
    through_fetch = sum(p.rows for p in planned if isinstance(p, TailPartition))
    read_streams = {s.name for p in planned if isinstance(p, ObjectsPartition) for s in p.part.slices}
    assert (from_objects, through_fetch) == (count, 0), "every partition read from objects"
    assert read_streams == {f"events/{p}" for p in range(PARTITIONS)}
    read = spark.read.format("stratalog").options(**given).load()
    assert read.count() == count

    report = materialize(spark, f"kafka://{cluster.bootstrap()}", ["events"], options=spark_options(cluster, seaweedfs))
    assert report.rows == count
    creds = {k: v for k, v in spark_options(cluster, seaweedfs).items() if k != "path"}
    tables = load(spark, f"kafka://{cluster.bootstrap()}", ["events"], **creds)   # auto: no S3A here, pyarrow
    assert tables.count() == count
    assert sorted(r.value for r in tables.select("value").collect()) == sorted(feeding.acked)

    # Compaction: a broker refuses to swap objects of partitions another leads; `pipeline compact` sends
    # each broker the objects of its own, and every record reads the same from the per-stream objects.
    refused_by_a_follower(cluster)
    compacted = compact_live(spark, f"kafka://{cluster.bootstrap()}", options=creds)
    assert compacted.objects_replaced > 0 and compacted.objects_skipped == 0 and not compacted.refusals
    wait_until(lambda: shared_objects(cluster) == 0, "a manifest without objects of several partitions")
    assert sorted(r.value for r in spark.read.format("stratalog").options(**given).load().select("value")
                  .collect()) == sorted(feeding.acked)

    # Without credentials (the brokers advertise their store without them): a read falls back to Fetch,
    # a write says what it needs.
    assert not os.environ.get("AWS_ACCESS_KEY_ID"), "this test reads as a driver without S3 credentials"
    plain = {"path": f"kafka://{cluster.bootstrap()}", "topics": "events"}
    fallback = [p.value for p in BrokerBatchReader(locate(plain), plain).partitions()]
    assert sum(p.rows for p in fallback if isinstance(p, TailPartition)) == count
    assert spark.read.format("stratalog").options(**plain).load().count() == count
    rows = spark.createDataFrame([("x",)], "value string").write.format("stratalog").option("path", plain["path"])
    with pytest.raises(Exception, match=r"s3\.accessKey and s3\.secretKey"):
        rows.option("topic", "events").mode("append").save()
    print(f"{count} records over {PARTITIONS} partitions of 3 brokers: planned {from_objects} from objects, "
          f"{through_fetch} through Fetch; materialize wrote {report.rows} in {report.files_written} files")
