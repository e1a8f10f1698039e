"""Each partition's transactions as its leader knows them: which producers have a transaction open in it and
where each began, and the ranges its abort markers closed. From these come what read_committed consumers
get: the last stable offset (where the oldest open transaction begins) and the aborted transactions of
what a Fetch returns. Kept per stream (a deleted topic's partitions and a new topic of the same name never
share them). No I/O here: broker/txn_markers.py writes markers and makes the ranges durable, and
producer_recovery.py snapshots the open transactions and rebuilds them from the log after a restart or
when a broker of a cluster gains the partition.

A transaction opens in a partition with the first transactional batch of its producer there (recorded as
the batch is appended, at the partition's end before it: never after where the batch lands) and ends with
its producer's next marker there. A marker of a producer with nothing open ends nothing (a transaction
that wrote nothing in an added partition, or a marker written twice after a restart). This is Kafka's
design (the producer state and the aborted transaction index of each partition), so a partition's leader
answers read_committed without asking the coordinator, wherever the coordinator runs.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from stratalog.kafka.control_batch import MarkerType

#: Beyond every offset: the ranges of a deleted partition end below it.
ALL_OFFSETS_END = 2**63 - 1


@dataclass(frozen=True, slots=True, order=True)
class AbortedRange:
    """Records of ``producer_id`` from ``first_offset`` up to its abort marker at ``last_offset`` were
    aborted (what Fetch's aborted_transactions lists for read_committed consumers). Ordered by marker."""

    last_offset: int
    producer_id: int
    first_offset: int


class PartitionTxns:
    """Open transactions and aborted ranges, per stream id. Every method runs on the broker's event loop."""

    def __init__(self) -> None:
        #: Per stream, each producer with a transaction open in it and the offset it began at (or below).
        self._open: dict[int, dict[int, int]] = {}
        #: Per stream, its aborted ranges by marker offset.
        self._aborted: dict[int, list[AbortedRange]] = {}
        #: Per stream, the longest of its ranges (marker offset less first offset): a lookup stops at the
        #: first range whose marker lies this far past the offsets asked (every later one begins after them).
        self._span_max: dict[int, int] = {}
        #: Per stream, where each marker being written can land at the lowest: a snapshot of the open
        #: transactions must end below them until their ranges are durable (producer_recovery.py).
        self._marking: dict[int, list[int]] = {}

    # The write path ------------------------------------------------------------------------------------

    def began(self, stream_id: int, producer_id: int, first_offset: int) -> None:
        """A transactional batch of ``producer_id`` goes to the stream at ``first_offset`` or above."""
        self._open.setdefault(stream_id, {}).setdefault(producer_id, first_offset)

    def aborts(self, stream_id: int, producer_id: int, kind: MarkerType, marker_offset: int) -> AbortedRange | None:
        """The range a marker at ``marker_offset`` closes, if it aborts a transaction open in the stream."""
        first = self._open.get(stream_id, {}).get(producer_id)
        if kind is not MarkerType.ABORT or first is None:
            return None
        return AbortedRange(marker_offset, producer_id, first)

    def ended(self, stream_id: int, producer_id: int, aborted: AbortedRange | None) -> None:
        """A marker of ``producer_id`` was written (and ``aborted``, its range if any, is durable)."""
        open_here = self._open.get(stream_id)
        if open_here is not None:
            open_here.pop(producer_id, None)
            if not open_here:
                del self._open[stream_id]
        if aborted is not None:
            # Ordered by marker, so the same range recorded again (a replay) is found by bisection: a
            # partition may keep many thousands.
            ranges = self._aborted.setdefault(stream_id, [])
            at = bisect.bisect_left(ranges, aborted)
            if at == len(ranges) or ranges[at] != aborted:
                ranges.insert(at, aborted)
                span = aborted.last_offset - aborted.first_offset
                self._span_max[stream_id] = max(self._span_max.get(stream_id, 0), span)

    def marking(self, stream_id: int, lowest_offset: int) -> None:
        """A marker is being written to the stream at ``lowest_offset`` or above."""
        self._marking.setdefault(stream_id, []).append(lowest_offset)

    def marked(self, stream_id: int, lowest_offset: int) -> None:
        """The marker announced by :meth:`marking` is written and its state recorded (or it failed)."""
        bounds = self._marking.get(stream_id, [])
        bounds.remove(lowest_offset)
        if not bounds:
            self._marking.pop(stream_id, None)

    # The read path -------------------------------------------------------------------------------------

    def last_stable_offset(self, stream_id: int, high_watermark: int) -> int:
        """The offset below which every transaction of the stream has ended (read_committed's end)."""
        starts = self._open.get(stream_id)
        return min(high_watermark, *starts.values()) if starts else high_watermark

    def aborted_ranges(self, stream_id: int, from_offset: int, to_offset: int) -> list[AbortedRange]:
        """The aborted ranges of the stream that overlap ``[from_offset, to_offset)``."""
        ranges = self._aborted.get(stream_id, [])
        # Ranges ordered by marker: those ending below from_offset are skipped by bisection, and the walk
        # ends where a marker lies past to_offset by more than the longest range (none after begins before).
        at = bisect.bisect_left(ranges, AbortedRange(from_offset, -1, -1))
        stop_after = to_offset + self._span_max.get(stream_id, 0)
        found = []
        for r in itertools.islice(ranges, at, None):
            if r.last_offset > stop_after:
                break
            if r.first_offset < to_offset:
                found.append(r)
        return found

    def open_first_offset(self, stream_id: int, producer_id: int) -> int:
        """Where the open transaction of ``producer_id`` began in the stream (-1: none open there)."""
        return self._open.get(stream_id, {}).get(producer_id, -1)

    # Snapshots and recovery ----------------------------------------------------------------------------

    def snapshot_bound(self, stream_id: int, end_offset: int) -> int:
        """Where a snapshot of the stream's open transactions taken now may end: below every marker still
        being written, so a restart reads each of those markers again and records its range."""
        bounds = self._marking.get(stream_id)
        return min(end_offset, *bounds) if bounds else end_offset

    def open_of(self, stream_id: int) -> dict[int, int]:
        """The stream's open transactions: where each producer's began."""
        return dict(self._open.get(stream_id, {}))

    def ranges_of(self, stream_id: int) -> list[AbortedRange]:
        return list(self._aborted.get(stream_id, ()))

    def entries(self) -> list[tuple[int, int, int]]:
        """(stream id, producer id, first offset) of every open transaction: what a snapshot keeps."""
        return [(stream_id, pid, first) for stream_id, opened in self._open.items() for pid, first in opened.items()]

    def restore(self, stream_id: int, open_txns: dict[int, int], aborted: list[AbortedRange]) -> None:
        """Replace what is known of a stream (its snapshot's open transactions, its durable ranges)."""
        self.forget(stream_id)
        if open_txns:
            self._open[stream_id] = dict(open_txns)
        if aborted:
            self._aborted[stream_id] = sorted(aborted)
            self._span_max[stream_id] = max(r.last_offset - r.first_offset for r in aborted)

    def forget(self, stream_id: int) -> None:
        """The stream is no longer led here, or deleted."""
        self._open.pop(stream_id, None)
        self._aborted.pop(stream_id, None)
        self._span_max.pop(stream_id, None)

    def trimmed(self, stream_id: int, start_offset: int) -> bool:
        """Drop the ranges that end below the stream's start (retention or DeleteRecords took their records):
        whether any went."""
        ranges = self._aborted.get(stream_id)
        if not ranges or ranges[0].last_offset >= start_offset:
            return False
        self._aborted[stream_id] = [r for r in ranges if r.last_offset >= start_offset]
        return True

    def streams_with_ranges(self) -> list[int]:
        return list(self._aborted)
