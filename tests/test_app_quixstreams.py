"""A quixstreams application with a stateful count (tests/apps/quixstreams_counter.py) against a real broker, killed
with SIGKILL twice mid-stream and started again each time with its state directory deleted: its store is
rebuilt from the changelog topic that quixstreams created compacted and the broker's cleaner compacted
meanwhile, and every key's count comes back exact.

Why exact, under at-least-once (this app asks for it; exactly-once is test_app_quixstreams_eos.py's): quixstreams
changes its store only in a checkpoint's transaction, and a checkpoint produces the store's changes to the
changelog, flushes the producer (changelog and output) and only then commits the input offsets. The test
kills the app once the group's committed offsets reach the end of the input produced so far, and produces
nothing more until it runs again: the changelog then holds every count up to exactly the committed events,
none is reprocessed, and the output holds each running count once. (A kill at any other moment reprocesses
the events after the last commit: quixstreams' recovery skips changelog records of offsets past the
committed ones, so the store would still be exact, but the output would repeat running counts; and a
compaction pass between such a kill and the restart could remove a committed count superseded by a skipped
one. Killing after a commit keeps the test's verdict one of the broker's, not of that race.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appkit import (
    KEYS,
    AppProcess,
    Changelog,
    broker_args,
    cleaner_passes,
    count_through_kills,
    refused_requests,
    topic_config,
)
from appvenv import app_python
from brokerkit import running_broker

pytestmark = pytest.mark.slow

GROUP = "quix-counter"
OUTPUT_TOPIC = "counts"
#: quixstreams' name for the changelog of the default store of the group's input topic.
CHANGELOG_TOPIC = f"changelog__{GROUP}--events--default"


def decode(key: bytes, value: bytes) -> tuple[str, int]:
    """A changelog record of the store: key ``"<message key>"|"count"``, value the count, both JSON."""
    message_key, _, state_key = key.partition(b"|")
    assert json.loads(state_key) == "count", key
    return json.loads(message_key), int(json.loads(value))


def test_counts_rebuilt_from_a_compacted_changelog_are_exact(tmp_path: Path) -> None:
    python = app_python("quixstreams")
    with running_broker(tmp_path / "data", *broker_args(tmp_path)) as broker:
        app = AppProcess(python, "quixstreams_counter.py", broker.bootstrap, tmp_path / "state",
                         tmp_path / "app.log")
        changelog = Changelog(CHANGELOG_TOPIC, decode)
        true, running, latest = count_through_kills(broker, app, GROUP, changelog, OUTPUT_TOPIC)
        assert app.runs == 3
        assert topic_config(broker.bootstrap, CHANGELOG_TOPIC, "cleanup.policy") == "compact"
        assert cleaner_passes(broker) > 0
        assert refused_requests(broker) == []
        assert broker.stop() == 0, "".join(broker.output[-50:])
    assert len(true) == KEYS
    assert latest == dict(true), "the changelog's latest count of each key is its true count"
    # Each running count once, in order, across both restarts: nothing counted twice, nothing lost.
    assert running == {key: list(range(1, n + 1)) for key, n in true.items()}
