"""ListOffsets: earliest, latest, by timestamp and the record with the largest timestamp (v7)."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from brokerkit import running_broker
from stratalog.engine import NewRecord, StreamStore

#: Timestamps out of order: the largest is in the middle, and appears twice.
STAMPS = [1_000, 5_000, 3_000, 9_000, 2_000, 9_000, 4_000]


def test_list_offsets_finds_earliest_latest_by_time_and_the_largest_timestamp(tmp_path: Path) -> None:
    with running_broker(tmp_path / "data") as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
        for i, ts in enumerate(STAMPS):
            producer.produce("times", value=b"%d" % i, partition=0, timestamp=ts)
            producer.flush(30)  # one batch each: the largest timestamp sits inside the log, not at its end
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        tp = TopicPartition("times", 0)

        def offset_of(spec: OffsetSpec) -> tuple[int, int]:
            result = admin.list_offsets({tp: spec})[tp].result(30)
            return result.offset, result.timestamp

        assert offset_of(OffsetSpec.earliest())[0] == 0
        assert offset_of(OffsetSpec.latest())[0] == len(STAMPS)
        assert offset_of(OffsetSpec.for_timestamp(2_500)) == (1, 5_000), "the first record at or after 2.5 s"
        assert offset_of(OffsetSpec.max_timestamp()) == (3, 9_000), "the first record with the largest time"


def test_latest_timestamp_spans_uploaded_blocks_and_the_log_cache(tmp_path: Path) -> None:
    store = StreamStore.open(tmp_path / "s")
    stream = store.create_stream("s")
    assert stream.latest_timestamp() is None
    stream.append([NewRecord(b"a", timestamp_ms=10), NewRecord(b"b", timestamp_ms=70)]).result()
    store.flush()  # in objects now
    stream.append([NewRecord(b"c", timestamp_ms=50)]).result()
    assert stream.latest_timestamp() == (1, 70)
    stream.append([NewRecord(b"d", timestamp_ms=90), NewRecord(b"e", timestamp_ms=90)]).result()
    assert stream.latest_timestamp() == (3, 90), "the log cache's later maximum, its first record"
    store.close()
