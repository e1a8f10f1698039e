"""The transaction coordinator's recovery (broker/transactions.py), one test per row of its table: what a
broker restarted after a crash does with a transaction in each state it may have been left in; and what
keeps its state bounded (ids expire, aborted ranges go with the records they covered).

| left in              | at the restart                                                          |
|----------------------|-------------------------------------------------------------------------|
| PrepareCommit        | commit markers written into every partition, its offsets stored, done   |
| PrepareAbort         | abort markers written, its ranges listed as aborted, done               |
| Ongoing              | goes on: the last stable offset held at its first offset until it ends |
| Ongoing, timed out   | aborted with its epoch bumped: the producer that let it lapse is fenced |
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from kio.schema.errors import ErrorCode

from stratalog.broker.api_log import _check_and_append
from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener
from stratalog.broker.session import Session
from stratalog.broker.txn_state import PendingOffset, TxnState
from stratalog.engine.batch import ENCODING_KAFKA, is_control_batch
from stratalog.kafka.records import encode_batch

TXN = "tx"
PARTITIONS = 2


def session(broker: Broker) -> Session:
    return Session(Listener.parse("PLAINTEXT://127.0.0.1:9092"), "127.0.0.1", broker.authorizer,
                   principal="User:ANONYMOUS")


async def open_transaction(broker: Broker) -> tuple[int, int]:
    """A transaction of TXN with a record in each partition, and an offset committed in it."""
    error, pid, epoch = await broker.transactions.init_producer_id(TXN, 60_000, -1, -1)
    assert error == ErrorCode.none
    wanted = [("t", p) for p in range(PARTITIONS)]
    assert await broker.transactions.add_partitions(TXN, pid, epoch, wanted) == ErrorCode.none
    for p in range(PARTITIONS):
        batch = encode_batch([(b"k", f"v{p}".encode(), (), 1_000)], base_offset=0, producer_id=pid,
                             producer_epoch=epoch, base_sequence=0, is_transactional=True)
        future, _ = _check_and_append(broker, session(broker), "t", p, memoryview(batch))
        await future
    assert await broker.transactions.add_offsets(TXN, pid, epoch, "g") == ErrorCode.none
    assert await broker.transactions.offset_commit(TXN, pid, epoch, "g", (PendingOffset("g", "t", 0, 42, -1, None),)) \
        == ErrorCode.none
    return pid, epoch


def lso(broker: Broker, partition: int) -> int:
    """The partition's last stable offset, its leader's answer (broker/txn_partitions.py)."""
    stream = broker.partition("t", partition)
    assert stream is not None
    return broker.partition_txns.last_stable_offset(stream.stream_id, stream.end_offset)


def ranges(broker: Broker, partition: int) -> list[tuple[int, int, int]]:
    """(producer id, first offset, marker offset) of the partition's aborted ranges."""
    stream = broker.partition("t", partition)
    assert stream is not None
    return [(r.producer_id, r.first_offset, r.last_offset)
            for r in broker.partition_txns.aborted_ranges(stream.stream_id, 0, 2**62)]


def markers(broker: Broker, partition: int) -> list[int]:
    """Offsets of the control batches of a partition."""
    stream = broker.partition("t", partition)
    assert stream is not None
    return [b.base_offset for b in stream.fetch_batches(0, 1 << 20)
            if b.encoding == ENCODING_KAFKA and is_control_batch(b.body)]


def crash_and_restart(loop: asyncio.AbstractEventLoop, tmp_path: Path, left_in: TxnState | None,
                      now_ms: int | None = None) -> Broker:
    """A broker with an open transaction, left in ``left_in`` (None: Ongoing) at a crash, and restarted:
    the restarted broker, after its coordinator's first round."""
    async def before() -> None:
        broker = Broker.open(tmp_path / "data", BrokerConfig())
        broker.create_topic("t", PARTITIONS, {})
        await open_transaction(broker)
        if left_in is not None:   # its end decided and durable, then the crash: no marker written
            txns = broker.transactions
            await txns._save(replace(txns._txns[TXN], state=left_in))
        await broker.close()

    loop.run_until_complete(before())

    async def after() -> Broker:
        broker = Broker.open(tmp_path / "data", BrokerConfig())
        await broker.transactions.complete_and_expire(now_ms)
        return broker

    return loop.run_until_complete(after())


