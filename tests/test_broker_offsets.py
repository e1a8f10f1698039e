"""The committed-offsets store: durable commits, lookups, deletes, retention and the metadata bound."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratalog.broker.offsets import (
    OFFSET_METADATA_TOO_LARGE,
    CommittedOffsets,
    OffsetEntry,
    OffsetMetadataTooLargeError,
    OffsetsClosedError,
    OffsetsConfig,
    OffsetsSchemaError,
    metadata_error,
)

DAY_MS = 24 * 3600 * 1000


def entry(topic: str, partition: int, offset: int, time_ms: int = 1000, metadata: str | None = None,
          leader_epoch: int = -1) -> OffsetEntry:
    return OffsetEntry(topic, partition, offset, leader_epoch, metadata, time_ms)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CommittedOffsets]:
    with CommittedOffsets(tmp_path / "offsets.sqlite") as offsets:
        yield offsets


def test_a_commit_is_fetched_back_whole_and_replaces_the_previous_one(store: CommittedOffsets) -> None:
    store.commit("g", [entry("t", 0, 10, metadata="note", leader_epoch=3), entry("t", 1, 20)])
    store.commit("g", [entry("t", 0, 15, time_ms=2000)])

    got = store.fetch("g")

    assert got == {("t", 0): entry("t", 0, 15, time_ms=2000), ("t", 1): entry("t", 1, 20)}


def test_fetching_some_partitions_leaves_out_those_never_committed(store: CommittedOffsets) -> None:
    store.commit("g", [entry("t", 0, 10), entry("u", 0, 5)])
    store.commit("other", [entry("t", 1, 99)])

    got = store.fetch("g", [("t", 0), ("t", 1)])

    assert got == {("t", 0): entry("t", 0, 10)}
    assert store.fetch("nobody") == {}


def test_offsets_survive_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "offsets.sqlite"
    with CommittedOffsets(path) as offsets:
        offsets.commit("g", [entry("t", 0, 42, metadata="m")])

    with CommittedOffsets(path) as reopened:
        assert reopened.fetch("g") == {("t", 0): entry("t", 0, 42, metadata="m")}
        assert reopened.groups() == ["g"]


def test_a_returned_commit_survives_kill_9_of_its_process(tmp_path: Path) -> None:
    path = tmp_path / "offsets.sqlite"
    child = textwrap.dedent(f"""
        import sys
        from stratalog.broker.offsets import CommittedOffsets, OffsetEntry
        offsets = CommittedOffsets({str(path)!r})
        offsets.commit("g", [OffsetEntry("t", 0, 7, -1, None, 1)])
        print("committed", flush=True)
        sys.stdin.read()  # holds still until killed (or, should this test die first, until stdin closes)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "committed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    with CommittedOffsets(path) as reopened:
        assert reopened.fetch("g") == {("t", 0): OffsetEntry("t", 0, 7, -1, None, 1)}


def test_the_file_is_in_wal_mode_with_full_sync(store: CommittedOffsets) -> None:
    conn = sqlite3.connect(store.path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
    # synchronous is per connection: read the store's own.
    assert store._connection().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_metadata_over_the_bound_is_reported_by_its_utf8_bytes() -> None:
    assert metadata_error(None, 4096) == 0
    assert metadata_error("x" * 4096, 4096) == 0
    assert metadata_error("x" * 4097, 4096) == OFFSET_METADATA_TOO_LARGE
    # 1366 three-byte characters are 4098 bytes: over, though only 1366 characters.
    assert metadata_error("\u20ac" * 1366, 4096) == OFFSET_METADATA_TOO_LARGE
    assert metadata_error("\u20ac" * 1365, 4096) == 0


def test_a_commit_with_metadata_over_the_bound_stores_nothing(tmp_path: Path) -> None:
    with CommittedOffsets(tmp_path / "o.sqlite", OffsetsConfig(offset_metadata_bytes_max=8)) as offsets:
        assert offsets.metadata_error("123456789") == OFFSET_METADATA_TOO_LARGE
        with pytest.raises(OffsetMetadataTooLargeError):
            offsets.commit("g", [entry("t", 0, 1, metadata="ok"), entry("t", 1, 1, metadata="123456789")])
        assert offsets.fetch("g") == {}


def test_deleting_a_group_a_topic_or_partitions_drops_only_those(store: CommittedOffsets) -> None:
    store.commit("a", [entry("t", 0, 1), entry("t", 1, 1), entry("u", 0, 1)])
    store.commit("b", [entry("t", 0, 2), entry("v", 0, 2)])
    store.commit("c", [entry("v", 3, 3)])

    assert store.delete_topic("t") == 3
    assert store.delete_partitions("b", [("v", 0), ("v", 9)]) == 1
    assert store.delete_group("c") == 1

    assert store.groups() == ["a"]
    assert store.fetch("a") == {("u", 0): entry("u", 0, 1)}
    assert store.has_group("a")
    assert not store.has_group("b")


def test_expiry_drops_old_offsets_of_long_empty_groups_only(store: CommittedOffsets) -> None:
    now_ms = 100 * DAY_MS
    old_ms, recent_ms = now_ms - 8 * DAY_MS, now_ms - DAY_MS
    store.commit("active", [entry("t", 0, 1, time_ms=old_ms)])
    store.commit("long-empty", [entry("t", 0, 1, time_ms=old_ms), entry("t", 1, 1, time_ms=recent_ms)])
    store.commit("just-emptied", [entry("t", 0, 1, time_ms=old_ms)])
    store.commit("unknown", [entry("t", 0, 1, time_ms=old_ms)])
    empty_since = {"active": None, "long-empty": now_ms - 30 * DAY_MS, "just-emptied": now_ms - DAY_MS}

    removed = store.expire(now_ms, 7 * DAY_MS, lambda g: empty_since.get(g, 0))

    assert removed == 2
    assert set(store.fetch("active")) == {("t", 0)}
    assert set(store.fetch("long-empty")) == {("t", 1)}
    assert set(store.fetch("just-emptied")) == {("t", 0)}
    assert store.fetch("unknown") == {}


def test_a_file_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "offsets.sqlite"
    CommittedOffsets(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.close()

    with pytest.raises(OffsetsSchemaError):
        CommittedOffsets(path)


def test_commits_from_many_threads_all_land(store: CommittedOffsets) -> None:
    def commit_many(thread: int) -> None:
        for partition in range(20):
            store.commit(f"g{thread}", [entry("t", partition, thread * 100 + partition)])

    threads = [threading.Thread(target=commit_many, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for n in range(4):
        got = store.fetch(f"g{n}")
        assert {k: v.offset for k, v in got.items()} == {("t", p): n * 100 + p for p in range(20)}


def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    offsets = CommittedOffsets(tmp_path / "o.sqlite")
    offsets.close()

    with pytest.raises(OffsetsClosedError):
        offsets.fetch("g")
