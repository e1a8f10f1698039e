"""Transaction markers for partitions led by other brokers of a cluster, through PostgreSQL: the
coordinator of a transaction puts a row per such partition in ``txn_markers``; the broker that leads the
partition writes the marker (broker/txn_markers.py) and deletes the row; the coordinator waits for its rows
to go. Brokers of a cluster share only the database (no broker-to-broker requests): the queue is in it,
durable, and follows leadership by itself, since whoever leads a partition when it looks writes its markers
(a new leader after a failover included). A marker written twice (its leader died between the write and the
delete) ends nothing the second time.

``LISTEN``/``NOTIFY`` on :data:`CHANNEL` wakes the leaders when rows are added and the coordinators when
rows go; each side also looks every ``poll_interval_ms`` in case a notification was lost with a
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from stratalog.broker.metadata_db import open_metadata
from stratalog.broker.txn_markers import MarkerRequest, MarkerWriteError, write_marker
from stratalog.engine.metadata_backends import writing
from stratalog.kafka.control_batch import MarkerType

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

log = logging.getLogger("stratalog.broker.transactions")

SCHEMA = """
CREATE TABLE IF NOT EXISTS txn_markers (
    topic TEXT NOT NULL, partition_index INTEGER NOT NULL, producer_id BIGINT NOT NULL,
    producer_epoch INTEGER NOT NULL, marker_type INTEGER NOT NULL, coordinator_epoch INTEGER NOT NULL,
    transactional_id TEXT NOT NULL,
    PRIMARY KEY (topic, partition_index, producer_id)
);
"""
#: The notification channel: a row added or deleted.
CHANNEL = "stratalog_txn_markers"
#: How long the listening thread waits for a notification before it checks whether to stop.
LISTEN_TIMEOUT_S = 1.0
#: After the listening connection is lost, before it connects again.
RELISTEN_BACKOFF_S = 1.0


class MarkerQueue:
    """The ``txn_markers`` table. Thread-safe (one connection, one lock); call from worker threads."""

    def __init__(self, uri: str) -> None:
        self._lock = threading.Lock()
        self._db = open_metadata(uri, SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(self, markers: Sequence[MarkerRequest]) -> None:
        """Queue markers (one already queued stays as it is: a coordinator trying again)."""
        with self._lock, writing(self._db):
            self._db.executemany(
                "INSERT INTO txn_markers VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [(m.topic, m.partition, m.producer_id, m.producer_epoch, int(m.kind), m.coordinator_epoch,
                  m.transactional_id) for m in markers])
            self._db.execute(f"NOTIFY {CHANNEL}")

    def all(self) -> list[MarkerRequest]:
        with self._lock:
            rows = self._db.execute("SELECT topic, partition_index, producer_id, producer_epoch, marker_type, "
                                    "coordinator_epoch, transactional_id FROM txn_markers").fetchall()
        return [MarkerRequest(str(t), int(p), int(pid), int(e), MarkerType(int(k)), int(c), str(txn))
                for t, p, pid, e, k, c, txn in rows]

    def remaining(self, markers: Sequence[MarkerRequest]) -> int:
        """How many of ``markers`` are still queued."""
        with self._lock:
            return sum(1 for m in markers if self._db.execute(
                "SELECT 1 FROM txn_markers WHERE topic = ? AND partition_index = ? AND producer_id = ? "
                "AND producer_epoch = ? AND marker_type = ?",
                (m.topic, m.partition, m.producer_id, m.producer_epoch, int(m.kind))).fetchone() is not None)

    def done(self, marker: MarkerRequest) -> None:
        """The marker is written and durable: its row goes, and its coordinator is told."""
        with self._lock, writing(self._db):
            self._db.execute("DELETE FROM txn_markers WHERE topic = ? AND partition_index = ? AND producer_id = ? "
                             "AND producer_epoch = ? AND marker_type = ?",
                             (marker.topic, marker.partition, marker.producer_id, marker.producer_epoch,
                              int(marker.kind)))
            self._db.execute(f"NOTIFY {CHANNEL}")


class NotificationListener:
    """A thread that LISTENs on :data:`CHANNEL` with a connection of its own and calls ``wake`` (from that
    thread) at every notification."""

    def __init__(self, uri: str, wake: Callable[[], None]) -> None:
        self._uri = uri
        self._wake = wake
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stratalog-txn-markers-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=LISTEN_TIMEOUT_S * 2)

    def _run(self) -> None:
        import psycopg  # a cluster's broker has it (PostgreSQL is its database)

        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._uri, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._wake()   # anything queued while this connection was down
                    while not self._stopping.is_set():
                        for _ in conn.notifies(timeout=LISTEN_TIMEOUT_S, stop_after=1):
                            self._wake()
            except Exception as e:   # the database restarted, say: the periodic look covers the gap
                log.warning("listening for transaction markers failed (again in %.0f s): %s", RELISTEN_BACKOFF_S, e)
                self._stopping.wait(RELISTEN_BACKOFF_S)


class Wakeup:
    """Notifications handed to the event loop: each waiter takes a future before it looks at the queue, so a
    notification between its look and its wait is not missed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: set[asyncio.Future[None]] = set()

    def set_from_thread(self) -> None:
        with contextlib.suppress(RuntimeError):   # the loop closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def next(self) -> asyncio.Future[None]:
        waiter = self._loop.create_future()
        self._waiters.add(waiter)
        return waiter

    async def wait(self, waiter: asyncio.Future[None], timeout_s: float) -> None:
        """Until ``waiter`` (from :meth:`next`) is woken, or ``timeout_s``."""
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            self._waiters.discard(waiter)


