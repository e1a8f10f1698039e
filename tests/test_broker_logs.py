"""Structured logs: `serve --log-format json` writes one JSON object a line, and `--log-requests` a line
per request answered with who asked (connection, listener, principal, client id) what (API, version)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from brokerkit import running_broker
from stratalog.commands.log_format import JsonFormatter
from waiting import wait_until

pytestmark = pytest.mark.slow


def json_lines(output: list[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in output if line.startswith("{")]


def test_each_request_is_logged_as_json_with_its_connection_principal_and_api(tmp_path: Path) -> None:
    with running_broker(tmp_path / "data", "--log-format", "json", "--log-requests") as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "client.id": "billing-7", "acks": "all"})
        producer.produce("events", b"one")
        assert producer.flush(60) == 0

        def produce_line() -> dict[str, object] | None:
            return next((line for line in json_lines(broker.output) if line.get("api") == "Produce"), None)

        line = wait_until(produce_line, "the Produce request's log line")
        assert broker.stop() == 0
    assert line["logger"] == "stratalog.broker.requests" and line["level"] == "DEBUG"
    assert line["principal"] == "User:ANONYMOUS" and line["client_id"] == "billing-7"
    assert line["listener"] == f"PLAINTEXT://{broker.bootstrap}" and str(line["connection"]).startswith("127.0.0.1:")
    assert isinstance(line["api_version"], int) and isinstance(line["correlation_id"], int)
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert str(line["time"]).endswith("+00:00") and "Produce v" in str(line["message"])
    apis = {line.get("api") for line in json_lines(broker.output)}
    assert {"ApiVersions", "Metadata", "Produce"} <= apis


def test_without_the_flags_there_are_neither_request_lines_nor_json(tmp_path: Path) -> None:
    with running_broker(tmp_path / "data") as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        producer.produce("events", b"one")
        assert producer.flush(60) == 0
        assert broker.stop() == 0
    assert not json_lines(broker.output)
    assert not [line for line in broker.output if "stratalog.broker.requests" in line]


def test_a_json_line_carries_the_traceback_and_values_json_cannot_hold() -> None:
    try:
        raise ValueError("bad frame")
    except ValueError:
        record = logging.LogRecord("stratalog.broker", logging.ERROR, __file__, 1, "closed %s", (("::1", 9),),
                                   exc_info=sys.exc_info())
    record.connection = object()
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "closed ('::1', 9)" and line["level"] == "ERROR"
    assert "ValueError: bad frame" in line["exception"]
    assert line["connection"].startswith("<object object")
