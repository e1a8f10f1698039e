"""Manifests of several publishers over one object store and one metadata (a cluster's brokers): no
publisher overwrites another's documents, a reader merges every publisher's unbroken chain after the
newest snapshot, a lost delta leaves its stream covered up to the hole, and older stores' keys still read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from stratalog.engine.manifest import MANIFEST_PREFIX, ManifestPublisher, parse_key, read_manifest
from stratalog.engine.metadata import NewObject, StreamMeta
from stratalog.engine.objformat import BlockEntry
from stratalog.objects.local import LocalDirStore


def meta(stream_id: int, start: int, end: int) -> StreamMeta:
    return StreamMeta(stream_id, f"t/{stream_id}", start, end, 0, 0, None, None)


def block(stream_id: int, start: int, end: int) -> BlockEntry:
    return BlockEntry(stream_id, start, end, 0, 100, end - start, 0, 0)


def obj(key: str, *blocks: BlockEntry) -> NewObject:
    return NewObject(0, key, 100, list(blocks))


@dataclass
class _Row:
    key: str
    block: BlockEntry

    def entry(self) -> BlockEntry:
        return self.block


class SharedMeta:
    """The shared metadata as a snapshot reads it: streams and their blocks, committed so far."""

    def __init__(self) -> None:
        self.streams_by_id: dict[int, StreamMeta] = {}
        self.rows: list[_Row] = []

    def commit(self, stream_id: int, key: str, start: int, end: int) -> tuple[list[StreamMeta], list[NewObject]]:
        self.streams_by_id[stream_id] = meta(stream_id, 0, end)
        self.rows.append(_Row(key, block(stream_id, start, end)))
        return [self.streams_by_id[stream_id]], [obj(key, block(stream_id, start, end))]

    def streams(self) -> list[StreamMeta]:
        return sorted(self.streams_by_id.values(), key=lambda s: s.stream_id)

    def ranges(self, stream_id: int, start: int, end: int | None, limit: int) -> list[_Row]:
        del end, limit
        return [r for r in self.rows if r.block.stream_id == stream_id and r.block.end_offset > start]


def covered(store: LocalDirStore) -> dict[int, tuple[int, list[tuple[int, int]]]]:
    """Each stream's end as read, and the offsets of its blocks."""
    manifest = read_manifest(store)
    return {i: (s.end_offset, [(r.entry.start_offset, r.entry.end_offset) for r in manifest.blocks.get(i, [])])
            for i, s in manifest.streams.items()}


