"""The log cache: bulk records in the WAL whose messages are not yet in objects, held in memory. Gets of
recent offsets read them here (through the store's TailIndex, or record by record for records it does not
hold); an upload merges a prefix of them into one run object, then trims the WAL."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from stratalog.queues.format import Ids


@dataclass(slots=True, eq=False)
class CachedRecord:
    """One bulk record in the log cache: messages in the WAL, not yet in an object."""

    seq: int
    wal_offset: int
    future: Future[int]
    stream_ids: Ids          # ascending, distinct
    base_offsets: Ids
    counts: Ids
    first_msg: Ids           # run i's messages are first_msg[i] .. first_msg[i + 1]
    data: bytes | memoryview  # the messages in the order of their runs: m is data[message_at[m]:message_at[m + 1]]
    message_at: memoryview   # int32, one more than the messages
    names: list[tuple[int, str]]
    stream_count: int        # streams known once this record was made
    cache_bytes: int
    written_at: float

    _array: Any = None

    def messages(self) -> Any:
        """The messages as an Arrow binary array (a view of the body, no copy), runs in order; made once."""
        array = self._array
        if array is None:
            offsets, data = pa.py_buffer(self.message_at), pa.py_buffer(self.data)
            array = self._array = pa.BinaryArray.from_buffers(pa.binary(), len(self.message_at) - 1,
                                                              [None, offsets, data])
        return array


def runs_in(records: Sequence[CachedRecord], stream_id: int) -> list[tuple[CachedRecord, int, int, int]]:
    """The run of ``stream_id`` in each of ``records`` that has one, as :meth:`TailIndex.runs` gives it."""
    runs = []
    for rec in records:
        i = int(np.searchsorted(rec.stream_ids, stream_id))
        if i < len(rec.stream_ids) and rec.stream_ids.item(i) == stream_id:
            base = rec.base_offsets.item(i)
            runs.append((rec, rec.first_msg.item(i), base, base + rec.counts.item(i)))
    return runs
