"""Topics that log compaction rewrote, read through Spark: the data source (a store at rest, or a broker
serving it, from objects or through Kafka Fetch) and materialize give exactly the records
``Stream.fetch`` gives, at their offsets, gaps and emptied batches included."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from brokerkit import running_broker
from stratalog.engine import NewRecord, Stream, StreamStore
from stratalog.engine.cleaner import CleanPolicy
from stratalog.engine.config import CleanerBounds, StoreConfig
from stratalog.kafka.records import Compression, encode_batch
from stratalog.objects.local import LocalDirStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.spark.materialize import load, materialize
from stratalog.spark.tables import read_table_manifest
from test_spark_broker_read import broker_config, create_topic, uploaded
from waiting import wait_until

pytestmark = pytest.mark.slow

T0_MS = 1_700_000_000_000
#: Clean whatever is dirty; tombstones are kept an hour after their timestamp.
EAGER = CleanPolicy(delete_retention_ms=3_600_000, min_cleanable_dirty_ratio=0.0)
#: When the pass runs: the tombstones written at T0_MS are past their retention, the later ones are not.
CLEANED_AT_MS = T0_MS + 3_600_000 + 500_000

Row = tuple[str, int, int, bytes | None, bytes, tuple[tuple[str, bytes | None], ...]]


def produce(stream: Stream, records: list[tuple[bytes | None, bytes | None]], t0_ms: int, per_batch: int,
            codecs: list[Compression]) -> None:
    """Kafka batches of ``per_batch`` (key, value) records, one header each, timestamps one ms apart, the
    batches compressed with each of ``codecs`` in turn."""
    for n, i in enumerate(range(0, len(records), per_batch)):
        chunk = records[i:i + per_batch]
        fields = [(k, v, (("n", b"%d" % (i + j)),), t0_ms + i + j) for j, (k, v) in enumerate(chunk)]
        batch = encode_batch(fields, base_offset=0, compression=codecs[n % len(codecs)])
        stream.append_kafka(batch, len(chunk), t0_ms + i + len(chunk) - 1).result()


def fill(store: StreamStore) -> None:
    """Topic ``t``: two partitions of keyed records, rewritten several times, with tombstones old and new and
    records of no key, the store's own encoding among them; topic ``gone``: every key deleted long ago. Each
    part uploaded on its own, so that streams have several blocks; then compacted."""
    codecs = list(Compression)
    for p in range(2):
        s = store.create_stream(f"t/{p}")
        rounds = [(b"k%d" % (k % 9) if k % 11 else None, b"v%d-%d" % (p, k)) for k in range(120)]
        produce(s, rounds[:60], T0_MS, 7, codecs)
        store.flush()
        produce(s, rounds[60:], T0_MS + 60, 7, codecs)
        produce(s, [(b"k%d" % k, None) for k in range(0, 9, 3)], T0_MS, 2, codecs)  # tombstones, expired
        store.flush()
        s.append([NewRecord(b"own-%d" % i, key=b"k%d" % (i % 4), timestamp_ms=T0_MS + 1000 + i,
                            headers=(("h", b"x"),)) for i in range(6)]).result()
        produce(s, [(b"k1", None), (b"k8", b"last")], T0_MS + 3_600_000, 1, codecs)  # a tombstone still kept
        store.flush()
    gone = store.create_stream("gone/0")
    produce(gone, [(b"a%d" % k, b"x") for k in range(30)], T0_MS, 4, codecs)
    store.flush()
    produce(gone, [(b"a%d" % k, None) for k in range(30)], T0_MS, 5, codecs)
    store.flush()
    for stream in store.streams():
        store.clean_stream(stream, EAGER, now_ms=CLEANED_AT_MS)


def fetched(store: StreamStore, name: str) -> list[Row]:
    """Every record of the stream ``name`` as ``Stream.fetch`` gives it."""
    s = store.open_stream(name)
    out: list[Row] = []
    pos = s.start_offset
    while pos < s.end_offset:
        got = s.fetch(pos)
        if not got:
            break
        out += [(name, r.offset, r.timestamp_ms, r.key, r.value, tuple(r.headers)) for r in got]
        pos = got[-1].offset + 1
    return out


def rows_of(df: Any) -> list[Row]:
    # (Spark gives timestamps as naive datetimes in the session's time zone, the machine's.)
    return sorted((r.stream, r.offset, round(r.timestamp.timestamp() * 1000), r.key, r.value,
                   tuple((h.key, h.value) for h in r.headers)) for r in df.collect())


@pytest.fixture
def compacted(tmp_path: Path) -> tuple[str, list[Row]]:
    """A store at rest whose topics were compacted, and every record ``Stream.fetch`` gives."""
    # Each block of the input rewritten on its own: the streams keep several blocks, for plans to cut between.
    config = StoreConfig(cleaner=CleanerBounds(rewrite_bytes_max=1, read_bytes_per_s_max=None))
    with StreamStore.open(tmp_path / "d", config=config) as store:
        fill(store)
        expected = sorted(row for name in ("t/0", "t/1", "gone/0") for row in fetched(store, name))
        ends = {s.name: s.end_offset for s in store.streams()}
    assert ends == {"t/0": 131, "t/1": 131, "gone/0": 60}, "compaction moves no offsets"
    assert 10 < len(expected) < 100 and not [r for r in expected if r[0] == "gone/0"], "gaps, and a topic emptied"
    return str(tmp_path / "d"), expected


def test_the_data_source_reads_a_compacted_store_as_stream_fetch(spark: Any, compacted: tuple[str, list[Row]]) -> None:
    path, expected = compacted
    reader = spark.read.format("stratalog").option("path", path).option("includeHeaders", "true")
    assert rows_of(reader.load()) == expected
    # Small partitions: plans cut between blocks, some starting or ending with offsets compaction emptied.
    assert rows_of(reader.option("rowsPerPartition", "5").load()) == expected
    narrowed = reader.load().where("stream = 't/1' AND offset >= 40 AND offset < 125")
    assert rows_of(narrowed) == [r for r in expected if r[0] == "t/1" and 40 <= r[1] < 125]


def test_materialize_writes_a_compacted_store_as_stream_fetch(spark: Any, compacted: tuple[str, list[Row]]) -> None:
    path, expected = compacted
    report = materialize(spark, path, file_rows_max=20)
    assert report.rows == len(expected), "the records written, not the offsets"
    assert rows_of(load(spark, path, includeHeaders="true")) == expected
    objects = LocalDirStore(Path(path) / LOCAL_DIR_NAME)
    emptied = read_table_manifest(objects, "gone")
    assert emptied.ends() == {0: 60} and all("/1970-01-01/" in f.key and f.min_timestamp_ms == -1
                                             for f in emptied.files), "the emptied topic's offsets: files of no rows"
    files = [str(Path(path) / LOCAL_DIR_NAME / f.key) for topic in ("t", "gone")
             for f in read_table_manifest(objects, topic).files]
    assert rows_of(spark.read.parquet(*files)) == expected, "the files alone, through Spark's Parquet reader"


def test_a_broker_serves_a_compacted_topic_to_spark_as_stream_fetch(spark: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_broker(data, "--config", str(broker_config(tmp_path, 0.3))) as broker:
        create_topic(broker.bootstrap, "t", 3)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(600):   # keys rewritten many times, some deleted; the last record of each partition kept
            value = None if i % 50 == 7 else b"v%d" % i
            producer.produce("t", key=b"k%d" % (i % 13), value=value, partition=i % 2, headers=[("n", b"%d" % i)])
        # Partition 2 ends with tombstones old enough to go: its last offsets hold no record once compacted.
        old_ms = int(time.time() * 1000) - 2 * EAGER.delete_retention_ms
        for i in range(40):
            producer.produce("t", key=b"k%d" % (i % 5), value=b"v" if i < 35 else None, partition=2, timestamp=old_ms)
        assert producer.flush(30) == 0
        del producer
        wait_until(lambda: uploaded(broker) >= 640, "the records to be uploaded")
        assert broker.stop() == 0
    with StreamStore.open(data) as store:   # compacted at rest, between two runs of the broker
        for p in range(3):
            store.clean_stream(store.open_stream(f"t/{p}"), EAGER, now_ms=int(time.time() * 1000))
        expected = sorted(row for p in range(3) for row in fetched(store, f"t/{p}"))
    assert len(expected) == 2 * 13, "the latest record of each key, tombstones among them; none in partition 2"
    with running_broker(data, "--config", str(broker_config(tmp_path, 0.3))) as broker:
        reader = spark.read.format("stratalog").option("path", f"kafka://{broker.bootstrap}") \
            .option("includeHeaders", "true")
        assert rows_of(reader.load()) == expected, "from the broker's objects"
        assert rows_of(reader.option("coldReads", "broker").load()) == expected, "through Kafka Fetch"
        assert broker.stop() == 0
