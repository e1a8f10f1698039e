"""The queue of transaction markers between a cluster's coordinators and leaders (broker/txn_marker_queue.py),
on a real PostgreSQL: rows in and out, one per marker whatever the retries, and a notification for each
change to the brokers that listen."""

from __future__ import annotations

import threading

from stratalog.broker.txn_marker_queue import MarkerQueue, NotificationListener
from stratalog.broker.txn_markers import MarkerRequest
from stratalog.kafka.control_batch import MarkerType

pytest_plugins = ["pgkit"]

#: Bound on waiting for a notification (only against a hang: they come in milliseconds).
NOTIFY_WAIT_S = 30.0


def marker(partition: int, kind: MarkerType = MarkerType.COMMIT) -> MarkerRequest:
    return MarkerRequest("t", partition, 7, 2, kind, 0, "tx")


def test_markers_stay_queued_until_done_and_a_retry_adds_none(pg_database: str) -> None:
    queue = MarkerQueue(pg_database)
    try:
        wanted = [marker(0), marker(1)]
        queue.put(wanted)
        queue.put(wanted)   # the coordinator tried again
        assert sorted(queue.all(), key=lambda m: m.partition) == wanted
        assert queue.remaining(wanted) == 2
        queue.done(marker(0))
        assert queue.remaining(wanted) == 1
        assert queue.remaining([marker(1, MarkerType.ABORT)]) == 0, "another end of the transaction is not queued"
        queue.done(marker(1))
        assert queue.all() == []
    finally:
        queue.close()


def test_a_listening_broker_is_woken_by_each_change(pg_database: str) -> None:
    queue = MarkerQueue(pg_database)
    woken = threading.Semaphore(0)
    listener = NotificationListener(pg_database, woken.release)
    listener.start()
    try:
        assert woken.acquire(timeout=NOTIFY_WAIT_S), "woken once listening (what was queued meanwhile)"
        queue.put([marker(0)])
        assert woken.acquire(timeout=NOTIFY_WAIT_S), "woken by a marker queued"
        queue.done(marker(0))
        assert woken.acquire(timeout=NOTIFY_WAIT_S), "woken by a marker written"
    finally:
        listener.stop()
        queue.close()
