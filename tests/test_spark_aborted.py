"""Which records a read_committed read of objects returns: property tests of spark/aborted.py against a
model of transactions, with the aborted ranges the broker's own bookkeeping makes (broker/txn_partitions.py),
and of the Spark columns built from stored batches with them, over any slice of the log.

The model: each producer's transactional records belong to its open transaction until its next marker, and
survive unless that marker aborts it; plain (non-transactional) records always survive; markers never give
a record. A slice read with only the ranges that overlap it returns exactly the model's survivors in it:
the ranges decide, wherever the abort marker lies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from stratalog.broker.txn_partitions import PartitionTxns
from stratalog.engine.batch import wrap_kafka_batch
from stratalog.engine.objformat import BlockEntry
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.kafka.control_batch import MarkerType, marker_batch
from stratalog.kafka.records import Compression
from stratalog.kafka.records import encode_batch as encode_kafka
from stratalog.spark.aborted import AbortedIndex, keeps, ranges_for
from stratalog.spark.columns import ColumnBuilder
from stratalog.spark.plan import ReadPartition, StreamSlice
from stratalog.wal.format import crc32c

STREAM_ID = 1

#: (what, producer 0-3, records, slack): a transactional batch (its transaction opening ``slack`` offsets
#: below it at most, as the broker records an opening at the partition's end before the batch), a plain batch
#: (of the same producer ids: only the transactional bit tells it apart, as Kafka's consumers look at the bit
#: first), or a commit or abort marker.
EVENT = st.tuples(st.sampled_from(["txn", "txn", "plain", "commit", "abort"]), st.integers(0, 3),
                  st.integers(1, 3), st.integers(0, 2))


@dataclass
class Batch:
    base_offset: int
    values: list[bytes]
    producer_id: int
    transactional: bool
    control: bool = False
    marker: MarkerType | None = None

    @property
    def last_offset(self) -> int:
        return self.base_offset + max(len(self.values), 1) - 1


@dataclass
class Log:
    """A partition's log as the model writes it, with the broker's bookkeeping of its transactions."""

    batches: list[Batch] = field(default_factory=list)
    survivors: set[bytes] = field(default_factory=set)
    txns: PartitionTxns = field(default_factory=PartitionTxns)
    end: int = 0

    def write(self, events: list[tuple[str, int, int, int]]) -> None:
        pending: dict[int, list[bytes]] = {}   # each producer's open transaction's values
        last_marker: dict[int, int] = {}
        for what, producer, count, slack in events:
            if what in ("txn", "plain"):
                transactional = what == "txn"
                values = [b"%d" % (self.end + i) for i in range(count)]
                if transactional:
                    if producer not in pending:
                        opened = max(self.end - slack, last_marker.get(producer, -1) + 1)
                        self.txns.began(STREAM_ID, producer, opened)
                    pending.setdefault(producer, []).extend(values)
                else:
                    self.survivors.update(values)
                self.batches.append(Batch(self.end, values, producer, transactional))
                self.end += count
                continue
            kind = MarkerType.COMMIT if what == "commit" else MarkerType.ABORT
            aborted = self.txns.aborts(STREAM_ID, producer, kind, self.end)
            self.txns.ended(STREAM_ID, producer, aborted)
            if kind is MarkerType.COMMIT:
                self.survivors.update(pending.get(producer, []))
            pending.pop(producer, None)
            self.batches.append(Batch(self.end, [], producer, True, control=True, marker=kind))
            last_marker[producer] = self.end
            self.end += 1
        for values in pending.values():   # still open: not aborted (read_committed stops before them)
            self.survivors.update(values)

    def ranges(self, start: int, end: int) -> list[AbortedTxn]:
        """What the partition's leader answers for ``[start, end)`` (broker/api_txn_ranges.py)."""
        return [AbortedTxn(r.last_offset, r.producer_id, r.first_offset)
                for r in self.txns.aborted_ranges(STREAM_ID, start, end)]


def kept(batch: Batch, index: AbortedIndex | None) -> bool:
    return keeps(index, control=batch.control, transactional=batch.transactional, producer_id=batch.producer_id,
                 base_offset=batch.base_offset, last_offset=batch.last_offset)


