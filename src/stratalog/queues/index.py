"""The in-memory index of the queue store: compact arrays, no Python object per message, run or block.

``RunIndex``: where each queue's runs lie in the uploaded objects, as two u32 matrices indexed
``[stream, object]``: ``ends[s, k]`` is stream s's end offset after object k, and its run in object k
spans bytes ``positions[s, k] .. positions[s + 1, k]``. A queue's row is contiguous, so one random
lookup touches one or two cache lines whatever the number of objects: 8 bytes per queue per object.

``TailIndex``: the same question for the log cache (records not yet uploaded), built on demand by
sorting every cached run by stream: a CSR array over streams, 16 bytes per cached run.
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from stratalog.invariant import InvariantError, invariant
from stratalog.native import native
from stratalog.queues.format import U32, U32s

#: Columns (objects) are added in chunks of at least this many, rows (streams) grown by a quarter:
#: a reallocation copies the matrices, so it must be rare, and spare room costs 8 bytes per cell.
COLUMNS_GROWTH_MIN = 8
ROWS_GROWTH = 1.25


@dataclass(frozen=True, slots=True)
class RunIndex:
    ends: U32s               # [rows, capacity]
    positions: U32s          # [rows + 1, capacity]
    objects: int             # columns in use
    stream_counts: tuple[int, ...]   # streams each object covers
    # The matrices as flat views of native u32, for :meth:`row` (a slice of a view and its ``tolist``
    # cost a third of NumPy's 2-D slicing for a row of a few objects) and a random get's compiled read.
    ends_flat: memoryview = field(init=False, repr=False, compare=False)
    positions_flat: memoryview = field(init=False, repr=False, compare=False)
    #: Columns the matrices have room for: a stream's run in object k stops at ``positions[capacity + k]``
    #: of its :meth:`row`. (Plain ints, as ``rows``: NumPy's ``shape`` costs a reader a tuple per look.)
    capacity: int = field(init=False, repr=False, compare=False)
    rows: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Views, not copies: a new object's column is written in place (see with_object).
        invariant(self.ends.flags.c_contiguous and self.positions.flags.c_contiguous, "the matrices are C-contiguous")
        object.__setattr__(self, "ends_flat", self.ends.reshape(-1).data.cast("B").cast("I"))
        object.__setattr__(self, "positions_flat", self.positions.reshape(-1).data.cast("B").cast("I"))
        object.__setattr__(self, "capacity", int(self.ends.shape[1]))
        object.__setattr__(self, "rows", int(self.ends.shape[0]))

    @classmethod
    def empty(cls) -> RunIndex:
        return cls(np.zeros((0, 0), U32), np.zeros((1, 0), U32), 0, ())

    @property
    def nbytes(self) -> int:
        return int(self.ends.nbytes + self.positions.nbytes)

    @property
    def used_bytes(self) -> int:
        """Bytes the objects' indexes need: 8 per stream per object."""
        return sum(8 * n + 4 for n in self.stream_counts)

    def with_object(self, ends: U32s, positions: U32s) -> RunIndex:
        """This index plus one object. Writes the new column in place when there is room: readers of
        this index never read past its ``objects`` columns."""
        streams = len(ends)
        k = self.objects
        matrix_e, matrix_p = self.ends, self.positions
        rows_needed = max(streams, self.rows)
        if rows_needed > self.rows or k >= matrix_e.shape[1]:
            rows = self.rows if rows_needed <= self.rows else max(rows_needed, int(self.rows * ROWS_GROWTH))
            columns = matrix_e.shape[1] if k < matrix_e.shape[1] else max(COLUMNS_GROWTH_MIN, 2 * k)
            matrix_e = np.zeros((rows, columns), U32)
            matrix_e[:self.rows, :k] = self.ends[:, :k]
            matrix_p = np.zeros((rows + 1, columns), U32)
            matrix_p[:self.rows + 1, :k] = self.positions[:, :k]
            matrix_p[self.rows + 1:, :k] = self.positions[-1, :k]    # new streams: empty runs at each end
        matrix_e[:streams, k] = ends
        matrix_e[streams:, k] = 0
        matrix_p[:streams + 1, k] = positions
        matrix_p[streams + 1:, k] = positions[-1]
        return RunIndex(matrix_e, matrix_p, k + 1, (*self.stream_counts, streams))

    def with_merged(self, first: int, stop: int, columns: Sequence[tuple[U32s, U32s]]) -> RunIndex:
        """This index with objects ``first .. stop - 1`` replaced by the objects that merge them (their
        ``(ends, positions)`` in order). New matrices (readers of this index keep theirs), with spare room
        for a few more objects."""
        count = self.objects - (stop - first) + len(columns)
        columns_max = max(COLUMNS_GROWTH_MIN, count + COLUMNS_GROWTH_MIN)
        matrix_e = np.zeros((self.rows, columns_max), U32)
        matrix_p = np.zeros((self.rows + 1, columns_max), U32)
        after = first + len(columns)
        for matrix, old in ((matrix_e, self.ends), (matrix_p, self.positions)):
            matrix[:, :first] = old[:, :first]
            matrix[:, after:count] = old[:, stop:self.objects]
        for k, (ends, positions) in enumerate(columns, first):
            streams = len(ends)
            matrix_e[:streams, k] = ends
            matrix_p[:streams + 1, k] = positions
            matrix_p[streams + 1:, k] = positions[-1]
        counts = (*self.stream_counts[:first], *(len(ends) for ends, _ in columns), *self.stream_counts[stop:])
        return RunIndex(matrix_e, matrix_p, count, counts)

    def last_ends(self) -> U32s:
        """Every stream's end after the last object (a copy)."""
        if not self.objects:
            return np.zeros(0, U32)
        return np.ascontiguousarray(self.ends[:self.stream_counts[-1], self.objects - 1])

    def row(self, stream_id: int) -> tuple[list[int], memoryview]:
        """Stream ``stream_id``'s end offset after each object, and a view in which its run in object k
        starts at ``[k]`` and stops at ``[capacity + k]``: a reader's lookup. A stream past the rows has
        no runs (its ends are 0)."""
        k = self.objects
        capacity = self.capacity
        if stream_id >= self.rows:
            last = self.positions_flat[len(self.positions_flat) - capacity:].tolist()
            return [0] * k, memoryview(array.array("I", last + last))
        at = stream_id * capacity
        return self.ends_flat[at:at + k].tolist(), self.positions_flat[at:at + capacity + k]

    def end_of(self, stream_id: int) -> int:
        """Stream ``stream_id``'s end offset after the last object (0 with no objects or past the rows)."""
        if stream_id >= self.rows or not self.objects:
            return 0
        return int(self.ends_flat[stream_id * self.capacity + self.objects - 1])

    def lookup(self, stream_id: int) -> tuple[list[int], list[int], list[int]]:
        """Stream ``stream_id``'s end offset after each object, and where its run starts and stops in each."""
        ends, positions = self.row(stream_id)
        k, capacity = self.objects, self.capacity
        return ends, positions[:k].tolist(), positions[capacity:capacity + k].tolist()


