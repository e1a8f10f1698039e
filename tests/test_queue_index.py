"""The run index: a stream's runs across objects, as readers look them up."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from stratalog.queues.index import COLUMNS_GROWTH_MIN, RunIndex, TailIndex


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
        for i, (s, n) in enumerate(zip(present, counts, strict=True)):
            runs[s].append((seq, int(first[i]), ends[s], ends[s] + n))
            ends[s] += n
        records.append(_Rec(seq, np.array(present, np.int64), np.array([ends[s] - n for s, n in zip(present, counts,
                                                                                                    strict=True)]),
                            np.array(counts, np.int64), first, streams))
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