def test_prepare_commit_writes_its_markers_and_stores_its_offsets(loop: asyncio.AbstractEventLoop,
                                                                 tmp_path: Path) -> None:
    broker = crash_and_restart(loop, tmp_path, TxnState.PREPARE_COMMIT)
    try:
        assert broker.transactions._txns[TXN].state is TxnState.COMPLETE_COMMIT
        assert [markers(broker, p) for p in range(PARTITIONS)] == [[1], [1]]
        assert lso(broker, 0) == 2
        assert broker.offsets.fetch("g", None)[("t", 0)].offset == 42
        assert ranges(broker, 0) == []
    finally:
        loop.run_until_complete(broker.close())


def test_prepare_abort_writes_its_markers_and_lists_its_ranges(loop: asyncio.AbstractEventLoop,
                                                              tmp_path: Path) -> None:
    broker = crash_and_restart(loop, tmp_path, TxnState.PREPARE_ABORT)
    try:
        assert broker.transactions._txns[TXN].state is TxnState.COMPLETE_ABORT
        assert [markers(broker, p) for p in range(PARTITIONS)] == [[1], [1]]
        pid = broker.transactions._txns[TXN].producer_id
        assert ranges(broker, 0) == [(pid, 0, 1)]
        assert lso(broker, 0) == 2
        assert ("t", 0) not in broker.offsets.fetch("g", None), "an aborted transaction's offsets never count"
    finally:
        loop.run_until_complete(broker.close())


def test_ongoing_goes_on_holding_the_last_stable_offset(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    broker = crash_and_restart(loop, tmp_path, None)
    try:
        txn = broker.transactions._txns[TXN]
        assert txn.state is TxnState.ONGOING
        assert [markers(broker, p) for p in range(PARTITIONS)] == [[], []]
        assert lso(broker, 0) == 0
        done = loop.run_until_complete(broker.transactions.end_txn(TXN, txn.producer_id, txn.producer_epoch, True))
        assert done == ErrorCode.none
        assert lso(broker, 0) == 2
    finally:
        loop.run_until_complete(broker.close())


def test_ongoing_past_its_timeout_is_aborted_and_its_producer_fenced(loop: asyncio.AbstractEventLoop,
                                                                    tmp_path: Path) -> None:
    broker = crash_and_restart(loop, tmp_path, None, now_ms=2**62)
    try:
        txn = broker.transactions._txns[TXN]
        assert txn.state is TxnState.COMPLETE_ABORT
        assert [markers(broker, p) for p in range(PARTITIONS)] == [[1], [1]]
        zombie_epoch = txn.producer_epoch - 1
        assert broker.transactions.check_produce(txn.producer_id, zombie_epoch, "t", 0) \
            == ErrorCode.invalid_producer_epoch
        assert loop.run_until_complete(broker.transactions.end_txn(TXN, txn.producer_id, zombie_epoch, True)) \
            == ErrorCode.producer_fenced
    finally:
        loop.run_until_complete(broker.close())


def test_an_ended_id_idle_past_its_expiration_and_trimmed_aborted_ranges_are_forgotten(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    later_ms = 2**62   # past transactional_id_expiration_ms, and any timeout
    broker = crash_and_restart(loop, tmp_path, TxnState.PREPARE_ABORT)
    try:
        assert ranges(broker, 0) != []
        stream = broker.partition("t", 0)
        assert stream is not None
        stream.trim(stream.end_offset)   # DeleteRecords, or retention, past the abort marker
        loop.run_until_complete(broker.transactions.complete_and_expire(later_ms))
        loop.run_until_complete(broker._forget_trimmed_ranges())
        assert broker.transactions.get(TXN) is None
        assert ranges(broker, 0) == []
        assert ranges(broker, 1) != [], "partition 1 was not trimmed"
    finally:
        loop.run_until_complete(broker.close())
    reopened = loop.run_until_complete(_open(tmp_path))
    try:
        assert reopened.transactions.get(TXN) is None, "forgotten in its table too"
        assert ranges(reopened, 0) == []
        assert ranges(reopened, 1) != []
    finally:
        loop.run_until_complete(reopened.close())


async def _open(tmp_path: Path) -> Broker:
    return Broker.open(tmp_path / "data", BrokerConfig())