def test_two_publishers_interleaving_commits_are_both_read(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    shared = SharedMeta()
    a, b = ManifestPublisher(store), ManifestPublisher(store)
    a.snapshot(1, shared)  # type: ignore[arg-type]  # a stand-in for Metadata's two reads
    assert b.resume(1), "b opens at commit 1: it continues from a's snapshot"
    # Broker a leads stream 1, broker b stream 2; their commits interleave in the shared commit sequence.
    for seq, (publisher, stream_id, start) in enumerate([(a, 1, 0), (b, 2, 0), (a, 1, 10), (b, 2, 10)], 2):
        publisher.delta(seq, *shared.commit(stream_id, f"data/{seq}.slo", start, start + 10))
    assert covered(store) == {1: (20, [(0, 10), (10, 20)]), 2: (20, [(0, 10), (10, 20)])}
    kinds = sorted(name for info in store.list(MANIFEST_PREFIX) if (name := parse_key(info.key)))
    assert len({publisher for _, publisher, _ in kinds}) == 2, "each publisher names its documents"


def test_two_publishers_with_the_same_seq_do_not_overwrite_each_other(tmp_path: Path) -> None:
    """A broker reads the commit sequence after its commit: another broker's commit in between gives both
    documents one seq."""
    store = LocalDirStore(tmp_path)
    shared = SharedMeta()
    a, b = ManifestPublisher(store), ManifestPublisher(store)
    a.snapshot(1, shared)  # type: ignore[arg-type]
    assert b.resume(1)
    a.delta(3, *shared.commit(1, "data/a.slo", 0, 5))
    b.delta(3, *shared.commit(2, "data/b.slo", 0, 7))
    assert covered(store) == {1: (5, [(0, 5)]), 2: (7, [(0, 7)])}


def test_a_lost_delta_covers_its_stream_up_to_the_hole_and_leaves_the_others_whole(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    shared = SharedMeta()
    a, b = ManifestPublisher(store), ManifestPublisher(store)
    a.snapshot(1, shared)  # type: ignore[arg-type]
    assert b.resume(1)
    a.delta(2, *shared.commit(1, "data/1.slo", 0, 10))
    a.delta(3, *shared.commit(1, "data/2.slo", 10, 20))
    b.delta(4, *shared.commit(2, "data/3.slo", 0, 10))
    lost = next(info.key for info in store.list(MANIFEST_PREFIX) if info.key.startswith(f"{MANIFEST_PREFIX}{3:020d}"))
    store.delete(lost)   # a died between its commit and this manifest
    # b took stream 1 over and committed after a's lost commit.
    b.delta(5, *shared.commit(1, "data/4.slo", 20, 30))
    a.delta(6, *shared.commit(1, "data/5.slo", 30, 40))   # never: a chain broken at 3 is not followed
    assert covered(store) == {1: (10, [(0, 10)]), 2: (10, [(0, 10)])}
    # The next snapshot, of the whole metadata, holds everything again.
    b.snapshot(7, shared)  # type: ignore[arg-type]
    assert covered(store) == {1: (40, [(0, 10), (10, 20), (20, 30), (30, 40)]), 2: (10, [(0, 10)])}


def test_a_delta_over_a_snapshot_that_holds_its_commit_adds_nothing_twice(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    shared = SharedMeta()
    a, b = ManifestPublisher(store), ManifestPublisher(store)
    a.snapshot(1, shared)  # type: ignore[arg-type]
    assert b.resume(1)
    streams, objects = shared.commit(1, "data/1.slo", 0, 10)
    b.snapshot(3, shared)  # type: ignore[arg-type]   # after a's commit, before a published it
    a.delta(4, streams, objects)
    assert covered(store) == {1: (10, [(0, 10)])}


def test_an_older_stores_keys_are_read_and_its_chain_continued(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    doc = {"format": 1, "kind": "snapshot", "seq": 1, "prev": None,
           "streams": [{"id": 1, "name": "t/1", "start": 0, "end": 10}],
           "objects": [{"key": "data/1.slo", "blocks": [[1, 0, 10, 0, 100, 10, 0, 0]]}], "removed": []}
    store.put(f"{MANIFEST_PREFIX}{1:020d}.snapshot.json", json.dumps(doc).encode())
    store.put(f"{MANIFEST_PREFIX}{2:020d}.delta.json", json.dumps(
        {**doc, "kind": "delta", "seq": 2, "prev": 1,
         "streams": [{"id": 1, "name": "t/1", "start": 0, "end": 20}],
         "objects": [{"key": "data/2.slo", "blocks": [[1, 10, 20, 0, 100, 10, 0, 0]]}]}).encode())
    assert covered(store) == {1: (20, [(0, 10), (10, 20)])}
    publisher = ManifestPublisher(store)
    assert publisher.resume(2)
    shared = SharedMeta()
    shared.streams_by_id[1] = meta(1, 0, 20)
    publisher.delta(3, *shared.commit(1, "data/3.slo", 20, 30))
    assert covered(store) == {1: (30, [(0, 10), (10, 20), (20, 30)])}


@pytest.mark.parametrize("key, parsed", [
    (f"{MANIFEST_PREFIX}{7:020d}.snapshot.json", (7, "", "snapshot")),
    (f"{MANIFEST_PREFIX}{7:020d}.0a1b.delta.json", (7, "0a1b", "delta")),
    (f"{MANIFEST_PREFIX}{7:020d}.0a1b.other.json", None),
    ("data/00000000000000000007.slo", None),
])
def test_manifest_keys_are_parsed_or_refused(key: str, parsed: tuple[int, str, str] | None) -> None:
    assert parse_key(key) == parsed
