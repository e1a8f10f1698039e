"""Client quotas: which quota applies, how throttle time follows from the rate, and a real client slowed
to its produce quota through the admin API."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerkit import running_broker
from stratalog.broker.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_RATE,
    QuotaConfig,
    QuotaError,
    Quotas,
    Rate,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def quotas(tmp_path: Path, clock: Clock) -> Iterator[Quotas]:
    made = Quotas(tmp_path / "broker.sqlite", QuotaConfig(window_s=1.0, windows=11), clock_s=clock)
    yield made
    made.close()


def test_no_quota_means_no_throttle(quotas: Quotas) -> None:
    assert all(quotas.record("alice", "app", key, 10**9) == 0 for key in (PRODUCER_BYTE_RATE, REQUEST_RATE))


def test_the_most_specific_entity_wins_in_kafkas_order(quotas: Quotas) -> None:
    user, default_user, client, default_client = ("user", "alice"), ("user", None), ("client-id", "app"), \
        ("client-id", None)
    order = [(user, client), (user, default_client), (user,), (default_user, client),
             (default_user, default_client), (default_user,), (client,), (default_client,)]
    for rank, entity in enumerate(reversed(order)):
        quotas.alter(entity, {REQUEST_RATE: 100.0 + rank}, [])
        found = quotas._quota("alice", "app", REQUEST_RATE)
        assert found is not None and found[0] == 100.0 + rank, entity


def test_throttle_time_is_the_excess_over_the_quota_times_the_span(quotas: Quotas, clock: Clock) -> None:
    quotas.alter((("user", "alice"),), {PRODUCER_BYTE_RATE: 1000.0}, [])
    # 10 s is the shortest span measured (windows - 1): 10,000 bytes is exactly the quota.
    assert quotas.record("alice", "app", PRODUCER_BYTE_RATE, 10_000) == 0
    # 20,000 bytes over 10 s is 2,000 B/s, twice the quota: wait as long as the span again.
    assert quotas.record("alice", "app", PRODUCER_BYTE_RATE, 10_000) == 10_000
    # Another user is measured apart.
    assert quotas.record("bob", "app", PRODUCER_BYTE_RATE, 10_000) == 0


def test_the_rate_forgets_what_falls_out_of_its_windows(quotas: Quotas, clock: Clock) -> None:
    quotas.alter((("client-id", None),), {REQUEST_RATE: 1.0}, [])
    assert quotas.record("u", "c", REQUEST_RATE, 20) > 0
    clock.now_s += 12.0
    assert quotas.record("u", "c", REQUEST_RATE, 1) == 0


def test_throttle_time_is_bounded(tmp_path: Path, clock: Clock) -> None:
    q = Quotas(tmp_path / "b.sqlite", QuotaConfig(consumer_byte_rate=1.0, throttle_ms_max=2_000), clock_s=clock)
    try:
        assert q.record("u", "c", CONSUMER_BYTE_RATE, 10**9) == 2_000
    finally:
        q.close()


def test_rates_are_kept_for_a_bounded_number_of_users_and_clients(tmp_path: Path, clock: Clock) -> None:
    q = Quotas(tmp_path / "b.sqlite", QuotaConfig(request_rate=1e9, rates_tracked_max=10), clock_s=clock)
    try:
        for i in range(1000):
            q.record("u", f"client-{i}", REQUEST_RATE, 1)
        assert len(q._rates) == 10
    finally:
        q.close()


def test_quotas_survive_a_restart_and_are_removed(tmp_path: Path, quotas: Quotas) -> None:
    quotas.alter((("user", "alice"), ("client-id", "app")), {PRODUCER_BYTE_RATE: 5.0, REQUEST_RATE: 2.0}, [])
    quotas.close()
    again = Quotas(tmp_path / "broker.sqlite")
    try:
        assert again.entities() == {(("client-id", "app"), ("user", "alice")): {PRODUCER_BYTE_RATE: 5.0,
                                                                               REQUEST_RATE: 2.0}}
        again.alter((("user", "alice"), ("client-id", "app")), {}, [PRODUCER_BYTE_RATE, REQUEST_RATE])
        assert again.entities() == {}
    finally:
        again.close()


@pytest.mark.parametrize(("entity", "values", "named"), [
    ((("group", "g"),), {REQUEST_RATE: 1.0}, "entity"),
    ((("user", "a"), ("user", "b")), {REQUEST_RATE: 1.0}, "entity"),
    ((("user", "a"),), {"request_percentage": 50.0}, "request_rate"),
    ((("user", "a"),), {PRODUCER_BYTE_RATE: 0.0}, "positive"),
])
def test_bad_entities_and_values_are_refused_by_name(quotas: Quotas, entity: tuple[tuple[str, str | None], ...],
                                                     values: dict[str, float], named: str) -> None:
    with pytest.raises(QuotaError, match=named):
        quotas.alter(entity, values, [])
    assert quotas.entities() == {}


def test_a_rate_is_measured_over_at_least_all_windows_but_one() -> None:
    rate = Rate(window_s=1.0, windows=11)
    assert rate.record(100, 5000.2) == (10.0, 10.0)
    assert rate.record(100, 5020.5)[0] == 10.0, "the first 100 fell out of the windows"


def test_a_client_over_its_produce_quota_is_throttled_and_slowed(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "broker.toml"
    # The broker's default quota (none of the three client libraries has a quota admin API; the API is
    # asserted in test_broker_authorization.py). Short windows so the quota acts within seconds: 1 s is the
    # shortest span measured.
    config.write_text("[quotas]\nproducer_byte_rate = 50000\nwindow_s = 0.1\nwindows = 11\n")
    with running_broker(tmp_path / "data", "--config", str(config)) as broker:
        producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, client_id="slow", acks="all",
                                       linger_ms=0, batch_size=16_384)
        try:
            start = time.monotonic()
            futures = [producer.send("quota", value=bytes(1000)) for _ in range(150)]
            producer.flush(timeout=60)
            elapsed_s = time.monotonic() - start
            assert all(f.get(timeout=1).offset >= 0 for f in futures)
        finally:
            producer.close()
        # 150 KB at 50 KB/s, of which the first second's worth passes at once: at least 2 s.
        assert elapsed_s >= 1.5, elapsed_s
        # kafka-python logs each response whose throttle_time_ms is not 0.
        assert any("throttled by broker" in r.getMessage() for r in caplog.records)
        assert broker.stop() == 0, "".join(broker.output)