class ClusterMarkers:
    """Both sides of the queue for one broker of a cluster: it delivers the markers of the partitions it
    leads, and waits for the ones it queued as a coordinator."""

    def __init__(self, broker: Broker, uri: str) -> None:
        self._broker = broker
        self._uri = uri
        config = broker.config
        self._poll_s = config.transaction_marker_poll_interval_ms / 1000
        self._wait_s = config.transaction_marker_wait_ms_max / 1000
        self._queue: MarkerQueue | None = None
        self._listener: NotificationListener | None = None
        self._wakeup: Wakeup | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._queue = MarkerQueue(self._uri)
        self._wakeup = Wakeup(loop)
        self._listener = NotificationListener(self._uri, self._wakeup.set_from_thread)
        self._listener.start()
        self._task = loop.create_task(self._deliver_forever(), name="stratalog-txn-markers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._listener is not None:
            await asyncio.to_thread(self._listener.stop)
        if self._queue is not None:
            self._queue.close()

    def _started(self) -> tuple[MarkerQueue, Wakeup]:
        if self._queue is None or self._wakeup is None:
            raise MarkerWriteError("the broker's marker queue is not running")
        return self._queue, self._wakeup

    async def deliver(self, markers: Sequence[MarkerRequest]) -> None:
        """Queue ``markers`` and wait until their leaders have written them all (MarkerWriteError after
        ``transaction_marker_wait_ms_max``: they stay queued, the coordinator's next round waits again)."""
        queue, wakeup = self._started()
        await asyncio.to_thread(queue.put, markers)
        deadline = asyncio.get_running_loop().time() + self._wait_s
        while True:
            waiter = wakeup.next()
            left = await asyncio.to_thread(queue.remaining, markers)
            if not left:
                return
            remaining_s = deadline - asyncio.get_running_loop().time()
            if remaining_s <= 0:
                raise MarkerWriteError(f"{left} of {len(markers)} markers not written by their partitions' "
                                       f"leaders within {self._wait_s:.0f} s")
            await wakeup.wait(waiter, min(self._poll_s, remaining_s))

    async def _deliver_forever(self) -> None:
        queue, wakeup = self._started()
        while True:
            waiter = wakeup.next()
            try:
                await self._deliver_once(queue)
            except Exception:   # the database out of reach, say: the next look tries again
                log.exception("delivering transaction markers failed; trying again")
            await wakeup.wait(waiter, self._poll_s)

    async def _deliver_once(self, queue: MarkerQueue) -> None:
        broker = self._broker
        queued = await asyncio.to_thread(queue.all)
        mine = [m for m in queued if broker.partition(m.topic, m.partition) is not None]
        gone = [m for m in queued if m not in mine and broker.topics.get(m.topic) is None]
        for m in gone:   # the topic was deleted with what the transaction wrote in it: nothing to end
            await asyncio.to_thread(queue.done, m)
        await asyncio.gather(*(self._write(queue, m) for m in mine))

    async def _write(self, queue: MarkerQueue, m: MarkerRequest) -> None:
        try:
            await write_marker(self._broker, m.topic, m.partition, m.producer_id, m.producer_epoch, m.kind,
                               m.coordinator_epoch)
        except MarkerWriteError as e:
            log.warning("marker of %r in %s-%d not written yet: %s", m.transactional_id, m.topic, m.partition, e)
            return
        await asyncio.to_thread(queue.done, m)
