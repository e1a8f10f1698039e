"""Transactions of a store at rest (spark/rest_txns.py): what a read_committed read of a data directory
returns, against a model of the log, for every place the producers' snapshot can end (none, before the
objects' end, after it) and every place the objects can end; the replay's byte bound; and the refusal of a
read that cannot know (the objects alone, or a data directory without producers.sqlite).

The model: each producer's transactional records belong to its open transaction until its next marker.
Knowing the log up to ``K`` (the later of the snapshot's end and the objects' end), a read of the objects
ends at ``L``, the first offset of the oldest transaction open at ``K`` (or the objects' end), and returns
below it the plain records and those of transactions committed before ``K``.

Through Spark, with a real broker stopped and killed: tests/test_spark_source.py.
"""

from __future__ import annotations

import copy
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginekit import MemoryStore, small_store_config
from stratalog.broker.metadata_db import PRODUCERS_FILE
from stratalog.broker.producer_recovery import ProducerSnapshots
from stratalog.broker.txn_partitions import AbortedRange
from stratalog.engine import Stream, StreamStore
from stratalog.engine.manifest import Manifest, StreamInfo, read_manifest
from stratalog.kafka.control_batch import MarkerType, marker_batch
from stratalog.kafka.records import encode_batch
from stratalog.spark.aborted import TransactionsUnknownError
from stratalog.spark.plan import plan_partitions
from stratalog.spark.rest_txns import OBJECTS_ALONE, committed_partitions, rest_transactions

#: (what, producer 0-2, records): a transactional batch, a plain one, or a commit or abort marker.
EVENT = st.tuples(st.sampled_from(["txn", "txn", "plain", "commit", "abort"]), st.integers(0, 2), st.integers(1, 3))
PHASES = 3


@dataclass
class Model:
    """The log as written, event by event: where each phase ends, and what was known at each offset."""

    end: int = 0
    #: Each producer's open transaction: (first offset, its values).
    open: dict[int, tuple[int, list[bytes]]] = field(default_factory=dict)
    plain: list[bytes] = field(default_factory=list)
    #: (marker offset, values) of each committed transaction; (marker offset, range) of each aborted one.
    committed: list[tuple[int, list[bytes]]] = field(default_factory=list)
    aborted: list[AbortedRange] = field(default_factory=list)

    def write(self, stream: Stream, what: str, producer: int, count: int) -> None:
        if what in ("txn", "plain"):
            values = [b"%d" % (self.end + i) for i in range(count)]
            batch = encode_batch([(None, v, (), 5) for v in values], base_offset=0, producer_id=producer,
                                 producer_epoch=0, base_sequence=0, is_transactional=what == "txn")
            stream.append_kafka(batch, count, 5).result()
            if what == "plain":
                self.plain += values
            else:
                self.open.setdefault(producer, (self.end, []))[1].extend(values)
            self.end += count
            return
        kind = MarkerType.COMMIT if what == "commit" else MarkerType.ABORT
        stream.append_kafka(marker_batch(producer, 0, kind, coordinator_epoch=0, timestamp_ms=5), 1, 5).result()
        began = self.open.pop(producer, None)
        if began is not None:
            if kind is MarkerType.COMMIT:
                self.committed.append((self.end, began[1]))
            else:
                self.aborted.append(AbortedRange(self.end, producer, began[0]))
        self.end += 1


@dataclass(frozen=True)
class Written:
    """The log of one stream in objects, a block per phase, and the model as each phase ended."""

    objects: MemoryStore
    manifest: Manifest
    stream_id: int
    at_phase: list[Model]


