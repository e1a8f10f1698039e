"""Spark reads topics produced through Kafka clients, beside records appended with the Python API."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from brokerkit import running_broker
from stratalog.engine import NewRecord, StreamStore
from stratalog.objects.uri import LOCAL_DIR_NAME

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

pytestmark = pytest.mark.slow


def test_spark_reads_kafka_produced_and_python_appended_records_in_offset_order(spark: Any, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    expected: list[tuple[str, int, bytes | None, bytes, list[tuple[str, bytes]]]] = []
    with running_broker(data_dir) as broker:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", compression_type="gzip",
                                 linger_ms=5)
        for i in range(300):
            key = None if i % 5 == 0 else b"k%d" % i
            headers = [("n", b"%d" % i)] if i % 3 == 0 else []
            meta = producer.send("clicks", key=key, value=b"kafka-%d" % i, headers=headers, partition=0).get(30)
            expected.append(("clicks/0", meta.offset, key, b"kafka-%d" % i, headers))
        producer.close()
        assert broker.stop() == 0
    store = StreamStore.open(data_dir)
    stream = store.open_stream("clicks/0")
    base = stream.append([NewRecord(b"python-%d" % i, key=b"p", headers=[("h", b"x")]) for i in range(20)]).result()
    expected += [("clicks/0", base + i, b"p", b"python-%d" % i, [("h", b"x")]) for i in range(20)]
    store.flush()
    store.close()

    df = spark.read.format("stratalog").option("path", str(data_dir / LOCAL_DIR_NAME)) \
        .option("includeHeaders", "true").load()
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [(r.stream, r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in rows] == expected
    assert [r.offset for r in rows] == list(range(320)), "offsets are dense across both kinds of batch"


SPARK_MD = Path(__file__).resolve().parent.parent / "docs" / "spark.md"
#: The address docs/spark.md's examples use: each test run's broker listens elsewhere.
DOCS_ADDRESS = "kafka://127.0.0.1:9092"


def test_the_python_examples_of_docs_spark_md_run_as_written(spark: Any, tmp_path: Path) -> None:
    """Each block in turn, in one namespace, as a reader would paste them: the reads, the batch and the
    streaming write (given the DataFrames they name), materialize's load, then the store at rest."""
    import re

    from stratalog.spark.materialize import materialize

    read, write, load, at_rest = re.findall(r"```python\n(.*?)```", SPARK_MD.read_text(), re.DOTALL)
    names: dict[str, Any] = {}
    # The examples' relative paths are relative to where Spark started (its Python workers resolve them),
    # so here they are given under this test's directory; the address is this run's broker.
    places = {DOCS_ADDRESS: "", '"data"': repr(str(tmp_path / "data")), '"ck"': repr(str(tmp_path / "ck"))}

    def run(block: str) -> None:
        for written, here in places.items():
            block = block.replace(written, here)
        exec(compile(block, str(SPARK_MD), "exec"), names)

    with running_broker(tmp_path / "data") as broker:
        address = places[DOCS_ADDRESS] = f"kafka://{broker.bootstrap}"

        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        for i in range(30):
            producer.send("clicks", key=b"user-%d" % (i % 4), value=b"click-%d" % i)
        producer.flush(30)
        producer.close()
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)  # a write's topic exists first (spark.md)
        admin.create_topics([NewTopic("out", 2, 1)])
        admin.close()
        run(read)
        assert names["clicks"].count() == 30 and names["live"].isStreaming
        names["events"] = spark.createDataFrame([(b"user-9", b"event-%d" % i) for i in range(10)],
                                                "key binary, value binary")
        names["stream"] = names["live"].select("key", "value")
        run(write)
        (query,) = spark.streams.active
        query.processAllAvailable()
        query.stop()
        clicks = spark.read.format("stratalog").option("path", address).option("topics", "clicks").load()
        assert sorted(r.value for r in clicks.collect()) == sorted(
            [b"click-%d" % i for i in range(30)] + [b"event-%d" % i for i in range(10)])
        out = spark.read.format("stratalog").option("path", address).option("topics", "out").load()
        assert {r.value for r in out.collect()} >= {b"click-%d" % i for i in range(30)}
        materialize(spark, address, ["clicks"])  # the sh block's first line (its own process has its own JVM)
        run(load)
        assert names["clicks"].count() == 40
        assert broker.stop() == 0
    names["rows"] = spark.createDataFrame([("clicks/0", b"at rest")], "stream string, value binary")
    run(at_rest)
    at_rest_clicks = names["df"].where("stream LIKE 'clicks/%'").collect()
    assert len(at_rest_clicks) == 41 and b"at rest" in {r.value for r in at_rest_clicks}
