"""The run index: a stream's runs across objects, as readers look them up."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from stratalog.invariant import InvariantError
from stratalog.native import native
from stratalog.queues import index as index_module
from stratalog.queues.index import COLUMNS_GROWTH_MIN, RunIndex, TailIndex

compiled = pytest.mark.skipif(native is None, reason="the compiled core is not built")


def _index(objects: list[tuple[list[int], list[int]]]) -> RunIndex:
    index = RunIndex.empty()
    for ends, positions in objects:
        index = index.with_object(np.array(ends, np.uint32), np.array(positions, np.uint32))
    return index


def test_a_row_gives_each_objects_end_and_run() -> None:
    # Object 0: streams 0, 1 (runs 0..10, 10..20); object 1: streams 0, 1, 2 (runs 20..25, 25..25, 25..40).
    index = _index([([3, 4], [0, 10, 20]), ([5, 4, 2], [20, 25, 25, 40])])
    for stream, want in [(0, ([3, 5], [0, 20], [10, 25])), (1, ([4, 4], [10, 25], [20, 25])),
                         (2, ([0, 2], [20, 25], [20, 40]))]:
        assert index.lookup(stream) == want
        ends, positions = index.row(stream)
        assert ends == want[0]
        assert [positions[k] for k in range(2)] == want[1]
        assert [positions[index.capacity + k] for k in range(2)] == want[2]


def test_a_stream_past_the_rows_has_no_runs() -> None:
    index = _index([([3, 4], [0, 10, 20])])
    assert index.lookup(9) == ([0], [20], [20])
    assert RunIndex.empty().lookup(0) == ([], [], [])


def test_rows_read_through_growth_and_merges() -> None:
    objects = [([k + 1] * 3, [0, 5, 10, 15]) for k in range(COLUMNS_GROWTH_MIN + 3)]   # past one growth
    index = _index(objects)
    assert index.lookup(1) == ([k + 1 for k in range(len(objects))], [5] * len(objects), [10] * len(objects))
    merged = index.with_merged(0, 4, [(np.array([4, 4, 4], np.uint32), np.array([0, 7, 14, 21], np.uint32))])
    assert merged.lookup(2) == ([4] + [k + 1 for k in range(4, len(objects))], [14] + [10] * (len(objects) - 4),
                                [21] + [15] * (len(objects) - 4))
    assert index.lookup(1)[0][0] == 1, "the index merged from is unchanged"


@dataclass
class _Rec:
    """What TailIndex reads of a log-cache record."""

    seq: int
    stream_ids: np.ndarray
    base_offsets: np.ndarray
    counts: np.ndarray
    first_msg: np.ndarray
    stream_count: int
    data: bytes
    message_at: memoryview


def _message(stream: int, offset: int) -> bytes:
    return b"m" * (stream % 3) + f"{stream}:{offset}".encode()


def _records(rng: random.Random, streams: int,
             count: int) -> tuple[list[_Rec], dict[int, list[tuple[int, int, int, int]]]]:
    """Records of random runs, and each stream's runs as (record, first message, base, end)."""
    ends = [0] * streams
    records: list[_Rec] = []
    runs: dict[int, list[tuple[int, int, int, int]]] = {s: [] for s in range(streams)}
    for seq in range(count):
        present = sorted(rng.sample(range(streams), rng.randint(1, streams)))
        counts = [rng.randint(1, 4) for _ in present]
        first = np.zeros(len(present) + 1, np.int64)
        np.cumsum(counts, out=first[1:])
        messages = []
        for i, (s, n) in enumerate(zip(present, counts, strict=True)):
            runs[s].append((seq, int(first[i]), ends[s], ends[s] + n))
            messages += [_message(s, ends[s] + j) for j in range(n)]
            ends[s] += n
        message_at = np.zeros(len(messages) + 1, np.int32)
        np.cumsum([len(m) for m in messages], out=message_at[1:])
        records.append(_Rec(seq, np.array(present, np.int64), np.array([ends[s] - n for s, n in zip(present, counts,
                                                                                                    strict=True)]),
                            np.array(counts, np.int64), first, streams, b"".join(messages),
                            memoryview(message_at)))
    return records, runs