def write(tmp: Path, events: list[tuple[str, int, int]], name: str = "t/0") -> Written:
    objects = MemoryStore()
    store = StreamStore.open(tmp / "d", objects, small_store_config())
    stream = store.create_stream(name)
    model = Model()
    at_phase = [copy.deepcopy(model)]
    per_phase = -(-len(events) // PHASES)
    for n in range(PHASES):
        for event in events[n * per_phase:(n + 1) * per_phase]:
            model.write(stream, *event)
        store.flush()  # a block per phase
        at_phase.append(copy.deepcopy(model))
    stream_id = stream.stream_id
    store.close()
    return Written(objects, read_manifest(objects), stream_id, at_phase)


def cut(manifest: Manifest, stream_id: int, end: int) -> Manifest:
    """The manifest as published when the stream's objects ended at ``end`` (a block's end)."""
    info = manifest.streams[stream_id]
    blocks = [b for b in manifest.blocks.get(stream_id, []) if b.entry.end_offset <= end]
    return Manifest(manifest.seq, {stream_id: StreamInfo(stream_id, info.name, info.start_offset, end)},
                    {stream_id: blocks})


def save_snapshot(data_dir: Path, stream_id: int, at: Model | None, ranges: list[AbortedRange]) -> None:
    """producers.sqlite as a broker leaves it: a snapshot ending at ``at`` (None: none was taken), and the
    aborted ranges made durable as their markers were written."""
    snapshots = ProducerSnapshots(data_dir / PRODUCERS_FILE)
    try:
        if at is not None:
            snapshots.save([], {stream_id: at.end}, [(stream_id, p, first) for p, (first, _) in at.open.items()])
        snapshots.add_aborted(stream_id, ranges)
    finally:
        snapshots.close()


def expected(known: Model, objects_end: int) -> tuple[int, list[bytes]]:
    """Where the read ends, and what it returns, knowing the log up to ``known``."""
    stable = min([objects_end, *(first for first, _ in known.open.values())])
    values = known.plain + [v for _, vs in known.committed for v in vs]
    return stable, sorted(v for v in values if int(v) < stable)


def read_values(written: Written, manifest: Manifest, data_dir: str | None, **bounds: int) -> tuple[int, list[bytes]]:
    txns = rest_transactions(data_dir, written.objects, manifest, [written.stream_id], **bounds)
    parts = plan_partitions(manifest, [written.stream_id], ends=txns.stable_ends)
    values = [v for p in committed_partitions(parts, txns) for b in p.read(written.objects, False)
              for v in b.column("value").to_pylist()]
    return txns.stable_ends[written.stream_id], sorted(values)


@settings(max_examples=60, deadline=None)
@given(events=st.lists(EVENT, min_size=1, max_size=24), snapshot=st.integers(0, PHASES),
       objects=st.integers(1, PHASES), durable_after=st.booleans())
def test_a_read_at_rest_returns_what_a_read_committed_consumer_would(events: list[tuple[str, int, int]], snapshot: int,
                                                                    objects: int, durable_after: bool) -> None:
    """``snapshot``: the phase the snapshot ended with (0: none taken); ``objects``: the phase the objects end
    with; ``durable_after``: whether the ranges of markers after the snapshot reached producers.sqlite (a
    crash may lose the last of them: the replay finds them again)."""
    with tempfile.TemporaryDirectory() as tmp:
        written = write(Path(tmp), events)
        final = written.at_phase[-1]
        at_snapshot = written.at_phase[snapshot]
        ranges = [r for r in final.aborted if durable_after or r.last_offset < at_snapshot.end]
        save_snapshot(Path(tmp), written.stream_id, at_snapshot if snapshot else None, ranges)
        objects_end = written.at_phase[objects].end
        manifest = cut(written.manifest, written.stream_id, objects_end)
        known = written.at_phase[max(snapshot, objects)]
        assert read_values(written, manifest, tmp) == expected(known, objects_end)


def test_a_replay_past_its_byte_bound_stops_the_read_at_a_stable_offset(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """No snapshot: the whole log is replayed, a block per phase. With room for the first block only, the
    read ends at its end, where producer 1's transaction (opened in the second) does not reach yet; with room
    for two, at that transaction's first offset."""
    events = [("plain", 0, 2), ("txn", 0, 1), ("commit", 0, 1),
              ("plain", 0, 1), ("txn", 1, 2), ("plain", 0, 1),
              ("plain", 0, 1), ("txn", 2, 1), ("abort", 2, 1)]
    written = write(tmp_path, events)
    save_snapshot(tmp_path, written.stream_id, None, [])
    first_block, second_block = (b.entry.size_bytes for b in written.manifest.blocks[written.stream_id][:2])
    with caplog.at_level(logging.WARNING, "stratalog.spark"):
        assert read_values(written, written.manifest, str(tmp_path), replay_bytes_max=first_block) == (
            4, [b"0", b"1", b"2"])   # offsets 0-1 plain, 2 committed at 3
    assert "reads up to offset 4 of 11" in caplog.text
    assert read_values(written, written.manifest, str(tmp_path), replay_bytes_max=first_block + second_block) == (
        5, [b"0", b"1", b"2", b"4"])
    assert read_values(written, written.manifest, str(tmp_path)) == (5, [b"0", b"1", b"2", b"4"])


def test_a_stream_that_is_no_topic_partition_is_read_whole_without_a_replay(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """No broker serves a stream not named ``topic/partition``: nothing to replay, whatever the budget."""
    written = write(tmp_path, [("plain", 0, 2), ("txn", 1, 1)], name="events")
    save_snapshot(tmp_path, written.stream_id, None, [])
    with caplog.at_level(logging.WARNING, "stratalog.spark"):
        txns = rest_transactions(str(tmp_path), written.objects, written.manifest, [written.stream_id],
                                 replay_bytes_max=0)
    assert txns.stable_ends == {written.stream_id: 3} and not txns.aborted and not caplog.text


def test_producers_sqlite_is_opened_read_only(tmp_path: Path) -> None:
    written = write(tmp_path, [("txn", 0, 1), ("abort", 0, 1), ("plain", 0, 1)])
    save_snapshot(tmp_path, written.stream_id, written.at_phase[-1], written.at_phase[-1].aborted)
    path = tmp_path / PRODUCERS_FILE
    path.chmod(0o444)
    before = path.read_bytes()
    assert read_values(written, written.manifest, str(tmp_path)) == (3, [b"2"])
    assert path.read_bytes() == before


@pytest.mark.parametrize("has_data_dir", [False, True])
def test_a_read_that_cannot_know_the_transactions_refuses_their_batches(tmp_path: Path, has_data_dir: bool) -> None:
    """The objects named alone, or a data directory without producers.sqlite: plain records read as ever, a
    transactional batch fails the read with a message that says how to read it."""
    written = write(tmp_path, [("plain", 0, 2), ("txn", 1, 1), ("commit", 1, 1)])
    data_dir = str(tmp_path) if has_data_dir else None
    txns = rest_transactions(data_dir, written.objects, written.manifest, [written.stream_id])
    assert txns.unknown == OBJECTS_ALONE if not has_data_dir else PRODUCERS_FILE in (txns.unknown or "")
    parts = committed_partitions(plan_partitions(written.manifest, [written.stream_id], ends={written.stream_id: 2}),
                                 txns)
    assert [v for p in parts for b in p.read(written.objects, False) for v in b.column("value").to_pylist()] == [
        b"0", b"1"]
    whole = committed_partitions(plan_partitions(written.manifest, [written.stream_id]), txns)
    with pytest.raises(TransactionsUnknownError, match=r"t/0: offsets 2-2 were written by a transaction.*"
                                                       r"isolationLevel=read_uncommitted"):
        [b for p in whole for b in p.read(written.objects, False)]