@dataclass(frozen=True, slots=True)
class TailIndex:
    """Every run of some cached records, grouped by stream (records in order within a stream), with the
    end offset of each run so a read starts at the run that holds its first offset. Records an upload has
    taken since the build are None here (their messages let go), their runs skipped."""

    records: tuple[Any, ...]
    last_seq: int
    first_seq: int                    # of the first record still held (last_seq + 1: none)
    starts: npt.NDArray[np.int64]     # runs of stream s: starts[s] .. starts[s + 1]
    run_record: npt.NDArray[np.int32]
    run_first: npt.NDArray[np.int32]  # the run's first message in its record
    run_base: U32s                    # the stream's offset of that message
    run_end: U32s                     # the stream's end offset after the run
    built_at: float
    # Per record, as the C read takes them: its seq, its messages' bytes and int32 offsets (None where an
    # upload took it).
    seqs: tuple[int, ...] = ()
    datas: tuple[Any, ...] = ()
    message_ats: tuple[Any, ...] = ()

    @classmethod
    def empty(cls) -> TailIndex:
        """An index of no records, due for a rebuild at the next read of the log cache."""
        return cls((), -1, 0, np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, U32),
                   np.zeros(0, U32), -math.inf)

    @classmethod
    def build(cls, records: Sequence[Any]) -> TailIndex:
        if not records:
            return cls.empty()
        # 32-bit columns (stream ids and offsets fit): a full log cache at a million queues holds millions
        # of runs, and each column, its sorted copy and the sort order exist at once while building.
        ids = np.concatenate([r.stream_ids.astype(np.int32) for r in records])
        lengths = [len(r.stream_ids) for r in records]
        order = np.argsort(ids, kind="stable")
        streams = max(r.stream_count for r in records)
        starts = np.searchsorted(ids[order], np.arange(streams + 1, dtype=np.int32), side="left").astype(np.int64)
        del ids
        run_record = np.repeat(np.arange(len(records), dtype=np.int32), lengths)[order]
        run_first = np.concatenate([r.first_msg[:-1].astype(np.int32) for r in records])[order]
        run_base = np.concatenate([r.base_offsets.astype(U32) for r in records])[order]
        run_end = np.concatenate([(r.base_offsets + r.counts).astype(U32) for r in records])[order]
        return cls(tuple(records), records[-1].seq, records[0].seq, starts, run_record, run_first, run_base, run_end,
                   time.monotonic(), tuple(r.seq for r in records), tuple(r.data for r in records),
                   tuple(r.message_at for r in records))

    def without_through(self, seq: int) -> TailIndex:
        """This index with the records up to ``seq`` dropped (an upload took them): their runs are skipped,
        the rest stay indexed, so a reader of what is left needs no rebuild. Empty once none is left."""
        if seq < self.first_seq:
            return self
        if seq >= self.last_seq:
            return TailIndex.empty()
        records = tuple(None if r is None or r.seq <= seq else r for r in self.records)
        datas = tuple(None if r is None else d for r, d in zip(records, self.datas, strict=True))
        message_ats = tuple(None if r is None else m for r, m in zip(records, self.message_ats, strict=True))
        return dataclasses.replace(self, records=records, first_seq=seq + 1, datas=datas, message_ats=message_ats)

    def runs(self, stream_id: int, offset: int = 0, since_seq: int = 0,
             stop: int | None = None) -> list[tuple[Any, int, int, int]]:
        """``(record, first message in it, base offset, end offset)`` of each run of ``stream_id`` that ends
        after ``offset`` (and, given ``stop``, starts before it), oldest first, in the records still held
        from ``since_seq`` on. (All a reader needs from a run, as plain ints: no NumPy call per run.)"""
        if stream_id + 1 >= len(self.starts):
            return []
        a, b = self.starts.item(stream_id), self.starts.item(stream_id + 1)
        ends = self.run_end[a:b].tolist()
        # A stream has a few dozen runs here at most: bisect on a list beats NumPy's call overhead.
        if stop is not None:
            last = bisect.bisect_left(ends, stop) + 1    # the first run that reaches stop is the last one
            if last < len(ends):
                b = a + last
                del ends[last:]
        if offset:
            skip = bisect.bisect_right(ends, offset)
            a += skip
            del ends[:skip]
        runs = zip(map(self.records.__getitem__, self.run_record[a:b].tolist()), self.run_first[a:b].tolist(),
                   self.run_base[a:b].tolist(), ends, strict=True)
        return [run for run in runs if run[0] is not None and run[0].seq >= since_seq]

    def read(self, stream_id: int, pos: int, stop: int, since_seq: int, out: list[bytes]) -> int:
        """Append messages ``pos .. stop - 1`` of ``stream_id`` that this index's records from ``since_seq``
        on hold to ``out``, in order; return the offset reached. One C call where the compiled core is built
        (``_native.read_tail``), else :meth:`read_python`."""
        if _read_tail is None:
            return self.read_python(stream_id, pos, stop, since_seq, out)
        record_min = bisect.bisect_left(self.seqs, since_seq)
        reached: int = _read_tail(out, stream_id, pos, stop, record_min, self.starts, self.run_record,
                                  self.run_first, self.run_base, self.run_end, self.datas, self.message_ats)
        return reached

    def read_python(self, stream_id: int, pos: int, stop: int, since_seq: int, out: list[bytes]) -> int:
        """:meth:`read` as its runs read in turn: the twin of ``_native.read_tail``."""
        return read_runs(self.runs(stream_id, pos, since_seq, stop), pos, stop, out)


def read_runs(runs: Sequence[tuple[Any, int, int, int]], pos: int, stop: int, out: list[bytes]) -> int:
    """Append messages ``pos .. stop - 1`` of the ``(record, first message, base, end)`` runs of one stream,
    in order, to ``out``; return the offset reached. A run must start at or before where the last one
    left off; a run's messages must lie within its record (both the writer's: checked, never trusted)."""
    for rec, run_first, base, end in runs:
        if end <= pos:
            continue
        invariant(base <= pos, "the log cache's runs of a stream follow on from where its reader is")
        first = run_first + pos - base
        upto = min(stop, end)
        data, message_at = rec.data, rec.message_at
        if not (first >= 0 and first + upto - pos < len(message_at)):
            raise InvariantError("a log-cache run's messages lie past its record's message offsets")
        size = len(data)
        lo = message_at[first]
        for m in range(first + 1, first + upto - pos + 1):
            hi = message_at[m]
            if not 0 <= lo <= hi <= size:
                raise InvariantError("a log-cache message lies outside its record's bytes")
            out.append(bytes(data[lo:hi]))
            lo = hi
        pos = upto
        if pos >= stop:
            break
    return pos


_read_tail: Any = native.read_tail if native is not None else None
