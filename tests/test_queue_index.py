"""The run index: a stream's runs across objects, as readers look them up."""

from __future__ import annotations

import numpy as np

from stratalog.queues.index import COLUMNS_GROWTH_MIN, RunIndex


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
