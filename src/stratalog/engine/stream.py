"""Stream: the handle on one stream that StreamStore gives out; each call goes to the store's part for it."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import NamedTuple

from stratalog.engine.appends import Appends
from stratalog.engine.batch import StoredBatch
from stratalog.engine.log_cache import StreamState
from stratalog.engine.reads import Reads
from stratalog.engine.retention import Retention
from stratalog.engine.txn_view import READ_COMMITTED, Isolation
from stratalog.records import NewRecord, Record

#: A fetch's default bound on what it returns, as Kafka's fetch.max.bytes of a partition.
FETCH_BYTES_MAX_DEFAULT = 1 << 20


class StreamParts(NamedTuple):
    """The store's parts a stream handle calls."""

    appends: Appends
    reads: Reads
    retention: Retention


class Stream:
    """A handle on one stream. Cheap; get one from ``StreamStore.create_stream`` or ``open_stream``."""

    def __init__(self, parts: StreamParts, state: StreamState) -> None:
        self._parts = parts
        self._state = state

    @property
    def stream_id(self) -> int:
        return self._state.stream_id

    @property
    def name(self) -> str | None:
        return self._state.name

    @property
    def start_offset(self) -> int:
        """The first offset still kept (records below were trimmed or expired)."""
        return self._state.start_offset

    @property
    def end_offset(self) -> int:
        """One past the last acknowledged record: the offset the next durable append will get at least."""
        return self._state.durable_end

    @property
    def uploaded_end_offset(self) -> int:
        """One past the last record in objects: reads from here on are served from memory."""
        return self._state.committed_end

    def append(self, records: Sequence[bytes | NewRecord]) -> Future[int]:
        """Append records as one batch; the future completes with the first record's offset once durable."""
        return self._parts.appends.append(self._state, records)

    def append_kafka(self, kafka_batch: bytes | memoryview, count: int, max_timestamp_ms: int, *,
                     wait_s_max: float | None = None) -> Future[int]:
        """Append one Kafka RecordBatch (magic 2, already checked: ``stratalog.kafka.records``) of ``count``
        records as it is, its baseOffset set to the offset it gets; the future completes with that offset
        once durable. Readers of either kind (``fetch``, ``fetch_batches``) see its records.

        When the log cache or the WAL is full, waits up to ``wait_s_max`` (default ``append_wait_s_max``;
        0: not at all) for uploads to make room, then raises BackpressureError."""
        return self._parts.appends.append_kafka(self._state, kafka_batch, count, max_timestamp_ms, wait_s_max)

    def fetch_batches(self, start_offset: int, max_bytes: int = FETCH_BYTES_MAX_DEFAULT, *,
                      at_least_one: bool = True) -> list[StoredBatch]:
        """The stored batches holding ``start_offset`` and the offsets after it, whole (the first may begin
        before ``start_offset``), their bodies ``max_bytes`` at most in all (a Kafka batch's body is the
        batch as Kafka sends it); with ``at_least_one``, the first batch whatever its size, so that a
        reader always progresses (Kafka's rule for a fetch's first batch)."""
        return self._parts.reads.fetch_batches(self._state, start_offset, max_bytes, at_least_one)

    def fetch(self, start_offset: int, end_offset: int | None = None,
              max_bytes: int = FETCH_BYTES_MAX_DEFAULT, *, isolation: Isolation = READ_COMMITTED) -> list[Record]:
        """Records from ``start_offset`` (up to ``end_offset``), in order, about ``max_bytes`` of values at
        most but always at least one record when one exists.

        Kafka transactions (``isolation``, named as Kafka's isolation.level): ``"read_committed"``, the
        default, returns committed records only. The read ends at the last stable offset (where the oldest
        transaction still open began) and skips the records of aborted transactions, as the store's view
        of its transactions says: a broker installs its partition leader's (``StreamStore.set_txn_view``).
        A store with no view (opened on a data directory at rest) reads every record, but raises
        TransactionsUnknownError at a transactional batch, which may be an aborted one; data appended
        through this API never is. ``"read_uncommitted"`` returns the records of every transaction,
        committed, aborted or still open, and needs no view. Either way a transaction's markers (control
        batches) take an offset and give no record, so offsets may skip."""
        return self._parts.reads.fetch(self._state, start_offset, end_offset, max_bytes, isolation)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset whose record timestamp is >= ``timestamp_ms`` (None: no such record yet)."""
        return self._parts.reads.offset_for_timestamp(self._state, timestamp_ms)

    def latest_timestamp(self) -> tuple[int, int] | None:
        """``(offset, timestamp_ms)`` of the first record with the largest timestamp (None: no records)."""
        return self._parts.reads.latest_timestamp(self._state)

    def trim(self, new_start_offset: int) -> None:
        """Drop records below ``new_start_offset``; durable when it returns."""
        self._parts.retention.trim(self._state, new_start_offset)

    def __repr__(self) -> str:
        s = self._state
        return f"Stream(id={s.stream_id}, name={s.name!r}, start={s.start_offset}, end={s.durable_end})"
