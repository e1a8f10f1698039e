"""The supervisor the cluster tests run brokers under (chaos/cluster_process.py): a broker that stopped
fenced (exit 75) is started again on its port, one killed or stopped any other way stays down, and a start
that fails is tried again at the next look."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from stratalog.broker.cluster_node import EXIT_LEASE_LOST
from stratalog.chaos.cluster_process import BrokerCluster, supervised
from waiting import wait_until


class Process:
    def __init__(self, status: int | None) -> None:
        self.status = status

    def poll(self) -> int | None:
        return self.status


class Broker:
    def __init__(self, status: int | None) -> None:
        self.process = Process(status)


class Cluster(BrokerCluster):
    """The harness's cluster with stand-in processes: ``start`` records the restart instead of running
    `stratalog serve`, and fails the first ``failing`` times."""

    def __init__(self, statuses: dict[int, int | None], failing: int = 0) -> None:
        super().__init__(Path("."), "", "", {i: 9000 + i for i in statuses})
        self.brokers.update({i: Broker(s) for i, s in statuses.items()})
        self.starts: list[int] = []
        self.failing = failing
        self.lock = threading.Lock()

    def start(self, broker_id: int) -> Any:
        with self.lock:
            if self.failing:
                self.failing -= 1
                raise RuntimeError("the broker did not start: address already in use")
            self.starts.append(broker_id)
            self.brokers[broker_id] = Broker(None)
            return self.brokers[broker_id]


def test_only_fenced_brokers_are_started_again() -> None:
    cluster = Cluster({1: None, 2: EXIT_LEASE_LOST, 3: -9, 4: 0, 5: EXIT_LEASE_LOST})
    assert cluster.restart_fenced() == [2, 5]
    assert cluster.starts == [2, 5]
    assert cluster.restart_fenced() == []     # running again: nothing more to do


def test_the_supervisor_starts_a_broker_fenced_while_it_watches_and_retries_a_failed_start() -> None:
    cluster = Cluster({1: None, 2: None}, failing=2)
    with supervised(cluster) as supervision:
        cluster.brokers[2].process.status = EXIT_LEASE_LOST
        wait_until(lambda: supervision.restarted == [2], "broker 2 started again")
    assert cluster.starts == [2]
    assert len(supervision.failures) == 2 and "address already in use" in supervision.failures[0]
