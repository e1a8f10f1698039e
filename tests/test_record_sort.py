"""A bulk record's messages sorted by queue: the compiled ``_native.sort_record`` and its twin
``record_sort.sort_record_numpy`` give the same runs, bytes and ends, or the same error, for the same ids,
chunks and queue ends, hostile ones included (offsets that fall or pass their bytes, ids past the queues, a
queue pushed past its bound, fewer messages than ids)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from examples import examples
from stratalog.native import native
from stratalog.queues.errors import QueueError
from stratalog.queues.format import I64, Chunk, chunks_of
from stratalog.queues.record_sort import SortedRecord, sort_record_numpy

Outcome = tuple[str, object]


def _native_sort(ids: Any, lo: int, chunks: tuple[Chunk, ...], next_offsets: Any, messages_max: int) -> SortedRecord:
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    stream_ids, bases, counts, runs_u32, data, message_at = native.sort_record(ids, lo, chunks, next_offsets,
                                                                               messages_max)
    return SortedRecord(np.frombuffer(stream_ids, I64), np.frombuffer(bases, I64), np.frombuffer(counts, I64),
                        runs_u32, data, np.frombuffer(message_at, np.int32))


def _outcome(sort: Any, *args: Any) -> Outcome:
    try:
        laid = sort(*args)
    except (ValueError, QueueError) as e:
        return type(e).__name__, str(e)
    return "sorted", (laid.stream_ids.tolist(), laid.base_offsets.tolist(), laid.counts.tolist(),
                      bytes(laid.runs_u32), bytes(laid.data), laid.message_at.tolist())


def _both(*args: Any) -> Outcome:
    mine, twin = _outcome(_native_sort, *args), _outcome(sort_record_numpy, *args)
    assert mine == twin
    return mine


def test_messages_go_in_queue_order_and_keep_their_order_within_a_queue() -> None:
    chunks = chunks_of([pa.array([b"a", b"bb", b"ccc", b"d"], pa.binary()), pa.array([b"e", b"ff"], pa.binary())])
    ids = np.array([3, 1, 3, 0, 1], I64)      # messages 1 .. 5: bb ccc d e ff

    outcome = _both(ids, 1, chunks, np.array([5, 6, 7, 8], I64), 2**32 - 1)

    runs = np.array([0, 1, 3, 5, 6, 8, 1, 2, 2], "<u4").tobytes()
    assert outcome == ("sorted", ([0, 1, 3], [5, 6, 8], [1, 2, 2], runs, b"ecccffbbd", [0, 1, 4, 6, 8, 9]))


def test_no_message_is_an_empty_record() -> None:
    assert _both(np.zeros(0, I64), 0, (), np.zeros(4, I64), 10) == ("sorted", ([], [], [], b"", b"", [0]))


def test_a_queue_past_its_bound_is_refused() -> None:
    chunks = chunks_of([pa.array([b"x", b"y"], pa.binary())])

    assert _both(np.array([1, 1], I64), 0, chunks, np.array([0, 9], I64), 10) \
        == ("QueueError", "a queue would exceed 10 messages")


@pytest.mark.parametrize(("case", "error"), [
    ("id past the queues", "a queue id past the queues' next offsets"),
    ("negative id", "a queue id past the queues' next offsets"),
    ("offsets past the bytes", "a message lies outside its chunk's bytes"),
    ("falling offsets", "a message lies outside its chunk's bytes"),
    ("fewer messages", "the chunks hold fewer messages than the ids name"),
    ("negative lo", "lo >= 0 and messages_max within 0 .. 2**32 - 1"),
])
def test_ids_and_chunks_that_do_not_fit_are_refused(case: str, error: str) -> None:
    ids, lo, next_offsets = np.array([0, 1], I64), 0, np.zeros(2, I64)
    offsets, data = np.array([0, 1, 3], np.int32), b"abc"
    if case == "id past the queues":
        ids = np.array([0, 2], I64)
    elif case == "negative id":
        ids = np.array([-1, 0], I64)
    elif case == "offsets past the bytes":
        offsets = np.array([0, 1, 4], np.int32)
    elif case == "falling offsets":
        offsets = np.array([0, 2, 1], np.int32)
    elif case == "fewer messages":
        lo = 1
    else:
        lo = -1

    assert _both(ids, lo, ((offsets, data),), next_offsets, 100) == ("ValueError", f"sort_record: {error}")


_message = st.binary(max_size=12)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.lists(_message, max_size=8), max_size=5), st.data())
def test_the_compiled_sort_gives_its_twins_record(chunk_messages: list[list[bytes]], data: st.DataObject) -> None:
    arrays = [pa.array(m, pa.binary()) for m in chunk_messages]
    # A chunk may be a slice of a bigger array (a put_many's batch is one): its offsets do not start at 0.
    arrays = [a.slice(data.draw(st.integers(0, len(a))), None) if data.draw(st.booleans()) else a for a in arrays]
    chunks = list(chunks_of(arrays))
    if chunks and data.draw(st.booleans()):
        # Hostile offsets in one chunk: any int32 values.
        at = data.draw(st.integers(0, len(chunks) - 1))
        offsets = np.array(data.draw(st.lists(st.integers(-2, 40), min_size=1, max_size=8)), np.int32)
        chunks[at] = (offsets, chunks[at][1])
    total = sum(len(offsets) - 1 for offsets, _ in chunks)
    lo = data.draw(st.integers(0, total + 1))
    count = data.draw(st.integers(0, max(total - lo + 1, 0)))
    queues = data.draw(st.integers(1, 5000))
    ids = np.array(data.draw(st.lists(st.integers(-1, queues), min_size=count, max_size=count)), I64)
    # Each queue's next offset: up to 5,000 of them, built from a seed (drawn one by one they were most of
    # the test's time; the search is in the ids and chunks above).
    next_offsets = np.random.default_rng(data.draw(st.integers(0, (1 << 64) - 1))).integers(0, 51, queues, I64)

    event(_both(ids, lo, tuple(chunks), next_offsets, data.draw(st.integers(0, 60)))[0])
