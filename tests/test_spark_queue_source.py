"""Queue reads and exports through the stratalog data source in the local[2] Spark session."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from conftest import SeaweedS3
from queuekit import small_queue_config
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.queues import QueueStore
from stratalog.spark import jobs
from waiting import wait_until

pytestmark = pytest.mark.slow
QUEUES = 3000
ROUNDS = 7
Model = dict[str, list[bytes]]


@pytest.fixture(scope="module")
def merged_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Model]:
    """A queue store of QUEUES queues written in ROUNDS uploads, then merged; its object URI and contents."""
    path = tmp_path_factory.mktemp("queue-store")
    model: Model = {}
    config = small_queue_config(compact_fanout=3, upload_idle_s=0.01)
    with QueueStore.open(path, config=config) as qs:
        for r in range(ROUNDS - 1):
            _put_round(qs, model, r)
        wait_until(lambda: qs.compactions >= 2 and not qs.compactor.retiring, "two merges, their sources deleted")
    # One more upload that no merge takes: the read spans merged objects and a later upload.
    with QueueStore.open(path, config=small_queue_config(compact_fanout=0, upload_idle_s=0.01)) as qs:
        _put_round(qs, model, ROUNDS - 1)
        keys = [o.key for o in qs.log_cache.view.objects]
        assert len(keys) >= 2 and "-" in keys[0], keys
    return str(path / LOCAL_DIR_NAME), model


def _put_round(qs: QueueStore, model: Model, r: int) -> None:
    """Round ``r``: more queues each round, three in four of them get a message; one upload."""
    names = [f"q{i:05d}" for i in range(QUEUES * (r + 1) // ROUNDS) if (i * 7 + r) % 4]
    _upload(qs, model, names, [b"%s/%d/%s" % (n.encode(), r, b"y" * (i % 23)) for i, n in enumerate(names)])


def _upload(qs: QueueStore, model: Model, names: list[str], messages: list[bytes]) -> None:
    """Put ``messages`` on ``names``, flush, and wait until they are uploaded."""
    qs.put_many(names, messages)
    for n, m in zip(names, messages, strict=True):
        model.setdefault(n, []).append(m)
    qs.flush()
    wait_until(lambda: not qs.stats()["log_cache_records"], "the messages to be uploaded")


def _queues(spark: Any, uri: str, queues: str = "*", **options: str) -> Any:
    r = spark.read.format("stratalog").option("path", uri).option("queues", queues)
    for name, value in options.items():
        r = r.option(name, value)
    return r.load()


def _expected(model: Model, names: set[str] | None = None) -> list[tuple[str, int, bytes]]:
    return sorted((n, o, m) for n, ms in model.items() if names is None or n in names for o, m in enumerate(ms))


def test_spark_reads_every_queue_message_of_merged_objects(spark: Any, merged_store: tuple[str, Model]) -> None:
    uri, model = merged_store
    df = _queues(spark, uri, rowsPerPartition="2000")
    assert df.schema.simpleString() == \
        "struct<stream:string,offset:bigint,timestamp:timestamp,key:binary,value:binary>"
    assert 2 < df.rdd.getNumPartitions() < QUEUES // 10
    rows = df.collect()
    assert sorted((r.stream, r.offset, bytes(r.value)) for r in rows) == _expected(model)
    assert all(r.timestamp is None and r.key is None for r in rows)


def test_spark_filters_queues_by_name(spark: Any, merged_store: tuple[str, Model]) -> None:
    from pyspark.sql.functions import col

    uri, model = merged_store
    df = _queues(spark, uri).filter(col("stream").isin("q00001", "q02998") & (col("offset") >= 1))
    got = sorted((r.stream, r.offset, bytes(r.value)) for r in df.collect())
    assert got == [row for row in _expected(model, {"q00001", "q02998"}) if row[1] >= 1]
    listed = _queues(spark, uri, "q00005,q00006").groupBy("stream").count().collect()
    assert {r.stream: r["count"] for r in listed} == {n: len(model[n]) for n in ("q00005", "q00006")}
    assert _queues(spark, uri).filter(col("timestamp").isNotNull()).count() == 0


def test_export_writes_queues_to_parquet_partitioned_by_queue(spark: Any, merged_store: tuple[str, Model],
                                                              tmp_path: Path) -> None:
    uri, model = merged_store
    out = tmp_path / "export"
    report = jobs.export(spark, uri, str(out), queues="q00010,q00011,q00013")
    wanted = {"q00010", "q00011", "q00013"}
    assert report.rows == len(_expected(model, wanted))
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(f"stream={n}" for n in wanted)
    exported = sorted((r.stream, r.offset, bytes(r.value)) for r in spark.read.parquet(str(out)).collect())
    assert exported == _expected(model, wanted)
    with pytest.raises(ValueError, match="not both"):
        jobs.export(spark, uri, str(out), streams="a", queues="*")


def test_spark_reads_queues_from_an_s3_store(spark: Any, seaweedfs: SeaweedS3, tmp_path: Path) -> None:
    query = urlencode({"endpoint": seaweedfs.endpoint_url, "region": seaweedfs.region,
                       "access_key": seaweedfs.access_key, "secret_key": seaweedfs.secret_key})
    uri = f"s3://{seaweedfs.bucket}/queues-{secrets.token_hex(6)}?{query}"
    model: Model = {}
    with QueueStore.open(tmp_path / "q", uri, config=small_queue_config(compact_fanout=2, upload_idle_s=0.01)) as qs:
        for r in range(4):
            names = [f"s3q{i:04d}" for i in range(400) if (i + r) % 3]
            _upload(qs, model, names, [b"%s/%d" % (n.encode(), r) for n in names])
        wait_until(lambda: qs.compactions >= 1, "a merge")
    rows = _queues(spark, uri, rowsPerPartition="300").collect()
    assert sorted((r.stream, r.offset, bytes(r.value)) for r in rows) == _expected(model)
