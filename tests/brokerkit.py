"""A real `stratalog serve` for tests: a child process on 127.0.0.1, stopped by the test."""

import re
import urllib.request
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from stratalog.chaos.broker_process import BrokerProcess, running_broker, start_broker

__all__ = ["BrokerProcess", "console_address", "metrics_address", "read_partition", "running_broker",
           "scrape_metrics", "start_broker"]

Sample = tuple[str, tuple[tuple[str, str], ...]]


def metrics_address(output: list[str]) -> str:
    """``http://HOST:PORT`` of the metrics endpoint a broker's banner names."""
    found = re.search(r"metrics on (\S+)/metrics", "".join(output))
    assert found, "".join(output)
    return found.group(1)


def scrape_metrics(address: str) -> dict[Sample, float]:
    """Every sample of ``address``'s /metrics, by name and sorted labels."""
    with urllib.request.urlopen(f"{address}/metrics", timeout=60) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def console_address(output: list[str]) -> str:
    """``http://HOST:PORT`` of the web console a broker's banner names."""
    found = re.search(r"console on (http://\S+)/", "".join(output))
    assert found, "".join(output)
    return found.group(1)


def read_partition(bootstrap: str, topic: str, partition: int, offset: int, until: int) -> list[Any]:
    """The messages of one partition from ``offset`` until the consumer's position reaches the end offset
    ``until`` (librdkafka, no group: offsets gapped by compaction included)."""
    from waiting import wait_until

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}-{partition}-{offset}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, partition, offset)])
    got: list[Any] = []
    try:
        def at_end() -> bool:
            message = consumer.poll(1.0)
            if message is None:
                return False
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return bool(consumer.position([TopicPartition(topic, partition)])[0].offset >= until)
            got.append(message)
            return False
        wait_until(at_end, f"the records of {topic}-{partition} from {offset} to {until}", poll_s=0)
    finally:
        consumer.close()
    return got
