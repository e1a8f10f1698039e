"""A broker's join (broker/cluster_node.py) against a real PostgreSQL: started again right after a crash,
it waits for its previous incarnation's lease to run out instead of failing; an id another live broker
holds is refused once that wait is over."""

from __future__ import annotations

import time

import pytest

from stratalog.broker.cluster_node import JOIN_WAIT_LEASES, ClusterNode
from stratalog.broker.config import ClusterConfig
from stratalog.cluster.leases import BrokerIdTakenError

pytest_plugins = ["pgkit"]

CONFIG = ClusterConfig(enabled=True, broker_id=5, lease_ms=1000, renew_interval_ms=250, lease_margin_ms=100)


def crash(node: ClusterNode) -> None:
    """Stop renewing without leaving: the lease runs out by itself, as after kill -9."""
    node._renewing.set()
    if node._renew_thread is not None:
        node._renew_thread.join()
    node.cluster.close()
    node._renewer.close()


def test_a_broker_started_again_right_after_a_crash_joins_once_the_old_lease_runs_out(pg_database: str) -> None:
    first = ClusterNode(CONFIG, pg_database, [("PLAINTEXT", "127.0.0.1", 9005)])
    assert first.join() == 1
    crash(first)
    again = ClusterNode(CONFIG, pg_database, [("PLAINTEXT", "127.0.0.1", 9005)])
    started = time.monotonic()
    try:
        assert again.join() == 2
        assert time.monotonic() - started < JOIN_WAIT_LEASES * CONFIG.lease_ms / 1000
        assert again.lease.confirmed()
    finally:
        again.leave(clean=True)


def test_an_id_a_live_broker_holds_is_refused_after_the_wait(pg_database: str) -> None:
    live = ClusterNode(CONFIG, pg_database, [("PLAINTEXT", "127.0.0.1", 9005)])
    live.join()
    try:
        other = ClusterNode(CONFIG, pg_database, [("PLAINTEXT", "127.0.0.1", 9006)])
        started = time.monotonic()
        with pytest.raises(BrokerIdTakenError, match=r"broker id 5 is live at 127\.0\.0\.1:9005"):
            other.join()
        assert time.monotonic() - started >= JOIN_WAIT_LEASES * CONFIG.lease_ms / 1000
        other.cluster.close()
        other._renewer.close()
    finally:
        live.leave(clean=True)
