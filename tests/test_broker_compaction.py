"""Compacted topics (cleanup.policy=compact) through a real broker and librdkafka: the latest value of each
key across a kill -9 in the middle of a pass, tombstones kept for delete.retention.ms and then gone,
consumers positioned before a pass reading on, and a record without a key refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from brokerkit import BrokerProcess, metrics_address, read_partition, running_broker, scrape_metrics
from waiting import WAIT_S, wait_until

KEYS = 200
ROUNDS = 15
#: Keys whose last record is a tombstone.
DELETED = range(0, KEYS, 10)
#: A pass reads and rewrites its input 4 KiB at a time, at most 64 KiB a second: a few seconds long, so a
#: kill -9 lands in its middle, between two of its commits.
SLOW_CLEANER = ("log_cleaner_interval_ms = 100\nproducer_snapshot_interval_ms = 200\n"
                "[store]\nupload_interval_s = 0.2\n"
                "[store.cleaner]\nrewrite_bytes_max = 4096\nread_bytes_per_s_max = 65536\n")


def broker_config(tmp_path: Path, text: str) -> tuple[str, str]:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return "--config", str(path)


def create_compacted(bootstrap: str, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, 1, config={"cleanup.policy": "compact", **configs})
    for future in admin.create_topics([new]).values():
        future.result(WAIT_S)


def set_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(WAIT_S)


def produce(bootstrap: str, topic: str, uploaded: Callable[[], bool] | None = None) -> dict[bytes, bytes | None]:
    """KEYS keys, ROUNDS values each, the last of the DELETED keys a tombstone; what each key ends as.
    With ``uploaded``, each round waits for it (a block of its own in object storage)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    latest: dict[bytes, bytes | None] = {}
    for r in range(ROUNDS):
        for k in range(KEYS):
            key = f"key-{k}".encode()
            value = None if r == ROUNDS - 1 and k in DELETED else f"value-{r}-{k}-".encode() * 4
            producer.produce(topic, key=key, value=value)
            latest[key] = value
        assert producer.flush(WAIT_S) == 0
        if uploaded is not None:
            wait_until(uploaded, f"round {r} in object storage")
    return latest


def consume(bootstrap: str, topic: str, offset: int, until: int) -> list[Any]:
    """The records of partition 0 from ``offset`` up to the end offset ``until``."""
    return read_partition(bootstrap, topic, 0, offset, until)


def gauge(broker: BrokerProcess, name: str) -> float:
    return counter(broker, name)


def counter(broker: BrokerProcess, name: str) -> float:
    return sum(v for (n, _), v in scrape_metrics(metrics_address(broker.output)).items() if n == name)


def test_a_kill9_mid_pass_leaves_the_latest_value_of_each_key(tmp_path: Path) -> None:
    args = (*broker_config(tmp_path, SLOW_CLEANER), "--metrics-listen", "127.0.0.1:0")
    with running_broker(tmp_path / "data", *args) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic("state", 1)]).values():
            future.result(WAIT_S)
        # A block a round: a pass then commits its rewrite in pieces, one block each.
        latest = produce(broker.bootstrap, "state", lambda: gauge(broker, "stratalog_upload_lag_ms") == 0)
        end = KEYS * ROUNDS
        assert len(consume(broker.bootstrap, "state", 0, end)) == end
        # Compacted from now on: a pass over every record produced, all uploaded by now or soon.
        set_config(broker.bootstrap, "state", "cleanup.policy", "compact")
        wait_until(lambda: counter(broker, "stratalog_cleaner_bytes_read_total") > 0,
                   "the first piece of the first pass to commit")
        assert counter(broker, "stratalog_cleaner_passes_total") == 0, "the pass is still under way"
        broker.kill9()
    with running_broker(tmp_path / "data", *args) as broker:
        wait_until(lambda: counter(broker, "stratalog_cleaner_passes_total") >= 1, "a whole pass after the restart")
        after = consume(broker.bootstrap, "state", 0, end)
        assert {m.key(): m.value() for m in after} == latest
        assert len(after) == KEYS, "one record a key: the tombstones are kept (delete.retention.ms: a day)"
        offsets = [m.offset() for m in after]
        assert offsets == sorted(offsets) and offsets[-1] == end - 1, "offsets kept, with gaps"
        # A consumer positioned before the pass (in what it removed) reads on from there without error.
        tail = consume(broker.bootstrap, "state", 1234, end)
        assert [m.offset() for m in tail] == [o for o in offsets if o >= 1234]


def test_tombstones_go_after_delete_retention(tmp_path: Path) -> None:
    fast = "log_cleaner_interval_ms = 100\nproducer_snapshot_interval_ms = 200\n[store]\nupload_interval_s = 0.2\n"
    with running_broker(tmp_path / "data", *broker_config(tmp_path, fast), "--metrics-listen", "127.0.0.1:0") \
            as broker:
        # A pass covers what is uploaded (and under the producers' snapshot) when it starts: on a slow machine
        # the first may end before the last round. Any dirty byte makes the next pass due (ratio 0).
        create_compacted(broker.bootstrap, "state", **{"delete.retention.ms": "1", "min.cleanable.dirty.ratio": "0"})
        latest = produce(broker.bootstrap, "state")
        live = {k: v for k, v in latest.items() if v is not None}
        assert len(live) == KEYS - len(DELETED)

        def read() -> dict[bytes, bytes | None]:
            return {m.key(): m.value() for m in consume(broker.bootstrap, "state", 0, KEYS * ROUNDS)}

        wait_until(lambda: None not in read().values(), "a pass over the tombstones of the last round")
        assert counter(broker, "stratalog_cleaner_passes_total") >= 1
        assert read() == live


def test_a_record_without_a_key_is_refused_by_a_compacted_topic(tmp_path: Path) -> None:
    with running_broker(tmp_path / "data") as broker:
        create_compacted(broker.bootstrap, "state")
        errors: list[Any] = []
        producer = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0})
        producer.produce("state", value=b"no key", on_delivery=lambda e, m: errors.append(e))
        assert producer.flush(WAIT_S) == 0   # a batch of its own: a refusal is the whole batch's, as Kafka's
        producer.produce("state", key=b"k", value=b"keyed", on_delivery=lambda e, m: errors.append(e))
        assert producer.flush(WAIT_S) == 0
        assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD, errors[0]
        assert errors[1] is None


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_compact_is_accepted_with_or_without_delete(tmp_path: Path, policy: str) -> None:
    with running_broker(tmp_path / "data") as broker:
        create_compacted(broker.bootstrap, "t", **{"cleanup.policy": policy})
