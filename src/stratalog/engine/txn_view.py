"""What a read of a stream must know of its Kafka transactions, and the filter a read_committed fetch applies.

Kafka transactions come through the broker: a transactional producer's batches, then one commit or abort
marker (a control batch) per partition. The broker's partition leader keeps each stream's open transactions
and aborted ranges (broker/txn_partitions.py); the engine never imports the broker, so it says here what a
read needs of them (``TxnView``) and the store's owner installs one (``StreamStore.set_txn_view``).
reads.py asks it once per ``Stream.fetch`` (``committed_read``), and the ``CommittedFilter`` that comes out
judges each stored batch as Kafka's consumers do:

| batch                                   | read_uncommitted | read_committed, a view | read_committed, no view  |
|-----------------------------------------|------------------|------------------------|--------------------------|
| native (``Stream.append``)              | its records      | its records            | its records              |
| Kafka, not transactional                | its records      | its records            | its records              |
| Kafka control batch (a marker)          | no record        | no record              | no record                |
| Kafka transactional, an aborted range   | its records      | skipped                | TransactionsUnknownError |
| of its producer covers it               |                  |                        |                          |
| Kafka transactional, no such range      | its records      | its records            | TransactionsUnknownError |

and a read_committed read with a view ends at the last stable offset (where the oldest transaction still
open began). An aborted range is Kafka's: the producer's batches from its ``first_offset`` to its abort
marker at ``last_offset``. A store with no view (opened on a data directory at rest, or embedded, never
a broker's) cannot tell an aborted record from a committed one, so a read_committed read fails at the
first transactional batch rather than return what may be aborted; a store written by ``Stream.append``
alone has none, and reads as it always did.

Native batches are never transactional, and reads.py asks the filter only of Kafka batches: the plain read
path pays one comparison per batch, nothing per record.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Final, Literal, Protocol

from stratalog.engine.batch import BATCH_HEADER_BYTES, BatchInfo, CorruptBatchError
from stratalog.errors import StratalogError
from stratalog.kafka.batch_format import (
    ATTRIBUTES,
    ATTRIBUTES_POSITION,
    BASE_OFFSET,
    CONTROL_BIT,
    HEADER_BYTES,
    PRODUCER_ID_POSITION,
    TRANSACTIONAL_BIT,
)

#: Which records a fetch returns of Kafka transactions, named as Kafka's ``isolation.level`` values (and
#: the Spark source's ``isolationLevel`` option): committed ones only, or every one.
Isolation = Literal["read_committed", "read_uncommitted"]
READ_COMMITTED: Final = "read_committed"
READ_UNCOMMITTED: Final = "read_uncommitted"
ISOLATION_LEVELS: Final = (READ_COMMITTED, READ_UNCOMMITTED)
#: A producer id is an int64 in the Kafka batch header, as the base offset is.
_PRODUCER_ID = BASE_OFFSET


class TransactionsUnknownError(StratalogError):
    """A read_committed fetch met a transactional batch and the store has no view of its transactions
    (no broker installed one): it cannot tell an aborted record from a committed one. The message says
    how to read instead."""


class AbortedSpan(Protocol):
    """An aborted transaction in a stream: ``producer_id``'s batches from ``first_offset`` up to its abort
    marker at ``last_offset`` (the broker's AbortedRange)."""

    @property
    def producer_id(self) -> int: ...

    @property
    def first_offset(self) -> int: ...

    @property
    def last_offset(self) -> int: ...


class TxnView(Protocol):
    """What a read needs of a stream's transactions, from whoever writes them (the broker's partition
    leader). Called from the reading thread, never with a store lock held (an implementation may wait for
    another thread, such as the broker's event loop, which may itself wait for a store lock), and in this
    order: ``last_stable_offset``, then ``aborted_ranges`` up to it. A transaction that ends between the two
    calls has its range recorded when it ends, so the second call finds every range the first call's
    offset needs."""

    def last_stable_offset(self, stream_id: int, high_watermark: int) -> int:
        """The offset below which every transaction of the stream has ended (at most ``high_watermark``)."""
        ...

    def aborted_ranges(self, stream_id: int, from_offset: int, to_offset: int) -> Sequence[AbortedSpan]:
        """The stream's aborted ranges that overlap ``[from_offset, to_offset)``."""
        ...


def check_isolation(isolation: str) -> None:
    if isolation not in ISOLATION_LEVELS:
        raise ValueError(f"isolation must be {' or '.join(ISOLATION_LEVELS)}, not {isolation!r}")


class CommittedFilter:
    """Which Kafka batches a read_committed fetch skips: those an aborted range of their producer covers.
    Built per fetch from the ranges overlapping it; ``unknown`` (no view) says why none can be judged."""

    __slots__ = ("_firsts", "_markers", "_unknown")

    def __init__(self, ranges: Iterable[AbortedSpan] = (), unknown: str | None = None) -> None:
        #: Each producer's abort markers ascending, and the first offset of each one's range. A producer has
        #: one transaction open in a stream at a time, so its ranges never overlap.
        self._markers: dict[int, list[int]] = {}
        self._firsts: dict[int, list[int]] = {}
        for r in sorted(ranges, key=lambda r: r.last_offset):
            self._markers.setdefault(r.producer_id, []).append(r.last_offset)
            self._firsts.setdefault(r.producer_id, []).append(r.first_offset)
        self._unknown = unknown

    def skips(self, buf: bytes | memoryview, at: int, info: BatchInfo) -> bool:
        """Whether the Kafka batch ``info`` at ``buf[at:]`` is one an aborted transaction wrote (a marker is
        not: it holds no record to skip). Raises TransactionsUnknownError for a transactional batch when
        the store has no view of its transactions."""
        body_at = at + BATCH_HEADER_BYTES
        if info.batch_bytes - BATCH_HEADER_BYTES < HEADER_BYTES:
            raise CorruptBatchError(f"batch at offset {info.base_offset}: a Kafka batch of "
                                    f"{info.batch_bytes - BATCH_HEADER_BYTES} bytes has no whole header")
        (attributes,) = ATTRIBUTES.unpack_from(buf, body_at + ATTRIBUTES_POSITION)
        if not attributes & TRANSACTIONAL_BIT or attributes & CONTROL_BIT:
            return False
        last = info.end_offset - 1
        if self._unknown is not None:
            raise TransactionsUnknownError(f"offsets {info.base_offset}-{last} were written by a transaction, and "
                                           f"{self._unknown}")
        (producer_id,) = _PRODUCER_ID.unpack_from(buf, body_at + PRODUCER_ID_POSITION)
        markers = self._markers.get(producer_id)
        if markers is None:
            return False
        # Kafka's consumer: the producer's first abort marker after the batch's start aborts the batch if its
        # range begins at or before the batch's last offset.
        i = bisect.bisect_right(markers, info.base_offset)
        return i < len(markers) and self._firsts[producer_id][i] <= last


#: Why a store with no view cannot judge a transactional batch, and how to read it instead.
NO_VIEW = ("this store has no view of its transactions to tell whether it was aborted (a broker's partition "
           "leader knows; a store opened on its data directory at rest does not): read through the broker "
           "(Kafka Fetch with isolation.level=read_committed, or the Spark data source), or read every record "
           f"with isolation={READ_UNCOMMITTED!r}")


#: The filter of every read_committed read with no view: made once, so that such a read (every read of a
#: store no broker owns) allocates nothing for it.
NO_VIEW_FILTER = CommittedFilter(unknown=NO_VIEW)


def committed_read(view: TxnView | None, stream_id: int, start: int, stop: int) -> tuple[int, CommittedFilter]:
    """Where a read_committed read of ``[start, stop)`` ends (the last stable offset, if before ``stop``)
    and the filter for its batches, from ``view`` (None: no view; the read ends at ``stop`` and fails at a
    transactional batch). Call with no store lock held (TxnView says why)."""
    if view is None:
        return stop, NO_VIEW_FILTER
    stable = min(stop, view.last_stable_offset(stream_id, stop))
    ranges = view.aborted_ranges(stream_id, start, stable) if start < stable else ()
    return stable, CommittedFilter(ranges)
