"""Which stored batches a read returns: never a transaction's marker, and under read_committed never a batch
an aborted transaction wrote. The reference, in Python, of what Kafka's consumers do with Fetch's
aborted_transactions; spark/columns.py asks it of every Kafka batch it reads from objects.

A read of uploaded records gets each stream's aborted transactions from the partition's leader
(spark/txn_ranges.py, StratalogAbortedRanges): ``(producer_id, first_offset, last_offset)``, the producer's
transactional batches from ``first_offset`` up to its abort marker at ``last_offset`` aborted. A task may
hold a slice of a partition whose marker lies in another task's slice, or in no task's: the ranges, not
the records read, decide. A batch is dropped when it is transactional and a range of its producer
reaches it: the producer's first range whose marker lies after the batch begins at or before the batch's
last offset (Kafka's consumer: an aborted transaction applies from its first offset to its producer's
abort marker). A producer has at most one transaction open in a partition, so its ranges never overlap.

Where the ranges come from: a live broker's partition leaders (spark/txn_ranges.py), or, for a store at
rest, its data directory's producers.sqlite (spark/rest_txns.py). A read of a store's objects alone has
neither: under read_committed its tasks take ``UnknownTransactions``, which fails the read at the first
transactional batch (TransactionsUnknownError) rather than return what may be an aborted record.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence

from stratalog.errors import StratalogError
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.spark.plan import ReadPartition

#: Aborted transactions by stream id, as a task gets them (tuples: a partition's value stays immutable).
StreamTxns = tuple[tuple[int, tuple[AbortedTxn, ...]], ...]


class TransactionsUnknownError(StratalogError):
    """A read_committed read met a transactional batch it cannot judge (no broker and no producers.sqlite
    to say whether its transaction was aborted): the message says how to read it."""


class AbortedIndex:
    """One stream's aborted transactions, by producer, for asking of each batch whether it was aborted."""

    def __init__(self, ranges: Iterable[AbortedTxn]) -> None:
        by_producer: dict[int, list[AbortedTxn]] = {}
        for r in sorted(set(ranges)):
            by_producer.setdefault(r.producer_id, []).append(r)
        self._ranges = by_producer
        #: Each producer's abort markers, ascending (its ranges' last offsets), for bisection.
        self._markers = {pid: [r.last_offset for r in rs] for pid, rs in by_producer.items()}

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def aborted(self, producer_id: int, base_offset: int, last_offset: int) -> bool:
        """Whether a transactional batch of ``producer_id`` over ``[base_offset, last_offset]`` was aborted."""
        markers = self._markers.get(producer_id)
        if markers is None:
            return False
        at = bisect.bisect_right(markers, base_offset)  # the producer's first abort marker after the batch
        return at < len(markers) and self._ranges[producer_id][at].first_offset <= last_offset


def keeps(aborted: AbortedIndex | None, *, control: bool, transactional: bool, producer_id: int,
          base_offset: int, last_offset: int) -> bool:
    """Whether a read returns the records of a batch over ``[base_offset, last_offset]``: not a marker
    (``control``), and not a ``transactional`` batch that ``aborted`` (None: read_uncommitted) says an
    aborted transaction of ``producer_id`` wrote."""
    if control:
        return False
    return not (transactional and aborted is not None and aborted.aborted(producer_id, base_offset, last_offset))


class UnknownTransactions(AbortedIndex):
    """A stream whose aborted transactions are not known: asked of a transactional batch, it raises
    TransactionsUnknownError with ``reason`` (plain batches and markers never ask)."""

    def __init__(self, stream: str, reason: str) -> None:
        super().__init__(())
        self._stream = stream
        self._reason = reason

    def __bool__(self) -> bool:
        return True

    def aborted(self, producer_id: int, base_offset: int, last_offset: int) -> bool:
        raise TransactionsUnknownError(
            f"{self._stream}: offsets {base_offset}-{last_offset} were written by a transaction, and {self._reason}")


def ranges_for(part: ReadPartition, aborted: Mapping[int, Sequence[AbortedTxn]]) -> StreamTxns:
    """The aborted transactions a task reading ``part`` needs of ``aborted`` (each stream's, by stream id):
    those overlapping each slice (a range whose marker lies past the slice, in another task's, still
    applies here)."""
    out: dict[int, set[AbortedTxn]] = {}
    for piece in part.slices:
        for r in aborted.get(piece.stream_id, ()):
            if r.last_offset >= piece.start_offset and r.first_offset < piece.end_offset:
                out.setdefault(piece.stream_id, set()).add(r)
    return tuple((stream_id, tuple(sorted(txns))) for stream_id, txns in sorted(out.items()))
