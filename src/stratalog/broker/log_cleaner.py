"""The broker's log cleaner: compacts the partitions of its compacted topics (``cleanup.policy`` with
``compact``), one pass at a time in a worker thread, every ``log_cleaner_interval_ms``.

A broker compacts only the partitions it serves (in a cluster, those it leads: the metadata's fence
refuses a commit for any other), and each only below where its idempotent producers' last saved
snapshot ends: a restart, or the next leader, rebuilds the producers' state by replaying the batches
after the snapshot, and those must still carry every producer's fields (a compacted batch that lost all
its records does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING

from stratalog.broker.topic_configs import clean_policy
from stratalog.engine.cleaner import CleanReport
from stratalog.errors import StratalogError

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

log = logging.getLogger("stratalog.broker.cleaner")


class LogCleaner:
    """Runs passes of log compaction over the broker's compacted partitions (see the module's docstring)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: The pass running in a worker thread: a stop waits for it (it ends after the piece it is on), so
        #: the store never closes under it.
        self._running: asyncio.Future[CleanReport] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="stratalog-log-cleaner")

    async def stop(self) -> None:
        self._stopping = True
        running = self._running   # (the task's end lets go of it)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if running is not None:
            await asyncio.wait([running])

    async def _run(self) -> None:
        interval_s = self._broker.config.log_cleaner_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            await self.clean_once()

    async def clean_once(self) -> list[CleanReport]:
        """One pass over each compacted partition served here that is due; the reports of those that ran."""
        broker = self._broker
        done: list[CleanReport] = []
        for topic in broker.topics.all():
            policy = clean_policy(topic.configs)
            if policy is None:
                continue
            for partition in range(topic.partitions):
                stream = broker.ownership.stream(topic.name, partition)
                if stream is None or self._stopping:
                    continue
                end = broker.snapshot_ends_saved.get(stream.stream_id, 0)
                self._running = asyncio.get_running_loop().run_in_executor(None, functools.partial(
                    broker.store.clean_stream, stream, policy, end_offset_max=end, should_stop=self._should_stop))
                try:
                    report = await asyncio.shield(self._running)
                except StratalogError as e:   # the store stopped, the stream went, the lease was lost
                    log.warning("compaction of %s-%d failed; it is tried again later: %s", topic.name, partition, e)
                    continue
                finally:
                    self._running = None
                if report.objects_written:
                    done.append(report)
        return done

    def _should_stop(self) -> bool:
        return self._stopping
