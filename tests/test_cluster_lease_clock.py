"""cluster/lease_clock.py, one test per row of its table, on a clock the tests move: a broker acknowledges
only while the database cannot have ended its lease yet, whatever happens to its renewals."""

from __future__ import annotations

import pytest

from stratalog.cluster.lease_clock import LeaseClock, LeaseState

LEASE_MS, MARGIN_MS = 3000, 300


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def joined_at(clock: Clock, sent_s: float) -> LeaseClock:
    lease = LeaseClock(LEASE_MS, MARGIN_MS, clock)
    lease.renewed(sent_s)
    return lease


def test_before_the_join_succeeds_nothing_is_confirmed() -> None:
    clock = Clock()
    lease = LeaseClock(LEASE_MS, MARGIN_MS, clock)
    assert lease.state() is LeaseState.UNCONFIRMED and lease.confirmed_for_s() == 0


def test_confirmed_until_the_lease_less_the_margin_after_the_renewal_was_sent() -> None:
    clock = Clock()
    sent_s = lease_sent = clock.now_s
    clock.now_s += 0.8            # the renewal took 0.8 s to come back: the lease is counted from its sending
    lease = joined_at(clock, lease_sent)
    assert lease.confirmed() and lease.confirmed_for_s() == pytest.approx(2.7 - 0.8)
    clock.now_s = sent_s + 2.7 - 1e-6
    assert lease.state() is LeaseState.CONFIRMED
    clock.now_s = sent_s + 2.7
    assert lease.state() is LeaseState.UNCONFIRMED and lease.confirmed_for_s() == 0


def test_unconfirmed_within_the_margin_either_side_of_the_end_the_database_may_have_set() -> None:
    clock = Clock()
    lease = joined_at(clock, clock.now_s)
    for after_s in (2.7, 3.0, 3.3 - 1e-6):
        clock.now_s = 100.0 + after_s
        assert lease.state() is LeaseState.UNCONFIRMED, after_s


def test_surely_expired_from_the_lease_plus_the_margin() -> None:
    clock = Clock()
    lease = joined_at(clock, clock.now_s)
    clock.now_s = 100.0 + 3.3
    assert lease.state() is LeaseState.SURELY_EXPIRED
    clock.now_s += 1000
    assert lease.state() is LeaseState.SURELY_EXPIRED


def test_a_renewal_that_gets_through_while_unconfirmed_confirms_again() -> None:
    clock = Clock()
    lease = joined_at(clock, clock.now_s)
    clock.now_s = 102.9
    assert lease.state() is LeaseState.UNCONFIRMED
    sent_s = lease.sent()
    clock.now_s = 103.0
    lease.renewed(sent_s)
    assert lease.state() is LeaseState.CONFIRMED and lease.confirmed_for_s() == pytest.approx(2.6)


def test_an_older_renewal_finishing_late_moves_nothing() -> None:
    clock = Clock()
    lease = joined_at(clock, 101.0)
    lease.renewed(100.5)          # sent before the one that already succeeded
    clock.now_s = 103.69
    assert lease.state() is LeaseState.CONFIRMED
    clock.now_s = 103.7
    assert lease.state() is LeaseState.UNCONFIRMED


@pytest.mark.parametrize("margin_ms", [-1, LEASE_MS, LEASE_MS + 1])
def test_a_margin_outside_the_lease_is_refused(margin_ms: int) -> None:
    with pytest.raises(ValueError, match="lease margin"):
        LeaseClock(LEASE_MS, margin_ms)


def test_the_time_since_the_last_renewal_is_counted_from_its_sending() -> None:
    clock = Clock()
    lease = LeaseClock(LEASE_MS, MARGIN_MS, clock)
    assert lease.since_renewed_s() is None
    sent_s = lease.sent()
    clock.now_s += 0.5
    lease.renewed(sent_s)
    clock.now_s += 29.5           # the machine stood still: nothing was sent meanwhile
    assert lease.since_renewed_s() == pytest.approx(30.0)