@settings(max_examples=400, deadline=None)
@given(events=st.lists(EVENT, max_size=40))
def test_a_batch_is_kept_exactly_when_no_abort_ended_its_transaction(events: list[tuple[str, int, int, int]]) -> None:
    log = Log()
    log.write(events)
    index = AbortedIndex(log.ranges(0, log.end))
    returned = {v for b in log.batches if kept(b, index) for v in b.values}
    assert returned == log.survivors
    assert not any(kept(b, index) for b in log.batches if b.control), "a marker is never a row"
    everything = {v for b in log.batches if kept(b, None) for v in b.values}
    assert everything == {v for b in log.batches for v in b.values}, "read_uncommitted: every record"


@settings(max_examples=300, deadline=None)
@given(events=st.lists(EVENT, min_size=1, max_size=30), cut=st.tuples(st.integers(0, 60), st.integers(0, 60)),
       compression=st.sampled_from([Compression.NONE, Compression.GZIP]))
def test_a_slice_read_from_objects_returns_the_survivors_in_it(events: list[tuple[str, int, int, int]],
                                                               cut: tuple[int, int], compression: Compression) -> None:
    """The stored batches of the log in one block, read over a slice with the ranges a task of that slice
    gets (the driver's answer for the partition, narrowed to the slice): exactly the survivors in the slice,
    whether or not the slice holds the markers of the transactions it reads."""
    log = Log()
    log.write(events)
    data = b"".join(stored(b, compression) for b in log.batches)
    if not data:
        return
    entry = BlockEntry(STREAM_ID, 0, log.end, 0, len(data), log.end, 5, crc32c(data))
    start, end = min(cut), max(cut)
    piece = StreamSlice(STREAM_ID, "t/0", start, end, ())
    ((_, ranges),) = ranges_for(ReadPartition((piece,)), {STREAM_ID: log.ranges(0, log.end)}) or ((STREAM_ID, ()),)
    builder = ColumnBuilder()
    builder.add_block(data, 0, entry, "t/0", start, end, AbortedIndex(ranges))
    rows = builder.finish(data).to_pylist()
    assert sorted(r["value"] for r in rows) == sorted(v for v in log.survivors if start <= int(v) < end)
    assert all(r["value"] == b"%d" % r["offset"] for r in rows), "each record at its own offset"


def stored(batch: Batch, compression: Compression) -> bytes:
    """The batch as the broker stores a producer's (or the coordinator's marker)."""
    if batch.marker is not None:
        kafka = marker_batch(batch.producer_id, 0, batch.marker, coordinator_epoch=0, timestamp_ms=5,
                             base_offset=batch.base_offset)
        return wrap_kafka_batch(STREAM_ID, batch.base_offset, 1, 5, kafka)
    kafka = encode_kafka([(None, v, (), 5) for v in batch.values], base_offset=batch.base_offset,
                         producer_id=batch.producer_id, producer_epoch=0, base_sequence=0, compression=compression,
                         is_transactional=batch.transactional)
    return wrap_kafka_batch(STREAM_ID, batch.base_offset, len(batch.values), 5, kafka)


def test_a_slice_without_the_abort_marker_still_drops_the_aborted_batches() -> None:
    """Producers 1 and 2 interleave their transactions over offsets 0-5; 1's is aborted at 7, 2's committed
    at 8. A task reading offsets 0-4 holds neither marker, and returns producer 2's records only."""
    log = Log()
    log.write([("txn", 1, 2, 0), ("txn", 2, 1, 0), ("txn", 1, 1, 0), ("txn", 2, 2, 0), ("plain", 0, 1, 0),
               ("abort", 1, 1, 0), ("commit", 2, 1, 0)])
    assert log.ranges(0, 5) == [AbortedTxn(7, 1, 0)]
    data = b"".join(stored(b, Compression.NONE) for b in log.batches)
    entry = BlockEntry(STREAM_ID, 0, log.end, 0, len(data), log.end, 5, crc32c(data))
    builder = ColumnBuilder()
    builder.add_block(data, 0, entry, "t/0", 0, 5, AbortedIndex(log.ranges(0, 5)))
    assert builder.finish(data).column("value").to_pylist() == [b"2", b"4"]
    plain = ColumnBuilder()
    plain.add_block(data, 0, entry, "t/0", 0, 5)
    assert plain.finish(data).column("value").to_pylist() == [b"0", b"1", b"2", b"3", b"4"], "read_uncommitted"