def test_the_tail_index_gives_the_runs_a_read_of_offset_to_stop_needs() -> None:
    rng = random.Random(7)
    for _ in range(200):
        records, runs = _records(rng, rng.randint(1, 6), rng.randint(1, 8))
        tail = TailIndex.build(records)
        for s, want in runs.items():
            end = want[-1][3] if want else 0
            offset = rng.randint(0, end + 1)
            stop = rng.randint(offset + 1, end + 3)
            got = [(rec.seq, first, base, run_end) for rec, first, base, run_end in tail.runs(s, offset, 0, stop)]
            assert got == [run for run in want if run[3] > offset and run[2] < stop]
            assert [(rec.seq, *rest) for rec, *rest in tail.runs(s, offset)] == [run for run in want if run[3] > offset]
        since = rng.randint(0, len(records))
        s = rng.randrange(len(runs))
        assert [rec.seq for rec, *_ in tail.without_through(since - 1).runs(s)] == \
            [run[0] for run in runs[s] if run[0] >= since]


def _both_reads(tail: TailIndex, stream_id: int, pos: int, stop: int, since_seq: int) -> tuple[object, object]:
    """The compiled read and its twin on the same call: (messages, offset reached) or the error's type and text."""
    got = []
    for read in (tail.read, tail.read_python):
        out: list[bytes] = []
        try:
            got.append((out, read(stream_id, pos, stop, since_seq, out)))
        except InvariantError as e:
            got.append((type(e), str(e)))
    return got[0], got[1]


@compiled
@settings(max_examples=examples(300), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), streams=st.integers(1, 6), count=st.integers(1, 10),
       dropped=st.integers(0, 10), since=st.integers(0, 11))
def test_the_compiled_tail_read_gives_what_its_twin_gives(seed: int, streams: int, count: int, dropped: int,
                                                         since: int) -> None:
    """Every stream, random offsets, records an upload took (None) and a get's view starting later: the C
    read and its Python twin append the same messages and stop at the same offset; a read past what the
    records hold stops at their end."""
    rng = random.Random(seed)
    records, runs = _records(rng, streams, count)
    tail = TailIndex.build(records).without_through(min(dropped, count) - 1)
    for s in range(streams + 2):
        end = runs[s][-1][3] if runs.get(s) else 0
        pos = rng.randint(0, end + 1)
        stop = rng.randint(pos, end + 3)
        compiled_read, twin_read = _both_reads(tail, s, pos, stop, since)
        assert compiled_read == twin_read
        first_live = max(since, min(dropped, count))
        if isinstance(twin_read[0], list) and all(run[0] >= first_live for run in runs.get(s, [])):
            reached = min(stop, end) if pos < end else pos
            assert twin_read == ([_message(s, o) for o in range(pos, reached)], reached)


@compiled
def test_the_compiled_tail_read_refuses_what_its_twin_refuses() -> None:
    """A run whose messages lie past its record's offsets, a message past the record's bytes, offsets that
    go backwards, a stream whose runs skip offsets: both raise InvariantError with the same words."""
    records, _ = _records(random.Random(3), 2, 4)
    short = replace(records[1], message_at=records[1].message_at[:2])
    past = np.frombuffer(records[1].message_at, np.int32).copy()
    past[-1] = len(records[1].data) + 1
    backwards = np.frombuffer(records[1].message_at, np.int32).copy()
    backwards[1] = backwards[2] + 1
    cases = [replace(records[1], message_at=memoryview(past)), replace(records[1], message_at=memoryview(backwards)),
             short]
    for broken in cases:
        tail = TailIndex.build([records[0], broken, *records[2:]])
        for s in (0, 1):
            compiled_read, twin_read = _both_reads(tail, s, 0, 100, 0)
            assert compiled_read == twin_read
    gap = TailIndex.build(records[1:])      # a stream's first runs missing: the reader is before them
    errors = [_both_reads(gap, s, 0, 100, 0) for s in (0, 1)]
    assert all(c == t for c, t in errors)
    assert any(t[0] is InvariantError for _, t in errors)
    raised = {t[1] for case in cases for s in (0, 1)
              for _, t in [_both_reads(TailIndex.build([records[0], case, *records[2:]]), s, 0, 100, 0)]
              if t[0] is InvariantError}
    assert raised == {"a log-cache message lies outside its record's bytes",
                      "a log-cache run's messages lie past its record's message offsets"}


def test_without_the_compiled_core_the_tail_read_is_its_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    records, runs = _records(random.Random(5), 3, 5)
    tail = TailIndex.build(records)
    monkeypatch.setattr(index_module, "_read_tail", None)
    out: list[bytes] = []
    end = runs[1][-1][3]
    assert tail.read(1, 0, end, 0, out) == end
    assert out == [_message(1, o) for o in range(end)]
