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
    from kafka import KafkaProducer

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
