"""Queue recovery's decision table (queues/recovery.py, docs/formats/queues.md "Recovery rules"): one test
per row, each a bulk record built as the writer builds it and judged against the queues recovered so far."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from stratalog.queues.format import I64, BulkRecord, decode_bulk, encode_bulk
from stratalog.queues.recovery import ACTIONS, Action, RecordCase, classify

#: Recovered so far: queues "a" (id 0, 5 messages) and "b" (id 1, 3 messages).
_NEXT = np.array([5, 3], I64)
_IDS = {"a": 0, "b": 1}


def _record(runs: list[tuple[int, int, int]], names: list[tuple[int, str]], stream_count: int) -> BulkRecord:
    """A bulk record of ``runs`` (stream id, base offset, count), each message one byte."""
    counts = np.array([c for _, _, c in runs], I64)
    ends = np.arange(1, int(counts.sum()) + 1, dtype=I64)
    parts = encode_bulk(np.array([s for s, _, _ in runs], I64), np.array([b for _, b, _ in runs], I64), counts,
                        names, stream_count, ends, b"m" * len(ends))
    return decode_bulk(b"".join(parts))


def _judge(bulk: BulkRecord, next_offsets: np.ndarray = _NEXT) -> tuple[RecordCase, Action]:
    case = classify(bulk, next_offsets, 2, _IDS)
    return case, ACTIONS[case]


def test_row_1_a_run_of_a_stream_the_record_does_not_count_drops_the_rest() -> None:
    assert _judge(_record([(0, 5, 1), (2, 0, 1)], [], 2)) == (RecordCase.UNKNOWN_STREAM, Action.DROP_REST)


def test_row_2_runs_that_end_within_their_streams_ends_are_uploaded_and_skipped() -> None:
    assert _judge(_record([(0, 3, 2), (1, 0, 3)], [], 2)) == (RecordCase.UPLOADED, Action.SKIP)


def test_row_3_a_record_of_names_already_in_objects_is_skipped_not_a_hole() -> None:
    assert _judge(_record([], [(0, "a"), (1, "b")], 2)) == (RecordCase.NAMES_UPLOADED, Action.SKIP)


def test_row_6_names_already_in_objects_beside_runs_that_follow_count_as_none() -> None:
    assert _judge(_record([(0, 5, 1)], [(1, "b")], 2)) == (RecordCase.FOLLOWS_ON, Action.REPLAY)


def test_row_4_names_that_skip_an_id_are_a_hole() -> None:
    assert _judge(_record([], [(3, "d")], 4)) == (RecordCase.NAMES_OUT_OF_ORDER, Action.DROP_REST)


def test_row_4_a_stream_count_that_is_not_the_known_streams_plus_the_new_is_a_hole() -> None:
    assert _judge(_record([(0, 5, 1)], [], 3)) == (RecordCase.NAMES_OUT_OF_ORDER, Action.DROP_REST)


def test_row_5_a_run_past_its_streams_end_is_a_hole() -> None:
    assert _judge(_record([(0, 6, 1)], [], 2)) == (RecordCase.RUN_OUT_OF_PLACE, Action.DROP_REST)


def test_row_5_a_new_streams_run_must_start_at_offset_0() -> None:
    assert _judge(_record([(2, 1, 1)], [(2, "c")], 3)) == (RecordCase.RUN_OUT_OF_PLACE, Action.DROP_REST)


def test_row_6_new_names_and_runs_that_follow_on_are_replayed() -> None:
    bulk = _record([(0, 5, 2), (2, 0, 1)], [(2, "c")], 3)
    assert _judge(bulk) == (RecordCase.FOLLOWS_ON, Action.REPLAY)
    # The same when the arrays of next offsets have room beyond the known streams (they grow ahead).
    assert _judge(bulk, np.array([5, 3, 0, 0], I64)) == (RecordCase.FOLLOWS_ON, Action.REPLAY)


def test_the_spec_lists_every_case_with_its_action() -> None:
    """docs/formats/queues.md says the same table as the code: every case, its action, in this order."""
    spec = (Path(__file__).parent.parent / "docs" / "formats" / "queues.md").read_text()
    rows = re.findall(r"^\| \d+ \| .*\| `(\w+)` \| (\w[\w ]*\w) \|$", spec, re.MULTILINE)
    assert rows == [(case.name, ACTIONS[case].name.lower().replace("_", " ")) for case in RecordCase]
