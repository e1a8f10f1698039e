"""The Spark data source against a broker whose objects are in S3 (SeaweedFS), from a driver without S3
credentials in its environment: reads fall back to Kafka Fetch (coldReads=auto) or say what they need
(coldReads=objects); the s3.accessKey / s3.secretKey options let reads and writes use the store."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import BrokerProcess, running_broker
from conftest import SeaweedS3
from stratalog.engine.manifest import ManifestError, read_manifest
from stratalog.objects.uri import open_object_store
from waiting import wait_until

pytestmark = pytest.mark.slow

TOPIC, PARTITIONS, RECORDS = "events", 2, 200


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, seaweedfs: SeaweedS3) -> Iterator[tuple[BrokerProcess, str]]:
    assert not os.environ.get("AWS_ACCESS_KEY_ID"), "these tests read as a driver without S3 credentials"
    root = tmp_path_factory.mktemp("s3-broker")
    query = urlencode({"endpoint": seaweedfs.endpoint_url, "region": seaweedfs.region,
                       "access_key": seaweedfs.access_key, "secret_key": seaweedfs.secret_key})
    uri = f"s3://{seaweedfs.bucket}/broker-{secrets.token_hex(4)}?{query}"
    config = root / "broker.toml"
    config.write_text("[store]\nupload_interval_s = 0.2\n")
    with running_broker(root / "data", "--object-store", uri, "--config", str(config)) as process:
        admin = AdminClient({"bootstrap.servers": process.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS)])[TOPIC].result(30)
        producer = Producer({"bootstrap.servers": process.bootstrap, "acks": "all"})
        for i in range(RECORDS):
            producer.produce(TOPIC, value=b"v%d" % i, partition=i % PARTITIONS)
        assert producer.flush(60) == 0
        store = open_object_store(uri, root)
        wait_until(lambda: uploaded(store) >= RECORDS, "every record uploaded to the S3 store")
        store.close()
        yield process, seaweedfs.access_key + ":" + seaweedfs.secret_key
        assert process.stop() == 0, "".join(process.output)


def uploaded(store: Any) -> int:
    try:
        return sum(s.end_offset - s.start_offset for s in read_manifest(store).streams.values())
    except ManifestError:
        return 0


def read(spark: Any, bootstrap: str, topic: str, **options: str) -> list[bytes]:
    reader = spark.read.format("stratalog").option("path", f"kafka://{bootstrap}").option("topics", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return sorted(bytes(r.value) for r in reader.load().collect())


def credentials(keys: str) -> dict[str, str]:
    access, secret = keys.split(":")
    return {"s3.accessKey": access, "s3.secretKey": secret}


def test_a_read_without_credentials_falls_back_to_fetch_or_says_what_it_needs(
        spark: Any, broker: tuple[BrokerProcess, str]) -> None:
    process, _ = broker
    expected = sorted(b"v%d" % i for i in range(RECORDS))
    assert read(spark, process.bootstrap, TOPIC) == expected, "coldReads=auto: everything through Fetch"
    with pytest.raises(Exception, match=r"s3\.accessKey and s3\.secretKey"):
        read(spark, process.bootstrap, TOPIC, coldReads="objects")


def test_credentials_given_as_options_read_the_uploaded_records_from_objects(
        spark: Any, broker: tuple[BrokerProcess, str]) -> None:
    process, keys = broker
    expected = sorted(b"v%d" % i for i in range(RECORDS))
    assert read(spark, process.bootstrap, TOPIC, coldReads="objects", **credentials(keys)) == expected
    with pytest.raises(Exception, match="cannot be read from here"):
        read(spark, process.bootstrap, TOPIC, coldReads="objects", **{"s3.accessKey": "nobody",
                                                                       "s3.secretKey": "wrong"})


def test_a_write_without_credentials_says_what_it_needs_and_one_with_them_writes(
        spark: Any, broker: tuple[BrokerProcess, str], tmp_path: Path) -> None:
    process, keys = broker
    admin = AdminClient({"bootstrap.servers": process.bootstrap})
    admin.create_topics([NewTopic("written", 1)])["written"].result(30)
    rows = spark.createDataFrame([(f"row-{i}",) for i in range(50)], "value string")
    writer = rows.write.format("stratalog").option("path", f"kafka://{process.bootstrap}").option("topic", "written")
    with pytest.raises(Exception, match=r"s3\.accessKey and s3\.secretKey"):
        writer.mode("append").save()
    for name, value in credentials(keys).items():
        writer = writer.option(name, value)
    writer.mode("append").save()
    assert read(spark, process.bootstrap, "written", coldReads="broker") == sorted(b"row-%d" % i for i in range(50))


def test_materialized_tables_on_s3_are_read_without_the_s3a_connector(
        spark: Any, broker: tuple[BrokerProcess, str]) -> None:
    from stratalog.spark.materialize import load, materialize

    process, keys = broker
    path = f"kafka://{process.bootstrap}"
    report = materialize(spark, path, [TOPIC], options=credentials(keys))
    assert report.rows == RECORDS and report.files_written >= PARTITIONS
    rows = load(spark, path, [TOPIC], **credentials(keys)).collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(b"v%d" % i for i in range(RECORDS))
    assert sorted((r.stream, r.offset) for r in rows) == sorted(
        (f"{TOPIC}/{i % PARTITIONS}", i // PARTITIONS) for i in range(RECORDS))
    with pytest.raises(Exception, match="s3a"):   # this session has no hadoop-aws: Spark's reader cannot
        load(spark, path, [TOPIC], tableReader="spark", **credentials(keys)).collect()
