"""Each partition's transactions as its leader knows them (broker/txn_partitions.py), and how a restart finds
them again from the snapshot and the log (producer_recovery.py's replay): the last stable offset and the
aborted ranges read_committed consumers get.

| the log after the snapshot holds       | the restart's partition state                                     |
|----------------------------------------|-------------------------------------------------------------------|
| a transactional batch                  | its transaction open from the batch's offset                      |
| nothing (the batch before the snapshot)| the transaction open from where the snapshot said                 |
| its commit marker                      | nothing open, no range                                            |
| its abort marker                       | nothing open, its range (made durable again if it was lost)       |
| a marker of a producer with none open  | nothing changes                                                   |
A snapshot taken while a marker is being written ends below where the marker can land.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stratalog.broker.api_log import _check_and_append
from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener
from stratalog.broker.producer_recovery import replay
from stratalog.broker.producers import ProducerStates
from stratalog.broker.session import Session
from stratalog.broker.txn_markers import write_marker
from stratalog.broker.txn_partitions import AbortedRange, PartitionTxns
from stratalog.kafka.control_batch import MarkerType
from stratalog.kafka.records import encode_batch

STREAM = 1


def test_the_last_stable_offset_is_where_the_oldest_open_transaction_began() -> None:
    txns = PartitionTxns()
    assert txns.last_stable_offset(STREAM, 10) == 10
    txns.began(STREAM, 7, 4)
    txns.began(STREAM, 8, 6)
    txns.began(STREAM, 7, 9)        # a later batch of an open transaction moves nothing
    assert txns.last_stable_offset(STREAM, 10) == 4
    assert txns.last_stable_offset(STREAM + 1, 10) == 10, "per stream"
    txns.ended(STREAM, 7, None)
    assert txns.last_stable_offset(STREAM, 10) == 6
    txns.ended(STREAM, 8, None)
    assert txns.last_stable_offset(STREAM, 10) == 10


def test_an_abort_marker_closes_the_range_from_the_first_batch_and_a_commit_none() -> None:
    txns = PartitionTxns()
    txns.began(STREAM, 7, 4)
    assert txns.aborts(STREAM, 7, MarkerType.COMMIT, 9) is None
    aborted = txns.aborts(STREAM, 7, MarkerType.ABORT, 9)
    assert aborted == AbortedRange(9, 7, 4)
    txns.ended(STREAM, 7, aborted)
    txns.ended(STREAM, 7, aborted)   # the same marker's range recorded again: kept once
    assert txns.aborted_ranges(STREAM, 0, 100) == [aborted]
    assert txns.aborts(STREAM, 7, MarkerType.ABORT, 12) is None, "nothing open: a second marker ends nothing"


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 10)), max_size=12), st.integers(0, 70),
       st.integers(0, 70))
def test_aborted_ranges_are_those_overlapping_the_offsets_asked(spans: list[tuple[int, int]], start: int,
                                                                length: int) -> None:
    txns = PartitionTxns()
    made = []
    for pid, (first, size) in enumerate(spans):
        r = AbortedRange(first + size, pid, first)
        txns.ended(STREAM, pid, r)
        made.append(r)
    end = start + length
    expected = sorted(r for r in made if r.last_offset >= start and r.first_offset < end)
    assert txns.aborted_ranges(STREAM, start, end) == expected


def test_a_snapshot_ends_below_a_marker_being_written() -> None:
    txns = PartitionTxns()
    txns.marking(STREAM, 12)
    txns.marking(STREAM, 15)
    assert txns.snapshot_bound(STREAM, 20) == 12
    txns.marked(STREAM, 12)
    assert txns.snapshot_bound(STREAM, 20) == 15
    txns.marked(STREAM, 15)
    assert txns.snapshot_bound(STREAM, 20) == 20


def test_ranges_below_a_trim_go() -> None:
    txns = PartitionTxns()
    txns.ended(STREAM, 7, AbortedRange(5, 7, 2))
    txns.ended(STREAM, 8, AbortedRange(9, 8, 6))
    assert not txns.trimmed(STREAM, 5)
    assert txns.trimmed(STREAM, 6)
    assert txns.ranges_of(STREAM) == [AbortedRange(9, 8, 6)]


# Through a broker: the rows of the table ------------------------------------------------------------------

def _session(broker: Broker) -> Session:
    return Session(Listener.parse("PLAINTEXT://127.0.0.1:9092"), "127.0.0.1", broker.authorizer,
                   principal="User:ANONYMOUS")


async def _produce(broker: Broker, pid: int, sequence: int, transactional: bool) -> int:
    batch = encode_batch([(b"k", b"v", (), 1_000)], base_offset=0, producer_id=pid, producer_epoch=0,
                         base_sequence=sequence, is_transactional=transactional)
    future, _ = _check_and_append(broker, _session(broker), "t", 0, memoryview(batch))
    return await future


async def _ongoing(broker: Broker, txn_id: str) -> int:
    """A transaction of ``txn_id`` open in partition 0: its producer id."""
    _, pid, epoch = await broker.transactions.init_producer_id(txn_id, 60_000, -1, -1)
    assert epoch == 0
    await broker.transactions.add_partitions(txn_id, pid, epoch, [("t", 0)])
    return pid


def _restarted_state(broker: Broker) -> PartitionTxns:
    """What a restart finds for partition 0 from the durable snapshot and the log: the state it rebuilds."""
    stream = broker.partition("t", 0)
    assert stream is not None
    txns = PartitionTxns()
    end = broker.producer_snapshots.load_partition(ProducerStates(100), txns, stream.stream_id)
    found = replay(ProducerStates(100), txns, stream, end)
    broker.producer_snapshots.add_aborted(stream.stream_id, found.aborted)
    return txns


@pytest.fixture
def broker(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> Iterator[Broker]:
    async def open_broker() -> Broker:
        return Broker.open(tmp_path / "data", BrokerConfig())

    opened = loop.run_until_complete(open_broker())
    opened.create_topic("t", 1, {})
    yield opened
    loop.run_until_complete(opened.close())


def _stream_id(broker: Broker) -> int:
    stream = broker.partition("t", 0)
    assert stream is not None
    return stream.stream_id


@pytest.mark.parametrize("snapshot_after_batch", [False, True], ids=["batch-after-snapshot", "batch-before"])
def test_an_open_transaction_is_found_again_from_its_batch_or_the_snapshot(
        loop: asyncio.AbstractEventLoop, broker: Broker, snapshot_after_batch: bool) -> None:
    async def run() -> None:
        await _produce(broker, 900, 0, False)    # offset 0, outside any transaction
        pid = await _ongoing(broker, "a")
        broker._save_producers()
        offset = await _produce(broker, pid, 0, True)
        if snapshot_after_batch:
            broker._save_producers()
        txns = _restarted_state(broker)
        assert txns.last_stable_offset(_stream_id(broker), 99) == (1 if snapshot_after_batch else offset)
        assert offset == 1
    loop.run_until_complete(run())


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_a_marker_after_the_snapshot_ends_the_transaction_and_an_abort_keeps_its_range(
        loop: asyncio.AbstractEventLoop, broker: Broker, commit: bool) -> None:
    async def run() -> None:
        pid = await _ongoing(broker, "a")
        await _produce(broker, pid, 0, True)
        broker._save_producers()
        assert await broker.transactions.end_txn("a", pid, 0, commit) == 0
        sid = _stream_id(broker)
        # The range's row lost (a power cut after the marker): the replay reads the marker and writes it again.
        broker.producer_snapshots.forget_aborted_before(sid, 2**62)
        txns = _restarted_state(broker)
        assert txns.last_stable_offset(sid, 2) == 2
        assert txns.ranges_of(sid) == ([] if commit else [AbortedRange(1, pid, 0)])
        again = PartitionTxns()
        broker.producer_snapshots.load_partition(ProducerStates(100), again, sid)
        assert again.ranges_of(sid) == txns.ranges_of(sid), "made durable by the replay"
    loop.run_until_complete(run())


def test_a_marker_of_a_producer_with_nothing_open_changes_nothing(loop: asyncio.AbstractEventLoop,
                                                                   broker: Broker) -> None:
    async def run() -> None:
        other = await _ongoing(broker, "b")
        await _produce(broker, other, 0, True)
        pid = await _ongoing(broker, "a")   # added the partition, wrote nothing in it
        assert await broker.transactions.end_txn("a", pid, 0, False) == 0
        sid = _stream_id(broker)
        for txns in (broker.partition_txns, _restarted_state(broker)):
            assert txns.ranges_of(sid) == []
            assert txns.last_stable_offset(sid, 99) == 0, "b's transaction still holds it"
    loop.run_until_complete(run())


def test_a_snapshot_during_a_marker_write_ends_below_it(loop: asyncio.AbstractEventLoop, broker: Broker) -> None:
    async def run() -> None:
        pid = await _ongoing(broker, "a")
        await _produce(broker, pid, 0, True)
        sid = _stream_id(broker)
        writing = asyncio.ensure_future(write_marker(broker, "t", 0, pid, 0, MarkerType.ABORT, 0))
        await asyncio.sleep(0)     # the write has begun: its append is queued
        assert broker._snapshot_ends()[sid] <= 1
        assert await writing == 1
        assert broker._snapshot_ends()[sid] == 2
    loop.run_until_complete(run())
