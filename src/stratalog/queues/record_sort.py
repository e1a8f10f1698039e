"""A bulk record's messages sorted by queue: the step of the writer between the puts it took and the record
it hands to the WAL (docs/formats/queues.md: a record holds a run per queue, queues ascending).

:func:`sort_record` is one C call where the compiled core is built (``_native.sort_record``, which keeps
the GIL: the writer runs beside producer threads, and each NumPy or Arrow call that lets the GIL go made it
wait to get it back); :func:`sort_record_numpy` is its twin and the readable reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from stratalog.native import native
from stratalog.queues.errors import QueueError
from stratalog.queues.format import I64, U32, Chunk, Ids


@dataclass(frozen=True, slots=True)
class SortedRecord:
    """The messages of a record in queue order: its runs (ascending stream ids, each run's first offset, its
    messages), the same runs as the record's u32 run section, the messages' bytes and their int32 ends
    after a leading 0 (``message_at``)."""

    stream_ids: Ids
    base_offsets: Ids
    counts: Ids
    runs_u32: bytes
    data: bytes | memoryview
    message_at: npt.NDArray[np.int32]


def sort_record(ids: Ids, lo: int, chunks: tuple[Chunk, ...], next_offsets: Ids, messages_max: int) -> SortedRecord:
    """Messages ``lo .. lo + len(ids) - 1`` of ``chunks`` (taken one after the other), message ``lo + i`` on
    queue ``ids[i]``, sorted by queue (stably), each run from its queue's next offset. QueueError where a
    run would take its queue past ``messages_max``; ValueError for ids or chunks that do not fit."""
    if _sort_record is None:
        return sort_record_numpy(ids, lo, chunks, next_offsets, messages_max)
    stream_ids, bases, counts, runs_u32, data, message_at = _sort_record(ids, lo, chunks, next_offsets, messages_max)
    return SortedRecord(np.frombuffer(stream_ids, I64), np.frombuffer(bases, I64), np.frombuffer(counts, I64),
                        runs_u32, data, np.frombuffer(message_at, np.int32))


def sort_record_numpy(ids: Ids, lo: int, chunks: tuple[Chunk, ...], next_offsets: Ids,
                      messages_max: int) -> SortedRecord:
    """:func:`sort_record` in NumPy and Arrow passes: the twin of ``_native.sort_record``."""
    if lo < 0 or not 0 <= messages_max < 1 << 32:
        raise ValueError("sort_record: lo >= 0 and messages_max within 0 .. 2**32 - 1")
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(next_offsets)):
        raise ValueError("sort_record: a queue id past the queues' next offsets")
    batch = _messages(chunks, lo, len(ids))
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    first = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1]))) if len(ids) \
        else np.zeros(0, I64)
    stream_ids = sorted_ids[first]
    counts = np.diff(np.append(first, len(sorted_ids))).astype(I64)
    taken = batch.take(pa.array(order))
    offsets = np.frombuffer(taken.buffers()[1], np.int32, len(taken) + 1, taken.offset * 4)
    if int(offsets[-1]) - int(offsets[0]) > np.iinfo(np.int32).max:
        raise ValueError("sort_record: a record's messages exceed 2 GiB")
    base = next_offsets[stream_ids]
    if len(base) and int((base + counts).max()) > messages_max:
        raise QueueError(f"a queue would exceed {messages_max} messages")
    data = memoryview(taken.buffers()[2] or b"")[int(offsets[0]):int(offsets[-1])]
    runs_u32 = np.concatenate([stream_ids, base, counts]).astype(U32).tobytes()
    return SortedRecord(stream_ids, base, counts, runs_u32, data, offsets - offsets[0])


def _messages(chunks: tuple[Chunk, ...], lo: int, count: int) -> Any:
    """Messages ``lo .. lo + count - 1`` of the chunks as one Arrow binary array. Each chunk's offsets are
    checked to be int32 (one more than its messages), and each of those messages to lie within its chunk's
    bytes (only those: the others are not read)."""
    for offsets, _ in chunks:
        if offsets.dtype != np.int32 or len(offsets) < 1:
            raise ValueError("sort_record: a chunk's offsets are aligned int32, one more than its messages")
    arrays, first, found = [], 0, 0
    for offsets, data in chunks:
        if found == count:
            break
        size = len(offsets) - 1
        start = max(lo - first, 0)
        stop = min(size, start + count - found) if start < size else start
        if stop > start:
            ends = offsets[start:stop + 1]
            if int(ends[:-1].min()) < 0 or bool(np.any(ends[1:] < ends[:-1])) \
                    or int(ends[1:].max()) > len(memoryview(data).cast("B")):
                raise ValueError("sort_record: a message lies outside its chunk's bytes")
            # Only the offsets of the messages taken: Arrow would check the others too (the C reads only these).
            arrays.append(pa.BinaryArray.from_buffers(pa.binary(), stop - start,
                                                      [None, pa.py_buffer(ends.copy()), pa.py_buffer(data)]))
            found += stop - start
        first += size
    if found < count:
        raise ValueError("sort_record: the chunks hold fewer messages than the ids name")
    return pa.concat_arrays(arrays) if arrays else pa.array([], pa.binary())


_sort_record: Any = native.sort_record if native is not None else None
