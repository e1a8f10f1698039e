"""Filters Spark pushes down to a read, and what they leave to read."""

from __future__ import annotations

import datetime

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from stratalog.spark.plan import OffsetRange

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
#: Columns the source never leaves null (only ``key`` may be null).
_NEVER_NULL = frozenset({("stream",), ("offset",), ("timestamp",), ("value",)})
#: ... and in a queue read (``timestamp`` and ``key`` are always null there).
_NEVER_NULL_QUEUES = frozenset({("stream",), ("offset",), ("value",)})


class PushedFilters:
    """What filters on ``stream`` and ``offset`` leave to read: a set of labels and an offset range."""

    def __init__(self, queues: bool = False) -> None:
        self.never_null = _NEVER_NULL_QUEUES if queues else _NEVER_NULL
        self.labels: frozenset[str] | None = None
        self.offsets = OffsetRange()
        #: Blocks whose newest record is older than this (ms since the epoch) hold no wanted row.
        self.time_from_ms: int | None = None

    def take(self, item: Filter) -> bool:
        """Narrow by ``item`` if it is one we apply exactly; False leaves it to Spark."""
        column = getattr(item, "attribute", ())
        if isinstance(item, IsNotNull):
            return column in self.never_null
        if column == ("stream",):
            return self._take_stream(item)
        if column == ("offset",):
            return self._take_offset(item)
        if column == ("timestamp",):
            self._note_time(item)
        return False

    def _note_time(self, item: Filter) -> None:
        """Keep a lower bound on ``timestamp`` to skip blocks; the filter itself stays with Spark."""
        value = getattr(item, "value", None)
        if not isinstance(item, (GreaterThan, GreaterThanOrEqual, EqualTo)):
            return
        if not isinstance(value, datetime.datetime) or value.tzinfo is None:
            return  # Spark passes timestamps as aware datetimes; anything else is not ours to guess
        from_ms = (value - _EPOCH) // datetime.timedelta(milliseconds=1)
        self.time_from_ms = from_ms if self.time_from_ms is None else max(self.time_from_ms, from_ms)

    def _take_stream(self, item: Filter) -> bool:
        if isinstance(item, EqualTo) and isinstance(item.value, str):
            return self._labels(frozenset([item.value]))
        if isinstance(item, In) and all(isinstance(v, str) for v in item.value):
            return self._labels(frozenset(item.value))
        return False

    def _take_offset(self, item: Filter) -> bool:
        value = getattr(item, "value", None)
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        bounds = {
            EqualTo: (value, value + 1), GreaterThan: (value + 1, None), GreaterThanOrEqual: (value, None),
            LessThan: (None, value), LessThanOrEqual: (None, value + 1),
        }.get(type(item))
        if bounds is None:
            return False
        low, high = bounds
        self.offsets = self.offsets.intersect(max(low or 0, 0), self.offsets.end if high is None else high)
        return True

    def _labels(self, labels: frozenset[str]) -> bool:
        self.labels = labels if self.labels is None else self.labels & labels
        return True
