"""The Spark data source's Python workers keep Kafka consumers between tasks, and close each once it has
been idle a while: a consumer kept for a broker that is gone would retry its connections for good."""

from __future__ import annotations

import threading

import pytest

from stratalog.spark import kafka_client
from stratalog.spark.kafka_client import IDLE_CONSUMER_S_MAX, IdleConsumers


class _Consumer:
    """What the pool calls on a confluent-kafka consumer."""

    def __init__(self) -> None:
        self.assigned = True
        self.closed = threading.Event()

    def unassign(self) -> None:
        self.assigned = False

    def close(self) -> None:
        assert not self.closed.is_set(), "closed twice"
        self.closed.set()


KEY_A = ("127.0.0.1:9092", ())
KEY_B = ("127.0.0.1:9093", (("security.protocol", "ssl"),))


def test_a_consumer_given_back_is_taken_again_for_the_same_broker_and_settings_only() -> None:
    pool = IdleConsumers()
    consumer = _Consumer()
    pool.give_back(consumer, KEY_A)
    assert not consumer.assigned
    assert pool.take(KEY_B) is None
    assert pool.take(KEY_A) is consumer
    assert pool.take(KEY_A) is None and pool.kept() == 0


def test_consumers_idle_past_the_bound_are_closed_and_the_rest_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(kafka_client, "IDLE_SWEEP_S", 3600.0)      # the sweeper stays out of this test
    pool = IdleConsumers(lambda: clock[0])
    old, newer, other = _Consumer(), _Consumer(), _Consumer()
    pool.give_back(old, KEY_A)
    clock[0] += IDLE_CONSUMER_S_MAX / 2
    pool.give_back(newer, KEY_A)
    pool.give_back(other, KEY_B)
    assert pool.close_expired(clock[0] + IDLE_CONSUMER_S_MAX * 0.75) == 1
    assert old.closed.is_set() and not newer.closed.is_set() and not other.closed.is_set()
    assert pool.take(KEY_A) is newer
    assert pool.close_expired(clock[0] + IDLE_CONSUMER_S_MAX * 2) == 1
    assert other.closed.is_set() and pool.kept() == 0


def test_the_sweeper_closes_an_idle_consumer_by_itself_and_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_client, "IDLE_CONSUMER_S_MAX", 0.01)
    monkeypatch.setattr(kafka_client, "IDLE_SWEEP_S", 0.01)
    pool = IdleConsumers()
    first = _Consumer()
    pool.give_back(first, KEY_A)
    assert first.closed.wait(60), "the idle consumer was never closed"
    second = _Consumer()
    pool.give_back(second, KEY_B)         # after the first sweeper left (or while it runs): closed all the same
    assert second.closed.wait(60), "a consumer given back later was never closed"
    assert pool.kept() == 0
