"""Reads: records and batches from objects (through the block cache, with readahead for a sequential
reader and the cold-read byte-rate bound) below a stream's committed end, then from the log cache up to
its durable end; lookups by timestamp the same way. A fetch of records is read_committed unless asked
otherwise: it ends at the last stable offset and skips what aborted transactions wrote, as the view of the
stream's transactions its owner installed says (txn_view.py)."""

from __future__ import annotations

from stratalog.engine.batch import (
    ENCODING_KAFKA,
    BatchInfo,
    StoredBatch,
    check_batch,
    decode_records,
    read_batch_info,
    record_timestamps,
    stored_batch,
)
from stratalog.engine.cold_reads import Pacer
from stratalog.engine.core import StoreCore
from stratalog.engine.errors import OffsetOutOfRangeError
from stratalog.engine.log_cache import LogEntry, StreamState
from stratalog.engine.metadata import RangeRow
from stratalog.engine.objformat import DATA_BLOCK_BYTES_TARGET, placed_batches
from stratalog.engine.txn_view import (
    READ_COMMITTED,
    CommittedFilter,
    Isolation,
    TransactionsUnknownError,
    TxnView,
    check_isolation,
    committed_read,
)
from stratalog.records import Record


class Reads:
    """The store's read path (see the module's docstring)."""

    def __init__(self, core: StoreCore) -> None:
        self._core = core
        config = core.config
        limit = config.cold_read_bytes_per_s_max
        self._cold_pacer = Pacer(limit) if limit is not None else None
        # Readahead never asks for more than half the block cache, or blocks fetched ahead would evict
        # each other before the reader gets to them.
        self._readahead_blocks_max = max(1, min(config.readahead_blocks_max,
                                                config.block_cache_bytes_max // (2 * DATA_BLOCK_BYTES_TARGET)))
        #: What the store's owner (a broker) knows of the streams' transactions; None: nothing.
        self.txn_view: TxnView | None = None

    def _window(self, st: StreamState, start: int, end: int | None) -> tuple[int, int, list[LogEntry]]:
        """Where a read from ``start`` stops (``end``, at most the durable end), the committed end, and the
        log-cache batches past it up to the stop, taken together under the lock."""
        core = self._core
        core.check_not_closed()
        with core.lock:
            low, visible_end, committed = st.start_offset, st.durable_end, st.committed_end
            if start < low or start > visible_end:
                raise OffsetOutOfRangeError(
                    f"stream {st.stream_id}: offset {start} is outside [{low}, {visible_end}]")
            stop = visible_end if end is None else min(end, visible_end)
            return stop, committed, st.cached_between(max(start, committed), stop)

    def fetch(self, st: StreamState, start: int, end: int | None, max_bytes: int,
              isolation: Isolation = READ_COMMITTED) -> list[Record]:
        check_isolation(isolation)
        try:
            return self._fetch(st, start, end, max_bytes, isolation == READ_COMMITTED)
        except TransactionsUnknownError as e:   # said with the stream's name, which the filter does not hold
            raise TransactionsUnknownError(f"stream {st.name or st.stream_id}: {e}") from None

    def _fetch(self, st: StreamState, start: int, end: int | None, max_bytes: int,
               committed_only: bool) -> list[Record]:
        stop, committed, tail = self._window(st, start, end)
        txns = None
        if committed_only:   # the view asked with no store lock held (txn_view.TxnView says why)
            stop, txns = committed_read(self.txn_view, st.stream_id, start, stop)
        out: list[Record] = []
        budget = [max_bytes]
        if start < committed and start < stop:
            self._fetch_cold(st, start, min(stop, committed), out, budget, txns)
            if self._cold_pacer is not None:
                self._cold_pacer.take(max_bytes - budget[0])
            if budget[0] <= 0:
                return out
        pos = max(start, committed)
        for entry in tail:
            # Log-cache batches were encoded here or CRC-checked when the WAL was replayed.
            if not _take(entry.data, 0, read_batch_info(entry.data), pos, stop, out, budget, txns):
                break
            pos = entry.end_offset
        return out

    def fetch_batches(self, st: StreamState, start: int, max_bytes: int, at_least_one: bool) -> list[StoredBatch]:
        core = self._core
        stop, committed, tail = self._window(st, start, None)
        out: list[StoredBatch] = []
        budget = max_bytes

        def fits(size_bytes: int) -> bool:
            """Whether a batch of this size goes in: within what is left, or as the one batch promised."""
            return size_bytes <= budget or (at_least_one and not out)

        pos = start
        full = False
        if start < committed:
            ahead = self._readahead(st, start)
            while pos < min(stop, committed) and not full:
                row = self._cold_row(st, pos, ahead)
                if row is None:
                    break
                block = core.blocks.get(row)  # its CRC, which covers every batch in it, is checked
                for at, info in placed_batches(block, row.entry()):
                    if info.end_offset <= pos:
                        continue
                    batch = stored_batch(block, at, info)
                    if not fits(len(batch.body)):
                        full = True
                        break
                    out.append(batch)
                    budget -= len(batch.body)
                    pos = info.end_offset
                if not full:
                    pos = max(pos, row.end_offset)
                    if ahead:
                        core.blocks.release(row)  # read to its end: first to go when room is needed
            st.read_next = pos
            if self._cold_pacer is not None:
                self._cold_pacer.take(max_bytes - budget)
            if full:
                return out
            pos = max(pos, committed)
        for entry in tail:
            if entry.end_offset <= pos:
                continue
            batch = stored_batch(entry.data, 0, read_batch_info(entry.data))
            if not fits(len(batch.body)):
                break
            out.append(batch)
            budget -= len(batch.body)
        return out

    def _readahead(self, st: StreamState, start: int) -> int:
        """How many blocks to fetch ahead of a cold read from ``start``: none for a reader that jumped,
        twice as many as last time (up to the bound) for one that goes on where it stopped."""
        sequential = st.read_next == start
        st.readahead_blocks = min(st.readahead_blocks * 2, self._readahead_blocks_max) if sequential else 1
        return st.readahead_blocks if sequential else 0

    def _cold_row(self, st: StreamState, pos: int, ahead: int) -> RangeRow | None:
        """The uploaded block holding ``pos``, after asking the block cache for the ``ahead`` after it."""
        rows = self._core.cold_rows.rows(st.stream_id, pos, 1 + ahead)
        if not rows:
            return None
        if ahead:
            self._core.blocks.prefetch(rows[1:])
        return rows[0]

    def _fetch_cold(self, st: StreamState, start: int, stop: int, out: list[Record], budget: list[int],
                    txns: CommittedFilter | None) -> None:
        blocks = self._core.blocks
        pos = start
        ahead = self._readahead(st, start)
        while pos < stop:
            row = self._cold_row(st, pos, ahead)
            if row is None:
                break
            block = blocks.get(row)  # its CRC, which covers every batch in it, is checked
            # Offsets come from the block's row, not the batch headers (provisional in a Spark write's object).
            for at, info in placed_batches(block, row.entry()):
                if info.end_offset > pos and not _take(block, at, info, pos, stop, out, budget, txns):
                    st.read_next = out[-1].offset + 1 if out else pos
                    return
            pos = row.end_offset
            if ahead:
                blocks.release(row)  # read to its end: first to go when room is needed
        st.read_next = pos

    def offset_for_timestamp(self, st: StreamState, timestamp_ms: int) -> int | None:
        core = self._core
        core.check_not_closed()
        with core.lock:
            low, committed = st.start_offset, st.committed_end
            tail = st.cached_between(committed, st.durable_end)
        row = core.meta.first_range_at_or_after_time(st.stream_id, timestamp_ms) if low < committed else None
        if row is not None:
            block = core.blocks.get(row)
            for at, info in placed_batches(block, row.entry()):
                for offset, ts in record_timestamps(block, at, info):
                    if ts >= timestamp_ms and offset >= low:
                        return offset
        for entry in tail:
            if entry.max_timestamp_ms >= timestamp_ms:
                info = check_batch(entry.data)
                for offset, ts in record_timestamps(entry.data, 0, info):
                    if ts >= timestamp_ms and offset >= low:
                        return offset
        return None

    def latest_timestamp(self, st: StreamState) -> tuple[int, int] | None:
        core = self._core
        core.check_not_closed()
        with core.lock:
            low, committed = st.start_offset, st.committed_end
            tail = st.cached_between(max(low, committed), st.durable_end)
        row = core.meta.latest_range(st.stream_id, low) if low < committed else None
        best_ts = row.max_timestamp_ms if row is not None else None
        entry = max(tail, key=lambda e: e.max_timestamp_ms, default=None)  # max() keeps the first of ties
        if entry is not None and (best_ts is None or entry.max_timestamp_ms > best_ts):
            info = read_batch_info(entry.data)
            candidates = record_timestamps(entry.data, 0, info)
            best_ts = entry.max_timestamp_ms
        elif row is not None:
            block = core.blocks.get(row)
            candidates = (pair for at, info in placed_batches(block, row.entry())
                          for pair in record_timestamps(block, at, info))
        else:
            return None
        for offset, ts in candidates:
            if ts == best_ts and offset >= low:
                return offset, ts
        return None


def _take(buf: bytes, at: int, info: BatchInfo, start: int, stop: int, out: list[Record],
          budget: list[int], txns: CommittedFilter | None) -> bool:
    """Decode the batch ``info`` at ``buf[at:]`` into ``out``; False once ``stop`` or the budget is reached.
    ``txns`` (None: read_uncommitted) skips a Kafka batch an aborted transaction wrote."""
    if txns is not None and info.encoding == ENCODING_KAFKA:
        if info.base_offset >= stop:
            return False   # past the read: not judged (with no view, it would fail a read that ends before it)
        if txns.skips(buf, at, info):
            return info.end_offset < stop
    left = budget[0]
    try:
        for rec in decode_records(buf, at, info, start):
            if rec.offset >= stop or (left <= 0 and out):
                return False
            out.append(rec)
            left -= len(rec.value) + (len(rec.key) if rec.key else 0)
        return left > 0
    finally:
        budget[0] = left
