"""The cluster chaos run's group consumer (chaos/cluster_load.py, GroupReader) over a stand-in client: it
commits one commit at a time, reads on while a commit waits for its answer, and counts and notes a commit
the client never answers, with the client's lines about the group."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from stratalog.chaos import cluster_load
from stratalog.chaos.cluster_load import COMMIT_EVERY_RECORDS, GroupReader
from waiting import wait_until


class StandInConsumer:
    """Answers polls with records of partition 0 while it has them; answers a commit only when told to."""

    def __init__(self, config: dict[str, Any], records: int) -> None:
        self._on_commit = config["on_commit"]
        self._logger = config["logger"]
        self._left = records
        self._offset = 0
        self._lock = threading.Lock()
        self.commits_asked = 0
        self.in_flight_max = 0
        self._in_flight = 0
        self._answers = 0
        self.closed = False

    def subscribe(self, _topics: list[str]) -> None:
        pass

    def answer(self) -> None:
        """Let the next poll deliver the answer of the commit in flight."""
        with self._lock:
            self._answers += 1

    def commit(self, asynchronous: bool) -> None:
        assert asynchronous
        with self._lock:
            self.commits_asked += 1
            self._in_flight += 1
            self.in_flight_max = max(self.in_flight_max, self._in_flight)

    def poll(self, _timeout: float) -> Any:
        with self._lock:
            answering = self._answers > 0 and self._in_flight > 0
            if answering:
                self._answers -= 1
                self._in_flight -= 1
            reading = self._left > 0
            if reading:
                self._left -= 1
                self._offset += 1
        if answering:
            self._on_commit(None, [])
        self._logger.debug("cgrp: a line about the group")
        if not reading:
            return None
        offset = self._offset - 1
        return SimpleNamespace(error=lambda: None, partition=lambda: 0, offset=lambda: offset,
                               value=f"v{offset}".encode)

    def close(self) -> None:
        self.closed = True


def reader_over(monkeypatch: pytest.MonkeyPatch, records: int) -> tuple[GroupReader, list[StandInConsumer]]:
    made: list[StandInConsumer] = []

    def consumer(config: dict[str, Any]) -> StandInConsumer:
        made.append(StandInConsumer(config, records))
        return made[-1]

    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    return GroupReader("127.0.0.1:1", "t", "g"), made


def test_reading_goes_on_while_a_commit_waits_and_one_commit_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    records = 5 * COMMIT_EVERY_RECORDS
    reader, (client,) = reader_over(monkeypatch, records)
    wait_until(lambda: reader.read_count() == records, "every record read while the first commit waits")
    assert client.commits_asked == 1, "no second commit while the first has no answer"
    client.answer()
    wait_until(lambda: client.commits_asked == 2, "the next commit once the first is answered")
    client.answer()
    client.answer()   # the last one's, asked as the reader stops
    reader.stop()
    assert client.commits_asked == 3 and client.in_flight_max == 1 and client.closed
    assert reader.commits_unanswered == 0 and reader.notes == [] and reader.commit_errors == 0
    assert [offset for _, offset, _ in reader.read] == list(range(records))


def test_a_commit_never_answered_is_counted_once_and_noted_with_the_clients_lines(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_load, "COMMIT_ANSWER_S_MAX", 0.05)
    monkeypatch.setattr(cluster_load, "LAST_COMMIT_S_MAX", 0.05)
    reader, (client,) = reader_over(monkeypatch, COMMIT_EVERY_RECORDS)
    wait_until(lambda: reader.commits_unanswered == 1, "the unanswered commit counted")
    reader.stop()
    assert reader.commits_unanswered == 1 and client.commits_asked == 1 and client.closed
    assert len(reader.notes) == 1 and "had no answer after" in reader.notes[0]
    assert "cgrp: a line about the group" in reader.notes[0]
