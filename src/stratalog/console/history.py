"""The last minutes of each topic's produce and consume rates and each group's lag, for the console's
plots: sampled on the broker's loop every ``SAMPLE_S``, kept for ``WINDOW_S``, for ``SERIES_MAX`` series
at most (past that, new topics and groups are not plotted; the pages say so).

A topic's produce rate is the rise of its partitions' end offsets; its consume rate the rise of the
offsets its groups committed on it; a group's lag is the sum over its partitions of end minus committed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from stratalog.errors import StratalogError

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker
    from stratalog.broker.topics import Topic

log = logging.getLogger("stratalog.console")

#: Between samples: a rate over 5 s is smooth enough to read and fresh enough to watch.
SAMPLE_S = 5.0
#: How far back the plots go.
WINDOW_S = 15 * 60.0
#: Series kept at most (each holds WINDOW_S / SAMPLE_S points of two floats): bounds the console's memory
#: whatever the count of topics and groups.
SERIES_MAX = 2000

Key = tuple[str, str]   # ("produced" | "consumed" | "lag", topic or group)


class History:
    """Points (seconds, value) per series; ``rates`` of counters, ``levels`` (lag) as they are."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._points: dict[Key, deque[tuple[float, float]]] = {}
        self.dropped = 0
        #: Samples are recorded in a worker thread and read by the console's: one lock over the series.
        self._lock = threading.Lock()

    def record(self, key: Key, value: float, now: float | None = None) -> None:
        with self._lock:
            self._record(key, value, self._clock() if now is None else now)

    def _record(self, key: Key, value: float, now: float) -> None:
        points = self._points.get(key)
        if points is None:
            if len(self._points) >= SERIES_MAX:
                self.dropped += 1
                return
            points = self._points[key] = deque(maxlen=int(WINDOW_S / SAMPLE_S) + 1)
        points.append((now, value))

    def series(self, key: Key) -> list[tuple[float, float]]:
        """A level series as recorded, or a counter's series as rates per second between samples."""
        with self._lock:
            points = list(self._points.get(key, ()))
        if key[0] == "lag":
            return points
        return [(t1, max(0.0, (v1 - v0) / (t1 - t0))) for (t0, v0), (t1, v1) in itertools.pairwise(points)
                if t1 > t0]

    def latest_rate(self, key: Key) -> float | None:
        rates = self.series(key)
        return rates[-1][1] if rates else None

    def forget(self, keep: Iterable[Key]) -> None:
        """Drop series not in ``keep`` (deleted topics, groups gone)."""
        kept = set(keep)
        with self._lock:
            for key in [k for k in self._points if k not in kept]:
                del self._points[key]

    def sample(self, broker: Broker, topics: Iterable[Topic]) -> None:
        """One sample of ``topics`` and of every group. From any thread: it reads the committed offsets
        (their database) and the streams' ends, never the broker's loop-owned tables."""
        now = self._clock()
        keys: list[Key] = []
        consumed: dict[str, int] = {}
        for group in broker.offsets.groups():
            lag = 0
            for (name, partition), entry in broker.offsets.fetch(group).items():
                end = broker.end_offset_of(name, partition)
                if end is not None:
                    lag += max(0, end - entry.offset)
                    consumed[name] = consumed.get(name, 0) + entry.offset
            self.record(("lag", group), lag, now)
            keys.append(("lag", group))
        for topic in topics:
            ends = (broker.end_offset_of(topic.name, p) for p in range(topic.partitions))
            self.record(("produced", topic.name), sum(e for e in ends if e is not None), now)
            self.record(("consumed", topic.name), consumed.get(topic.name, 0), now)
            keys += [("produced", topic.name), ("consumed", topic.name)]
        self.forget(keys)

    async def run(self, broker: Broker, interval_s: float = SAMPLE_S) -> None:
        """Sample every ``interval_s`` until cancelled: the topic table read on the loop, the rest in a
        thread (the committed offsets are a database's)."""
        failing = False
        while True:
            try:
                await asyncio.to_thread(self.sample, broker, broker.topics.all())
                failing = False
            except StratalogError as e:   # the offsets' database out of reach: the next sample tries again
                if not failing:
                    log.warning("the console's plots missed a sample (they go on at the next): %s", e)
                failing = True
            await asyncio.sleep(interval_s)
