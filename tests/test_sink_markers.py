"""The keys of sinks' committed micro-batches (engine/sink_markers.py): a per-partition key names its
partition back whatever the sink id and partition hold, and no other key names one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stratalog.engine.sink_markers import (
    PARTITION_MARKER_PREFIX,
    marker_partition,
    partition_marker_key,
    partition_markers_like,
    sink_marker_key,
)


@given(st.text(min_size=1), st.text(min_size=1), st.text(min_size=1))
def test_a_partition_markers_key_names_its_partition_and_no_two_pairs_share_a_key(sink: str, name: str,
                                                                                   other: str) -> None:
    key = partition_marker_key(sink, name)
    assert marker_partition(key) == name
    assert key != partition_marker_key(sink + other, name)
    assert key != partition_marker_key(sink, name + other)


@pytest.mark.parametrize("key", [
    sink_marker_key("copy"), "clean_end:3", PARTITION_MARKER_PREFIX, PARTITION_MARKER_PREFIX + "4copyt/0",
    PARTITION_MARKER_PREFIX + "x:copyt/0", PARTITION_MARKER_PREFIX + "4:copy", PARTITION_MARKER_PREFIX + "9:copyt/0",
])
def test_other_and_malformed_keys_name_no_partition(key: str) -> None:
    assert marker_partition(key) is None


def test_the_like_pattern_escapes_what_like_would_take_as_wildcards() -> None:
    assert partition_markers_like("a_b%/1") == PARTITION_MARKER_PREFIX + "%a\\_b\\%/1"
    assert partition_markers_like("a\\b/1") == PARTITION_MARKER_PREFIX + "%a\\\\b/1"
