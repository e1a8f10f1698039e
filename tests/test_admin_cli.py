"""The admin command line against live brokers: stratalog, and Tansu (a Kafka-compatible broker of its own
code base), so that the commands speak Kafka and not stratalog alone. Topics, the console producer and
consumer, and consumer groups with their lag, through `stratalog topics|produce|consume|groups`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from brokerkit import running_broker
from stratalog.bench.kafka import start_tansu
from stratalog.cli import cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["stratalog", "tansu"])
def bootstrap(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp(request.param)
    if request.param == "tansu":
        server = start_tansu(data)
        try:
            yield server.address
        finally:
            server.process.terminate()
            server.process.wait(30)
        return
    config = data / "broker.toml"
    config.write_text("[groups]\ngroup_initial_rebalance_delay_ms = 0\n")
    with running_broker(data / "data", "--config", str(config)) as broker:
        yield broker.bootstrap
        assert broker.stop() == 0


def run(bootstrap: str, *args: str, stdin: str | None = None, ok: bool = True) -> Result:
    result = CliRunner().invoke(cli, [*args, "--bootstrap", bootstrap], input=stdin, catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def run_json(bootstrap: str, *args: str) -> Any:
    return json.loads(run(bootstrap, *args, "-o", "json").stdout)


#: One record a batch where a test counts offsets: Tansu answers ListOffsets (latest) with its last batch's
#: base offset + 1, not with the offset after the batch's last record.
ONE_A_BATCH = ("-X", "batch.num.messages=1")


def lines(bootstrap: str, *args: str) -> list[str]:
    return run(bootstrap, "consume", *args).stdout.splitlines()


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_topic_is_created_listed_described_with_its_records_and_deleted(bootstrap: str) -> None:
    topic = name("orders")
    run(bootstrap, "topics", "create", topic, "--partitions", "3")
    assert {"topic": topic, "partitions": 3, "replication_factor": 1} in run_json(bootstrap, "topics", "list")
    run(bootstrap, "produce", topic, "--partition", "1", *ONE_A_BATCH, stdin="".join(f"o{i}\n" for i in range(10)))
    [described] = run_json(bootstrap, "topics", "describe", topic)
    assert [(p["partition"], p["earliest"], p["latest"], p["records"]) for p in described["partitions"]] == \
        [(0, 0, 0, 0), (1, 0, 10, 10), (2, 0, 0, 0)]
    run(bootstrap, "topics", "delete", topic, "--yes")
    assert topic not in {row["topic"] for row in run_json(bootstrap, "topics", "list")}


def test_json_records_of_any_bytes_come_back_as_they_were_produced(bootstrap: str) -> None:
    topic = name("raw")
    run(bootstrap, "topics", "create", topic)
    sent = [{"key": "user-1", "value": "hello", "headers": [{"key": "trace", "value": "t-1"}], "timestamp_ms": 1000},
            {"key": None, "value_hex": "00ff10c3", "headers": [{"key": "bin", "value_hex": "fffe"}],
             "timestamp_ms": 2000},
            {"key_hex": "ff", "value": None, "headers": [], "timestamp_ms": 3000}]
    run(bootstrap, "produce", topic, "--format", "json", stdin="".join(json.dumps(r) + "\n" for r in sent))
    got = [json.loads(line) for line in lines(bootstrap, topic, "--from-beginning", "-n", "3", "--format", "json")]
    assert [(g["offset"], g["topic"], g["partition"]) for g in got] == [(0, topic, 0), (1, topic, 0), (2, topic, 0)]
    for g in got:
        del g["offset"], g["topic"], g["partition"]
    assert got == sent


def test_text_records_with_keys_headers_and_where_a_read_starts(bootstrap: str) -> None:
    topic = name("text")
    run(bootstrap, "topics", "create", topic)
    stdin = "".join(f'{{"key": "k{i}", "value": "v{i}", "timestamp_ms": {1000 * (i + 1)}}}\n' for i in range(5))
    run(bootstrap, "produce", topic, "--format", "json", stdin=stdin)
    run(bootstrap, "produce", topic, "-K", ":", "-H", "source=cli", stdin="k5:v5\n")
    assert lines(bootstrap, topic, "--from-beginning", "-n", "6", "--print-key", "--print-offset") == \
        [f"0:{i}\tk{i}\tv{i}" for i in range(6)]
    assert lines(bootstrap, topic, "--offset", "5", "-n", "1", "--print-headers") == ["source:cli\tv5"]
    assert lines(bootstrap, topic, "--from-beginning", "-n", "1", "--format", "hex", "--print-key") == \
        [f"{b'k0'.hex()}\t{b'v0'.hex()}"]


def test_a_group_shows_its_lag_and_its_offsets_are_reset(bootstrap: str) -> None:
    topic, group = name("lagging"), name("billing")
    run(bootstrap, "topics", "create", topic)
    run(bootstrap, "produce", topic, *ONE_A_BATCH, stdin="".join(f"{i}\n" for i in range(10)))
    # A group with no member yet: its first offsets set from outside, as an operator seeds one.
    run(bootstrap, "groups", "reset-offsets", group, "--topic", topic, "--to-offset", "4", "--execute")
    assert group in {row["group"] for row in run_json(bootstrap, "groups", "list")}

    def offsets() -> list[tuple[int | None, int, int | None]]:
        [doc] = run_json(bootstrap, "groups", "describe", group)
        return [(p["committed"], p["latest"], p["lag"]) for p in doc["partitions"]]

    assert offsets() == [(4, 10, 6)]
    planned = run_json(bootstrap, "groups", "reset-offsets", group, "--to-earliest")
    assert planned["partitions"] == [{"topic": topic, "partition": 0, "current": 4, "new": 0}]
    assert offsets() == [(4, 10, 6)], "a reset without --execute changes nothing"
    run(bootstrap, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute")
    assert offsets() == [(0, 10, 10)]
    run(bootstrap, "groups", "reset-offsets", group, "--shift-by", "3", "--execute")
    assert offsets() == [(3, 10, 7)]
    run(bootstrap, "groups", "reset-offsets", group, "--to-latest", "--execute")
    assert offsets() == [(10, 10, 0)]
    run(bootstrap, "groups", "delete", group, "--yes")
    assert group not in {row["group"] for row in run_json(bootstrap, "groups", "list")}


# Tansu lets a consumer join a group only after about 23 s (each join): its group reads run here alone.
@pytest.mark.parametrize("bootstrap", ["stratalog"], indirect=True)
def test_a_console_consumer_in_a_group_commits_what_it_read(bootstrap: str) -> None:
    topic, group = name("grouped"), name("audit")
    run(bootstrap, "topics", "create", topic)
    run(bootstrap, "produce", topic, stdin="".join(f"{i}\n" for i in range(10)))
    assert lines(bootstrap, topic, "--group", group, "--from-beginning", "-n", "4") == ["0", "1", "2", "3"]
    [doc] = run_json(bootstrap, "groups", "describe", group)
    assert [(p["committed"], p["lag"]) for p in doc["partitions"]] == [(4, 6)]
    assert lines(bootstrap, topic, "--group", group, "--idle-timeout-s", "1") == [str(i) for i in range(4, 10)]
    [doc] = run_json(bootstrap, "groups", "describe", group)
    assert [(p["committed"], p["lag"]) for p in doc["partitions"]] == [(10, 0)]


@pytest.mark.parametrize("bootstrap", ["stratalog"], indirect=True)   # Tansu answers a lookup by time with 0
def test_a_read_starts_at_the_first_record_at_or_after_a_time(bootstrap: str) -> None:
    topic = name("timed")
    run(bootstrap, "topics", "create", topic)
    stdin = "".join(f'{{"value": "v{i}", "timestamp_ms": {1000 * (i + 1)}}}\n' for i in range(5))
    run(bootstrap, "produce", topic, "--format", "json", stdin=stdin)
    assert lines(bootstrap, topic, "--from-time", "2500", "-n", "3", "--print-timestamp") == \
        ["3000\tv2", "4000\tv3", "5000\tv4"]
    assert lines(bootstrap, topic, "--from-time", "1970-01-01T00:00:04+00:00", "-n", "1") == ["v3"]
    assert lines(bootstrap, topic, "--from-time", "9000", "--idle-timeout-s", "0.5") == [], "nothing that late"
