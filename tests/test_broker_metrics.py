"""`serve --metrics-listen`: Prometheus metrics that move by exactly what was sent, and the probes an
orchestrator asks (/healthz, /readyz), against a real broker and a real Kafka client."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path

from click.testing import CliRunner

from brokerkit import BrokerProcess, metrics_address, running_broker, scrape_metrics
from stratalog.cli import cli
from stratalog.commands.serve import serve
from waiting import WAIT_S, wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaStorageError

RECORDS = 500
VALUE_BYTES = 100


DOCS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def endpoint(broker: BrokerProcess) -> str:
    return metrics_address(broker.output)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=WAIT_S) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return scrape_metrics(base)


def test_the_counters_move_by_exactly_what_was_produced_and_the_probes_answer(tmp_path: Path) -> None:
    with running_broker(tmp_path / "data", "--metrics-listen", "127.0.0.1:0") as broker:
        base = endpoint(broker)
        assert get(f"{base}/healthz") == (200, "ok\n")
        assert get(f"{base}/readyz") == (200, "ready\n")
        assert get(f"{base}/nothing")[0] == 404
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
        for i in range(RECORDS):
            producer.send("measured", f"{i:0{VALUE_BYTES}d}".encode())
        producer.flush()
        producer.close()
        group = f"g-{uuid.uuid4().hex}"
        consumer = KafkaConsumer("measured", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                                 group_id=group, enable_auto_commit=False, consumer_timeout_ms=1000)
        got: list[bytes] = []
        wait_until(lambda: got.extend(r.value for r in consumer) or len(got) >= RECORDS or None,
                   "every record consumed", poll_s=0)
        consumer.commit()
        consumer.close()
        lag = ("kafka_consumergroup_lag", (("consumergroup", group), ("partition", "0"), ("topic", "measured")))
        read = scrape(base)
        assert read[lag] == 0, "the group read everything and committed"
        topic = (("topic", "measured"),)
        assert read[("kafka_server_brokertopicmetrics_bytesout_total", topic)] >= \
            read[("kafka_server_brokertopicmetrics_bytesin_total", topic)], "all of it read once at least"
        assert read[("stratalog_messagesout_total", topic)] >= RECORDS, "every record sent once at least"
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        for _ in range(7):
            producer.send("measured", b"later")
        producer.flush()
        producer.close()
        assert scrape(base)[lag] == 7, "seven records produced since the group's commit"
        metrics = scrape(base)
        assert metrics[("kafka_server_brokertopicmetrics_messagesin_total", topic)] == RECORDS + 7
        bytes_in = metrics[("kafka_server_brokertopicmetrics_bytesin_total", topic)]
        assert RECORDS * VALUE_BYTES < bytes_in < (RECORDS + 7) * (VALUE_BYTES + 100), "batch bytes: values, framing"
        produces = [v for (name, labels), v in metrics.items()
                    if name == "kafka_network_requestmetrics_requests_total" and ("request", "Produce") in labels]
        assert produces and sum(produces) >= 1
        samples = metrics[("kafka_network_requestmetrics_totaltime_seconds_count", (("request", "Produce"),))]
        assert samples == sum(produces), "every answered produce has its latency sample"
        assert metrics[("kafka_network_requestmetrics_totaltime_seconds_count", (("request", "Fetch"),))] >= 1
        assert metrics[("stratalog_streams", ())] >= 1
        assert metrics[("stratalog_space_refusing", ())] == 0
        assert metrics[("stratalog_space_free_bytes", ())] > metrics[("stratalog_space_kept_free_bytes", ())]
        assert metrics[("stratalog_connections", ())] >= 0


def test_readyz_says_not_writable_while_the_disk_is_below_the_headroom(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f"[store]\nfree_bytes_min = {1 << 60}\n")   # more than any disk: refused from the start
    with running_broker(tmp_path / "data", "--metrics-listen", "127.0.0.1:0", "--config", str(config)) as broker:
        base = endpoint(broker)
        assert get(f"{base}/healthz") == (200, "ok\n"), "the process serves"
        status, text = get(f"{base}/readyz")
        assert status == 503 and "not writable" in text and "nearly full" in text
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", retries=0)
        try:
            future = producer.send("refused", b"x")
            try:
                future.get(timeout=WAIT_S)
            except KafkaStorageError:
                pass
            else:
                raise AssertionError("a produce was taken by a broker below its headroom")
        finally:
            producer.close()
        metrics = scrape(base)
        assert metrics[("kafka_server_brokertopicmetrics_failedproducerequests_total",
                        (("error", "kafka_storage_error"),))] >= 1
        assert metrics[("stratalog_space_refusing", ())] == 1


def test_the_endpoint_binds_loopback_only() -> None:
    result = CliRunner().invoke(serve, ["--metrics-listen", "0.0.0.0:9644"])
    assert result.exit_code == 2
    assert "not a loopback address" in result.output and "--metrics-listen" in result.output
    result = CliRunner().invoke(serve, ["--metrics-listen", "9644"])
    assert result.exit_code == 2 and "HOST:PORT" in result.output


def test_the_stores_listeners_and_quotas_metrics_move_with_what_was_done(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[store]\nupload_interval_s = 0.2\n")   # uploads soon after the produce
    with running_broker(tmp_path / "data", "--metrics-listen", "127.0.0.1:0", "--config", str(config)) as broker:
        base = endpoint(broker)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        for i in range(50):
            producer.send("stored", b"v%d" % i)
        producer.flush()

        def uploaded() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            read = scrape(base)
            return read if read.get(("stratalog_object_requests_total", (("operation", "put"),)), 0) >= 1 else None

        metrics = wait_until(uploaded, "an upload counted as an object store put")
        assert metrics[("stratalog_object_request_seconds_count", (("operation", "put"),))] >= 1
        assert metrics[("stratalog_wal_write_seconds_count", ())] >= 1
        assert metrics[("stratalog_wal_append_seconds_count", ())] == metrics[("stratalog_wal_write_seconds_count", ())]
        assert metrics[("stratalog_wal_append_seconds_sum", ())] >= metrics[("stratalog_wal_write_seconds_sum", ())]
        assert metrics[("stratalog_listener_connections", (("listener", f"PLAINTEXT://{broker.bootstrap}"),))] >= 1
        assert ("stratalog_block_cache_hits_total", ()) in metrics and ("stratalog_upload_lag_ms", ()) in metrics

        admin = CliRunner().invoke(cli, ["quotas", "alter", "--default-user", "--set", "producer_byte_rate=1024",
                                         "--bootstrap", broker.bootstrap])
        assert admin.exit_code == 0, admin.output
        throttled = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", client_id="greedy")
        for _ in range(20):
            throttled.send("stored", b"x" * 1000)
        throttled.flush()
        throttled.close()
        producer.close()
        throttle = ("stratalog_quota_throttle_seconds_total", (("client_id", "greedy"), ("user", "ANONYMOUS")))
        assert scrape(base)[throttle] > 0, "the greedy client was throttled and the delay counted"
        documented = DOCS.read_text()
        families = {re.sub(r"_(total|count|sum|bucket|created)$", "", name) for name, _ in scrape(base)}
        undocumented = sorted(f for f in families if f"`{f}" not in documented)
        assert not undocumented, f"metrics missing from docs/operations.md: {undocumented}"
