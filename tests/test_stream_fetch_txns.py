"""Stream.fetch and Kafka transactions (engine/txn_view.py): read_committed by default, ending at the last
stable offset and skipping what aborted transactions wrote, as the view of the stream's transactions says;
read_uncommitted by option; with no view, plain data reads as before and a transactional batch fails a
read_committed fetch. Each through the log cache and through objects; then through an in-process broker,
whose view is read from other threads through its loop (broker/txn_read_view.py), and through the web
console of a real `stratalog serve`."""

from __future__ import annotations

import asyncio
import re
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import console_address, running_broker
from enginekit import MemoryStore, small_store_config
from stratalog.broker import txn_read_view
from stratalog.broker.api_log import _check_and_append, _offset_for_time
from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener
from stratalog.broker.session import Session
from stratalog.broker.txn_partitions import PartitionTxns
from stratalog.broker.txn_read_view import LoopTxnView, TxnViewUnavailableError
from stratalog.engine import Record, Stream, StreamStore, TransactionsUnknownError
from stratalog.engine.txn_view import Isolation
from stratalog.kafka.control_batch import MarkerType, marker_batch
from stratalog.kafka.records import encode_batch

#: Producers of the written transactions: one committed, one aborted, one left open.
COMMITS, ABORTS, OPEN = 10, 11, 12
TS_MS = 1_000
CALL_S = 30.0


class Writer:
    """Writes a stream as a broker does (Kafka batches as they come, markers, and the partition's
    transactions kept in a PartitionTxns, the view the reads are given): the broker's rules, no broker."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.txns = PartitionTxns()

    def native(self, value: bytes) -> int:
        return self.stream.append([value]).result(CALL_S)

    def kafka(self, *values: bytes, producer_id: int = -1) -> int:
        transactional = producer_id >= 0
        if transactional:
            self.txns.began(self.stream.stream_id, producer_id, self.stream.end_offset)
        batch = encode_batch([(None, v, (), TS_MS) for v in values], base_offset=0, producer_id=producer_id,
                             producer_epoch=0 if transactional else -1, is_transactional=transactional)
        return self.stream.append_kafka(batch, len(values), TS_MS).result(CALL_S)

    def marker(self, producer_id: int, kind: MarkerType) -> int:
        batch = marker_batch(producer_id, 0, kind, coordinator_epoch=0, timestamp_ms=TS_MS)
        offset = self.stream.append_kafka(batch, 1, TS_MS).result(CALL_S)
        sid = self.stream.stream_id
        self.txns.ended(sid, producer_id, self.txns.aborts(sid, producer_id, kind, offset))
        return offset


def write_interleaved(w: Writer) -> None:
    """Offsets 0-9: an aborted transaction's batches among a committed one's and plain ones, then one left open
    (from offset 7) with a plain record after it."""
    assert w.native(b"p0") == 0
    w.kafka(b"a1", producer_id=COMMITS)
    w.kafka(b"b2", b"b3", producer_id=ABORTS)
    w.kafka(b"a4", producer_id=COMMITS)
    assert w.marker(COMMITS, MarkerType.COMMIT) == 5
    w.kafka(b"k6")
    assert w.marker(ABORTS, MarkerType.ABORT) == 7
    assert w.kafka(b"c8", producer_id=OPEN) == 8
    assert w.native(b"p9") == 9


EVERY = [b"p0", b"a1", b"b2", b"b3", b"a4", b"k6", b"c8", b"p9"]
COMMITTED = [b"p0", b"a1", b"a4", b"k6"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StreamStore]:
    opened = StreamStore.open(tmp_path / "data", MemoryStore(), small_store_config())
    yield opened
    opened.close()


def values(records: list[Record]) -> list[bytes]:
    return [r.value for r in records]


def placed(store: StreamStore, where: str) -> None:
    """Leave the records where the case reads them: in the log cache, or in objects only."""
    if where == "objects":
        store.flush()
        for s in store.streams():
            assert s.uploaded_end_offset == s.end_offset


WHERE = pytest.mark.parametrize("where", ["log-cache", "objects"])


@WHERE
def test_read_committed_skips_aborted_records_and_stops_at_an_open_transaction(store: StreamStore,
                                                                                where: str) -> None:
    w = Writer(store.create_stream("t/0"))
    write_interleaved(w)
    store.set_txn_view(w.txns)
    placed(store, where)
    s = w.stream
    got = s.fetch(0)
    assert values(got) == COMMITTED
    assert [r.offset for r in got] == [0, 1, 4, 6], "offsets as written: skipped ones leave gaps"
    assert values(s.fetch(0, isolation="read_uncommitted")) == EVERY
    assert values(s.fetch(2)) == [b"a4", b"k6"], "a read from inside an aborted range"
    assert values(s.fetch(0, 4)) == [b"p0", b"a1"]
    assert s.fetch(8) == [], "nothing past the last stable offset"


@WHERE
def test_a_read_in_small_pieces_returns_what_one_read_does(store: StreamStore, where: str) -> None:
    w = Writer(store.create_stream("t/0"))
    write_interleaved(w)
    store.set_txn_view(w.txns)
    placed(store, where)
    cases: list[tuple[Isolation, list[bytes]]] = [("read_committed", COMMITTED), ("read_uncommitted", EVERY)]
    for isolation, expected in cases:
        pieces: list[Record] = []
        pos = 0
        while piece := w.stream.fetch(pos, max_bytes=1, isolation=isolation):
            assert len(piece) == 1
            pieces += piece
            pos = piece[-1].offset + 1
        assert values(pieces) == expected, isolation


@WHERE
def test_the_open_transaction_once_ended_lets_the_read_go_on(store: StreamStore, where: str) -> None:
    w = Writer(store.create_stream("t/0"))
    write_interleaved(w)
    store.set_txn_view(w.txns)
    assert w.marker(OPEN, MarkerType.ABORT) == 10
    w.kafka(b"a11", producer_id=COMMITS)
    w.marker(COMMITS, MarkerType.COMMIT)
    placed(store, where)
    assert values(w.stream.fetch(0)) == [*COMMITTED, b"p9", b"a11"]


@WHERE
def test_without_a_view_a_transactional_batch_fails_a_read_committed_fetch(store: StreamStore, where: str) -> None:
    w = Writer(store.create_stream("t/0"))
    write_interleaved(w)
    placed(store, where)
    s = w.stream
    with pytest.raises(TransactionsUnknownError, match=r"t/0: offsets 1-1 were written by a transaction.*"
                                                       r"read_uncommitted"):
        s.fetch(0)
    assert values(s.fetch(0, 1)) == [b"p0"], "a read that ends before the transaction does not judge it"
    assert values(s.fetch(0, isolation="read_uncommitted")) == EVERY


@WHERE
def test_without_a_view_plain_data_reads_as_before(store: StreamStore, where: str) -> None:
    w = Writer(store.create_stream("plain"))
    w.native(b"n0")
    w.kafka(b"k1", b"k2")
    w.marker(ABORTS, MarkerType.COMMIT)   # a marker alone holds no record, transactional or not
    w.native(b"n4")
    placed(store, where)
    committed = w.stream.fetch(0)
    assert committed == w.stream.fetch(0, isolation="read_uncommitted")
    assert values(committed) == [b"n0", b"k1", b"k2", b"n4"]


def test_an_unknown_isolation_is_refused(store: StreamStore) -> None:
    s = store.create_stream("s")
    s.append([b"x"]).result(CALL_S)
    with pytest.raises(ValueError, match="read_committed or read_uncommitted"):
        s.fetch(0, isolation="read_all")  # type: ignore[arg-type]


# Through a broker, in this process ------------------------------------------------------------------------

def _session(broker: Broker) -> Session:
    return Session(Listener.parse("PLAINTEXT://127.0.0.1:9092"), "127.0.0.1", broker.authorizer,
                   principal="User:ANONYMOUS")


async def _produce(broker: Broker, value: bytes, pid: int = -1, sequence: int = -1, ts_ms: int = TS_MS) -> int:
    transactional = pid >= 0
    batch = encode_batch([(None, value, (), ts_ms)], base_offset=0, producer_id=pid,
                         producer_epoch=0 if transactional else -1, base_sequence=sequence,
                         is_transactional=transactional)
    future, _ = _check_and_append(broker, _session(broker), "t", 0, memoryview(batch))
    return await future


async def _begin(broker: Broker, txn_id: str) -> int:
    """A transaction of ``txn_id`` open in partition 0: its producer id (epoch 0)."""
    _, pid, epoch = await broker.transactions.init_producer_id(txn_id, 60_000, -1, -1)
    assert epoch == 0
    await broker.transactions.add_partitions(txn_id, pid, epoch, [("t", 0)])
    return pid


@pytest.fixture
def broker(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> Iterator[Broker]:
    async def open_broker() -> Broker:
        return Broker.open(tmp_path / "data", BrokerConfig())

    opened = loop.run_until_complete(open_broker())
    opened.create_topic("t", 1, {})
    yield opened
    loop.run_until_complete(opened.close())


def test_a_broker_s_view_is_read_on_its_loop_and_from_other_threads(loop: asyncio.AbstractEventLoop,
                                                                    broker: Broker) -> None:
    async def run() -> None:
        assert await _produce(broker, b"plain") == 0
        kept = await _begin(broker, "kept")
        dropped = await _begin(broker, "dropped")
        assert await _produce(broker, b"kept-1", kept, 0, ts_ms=TS_MS + 1) == 1
        assert await _produce(broker, b"dropped-2", dropped, 0, ts_ms=TS_MS + 2) == 2
        stream = broker.partition("t", 0)
        assert stream is not None
        # Both open: the read ends where the first began, on the loop and off it.
        assert values(stream.fetch(0)) == [b"plain"]
        assert values(await asyncio.to_thread(stream.fetch, 0)) == [b"plain"]
        assert await broker.transactions.end_txn("dropped", dropped, 0, False) == 0
        assert values(await asyncio.to_thread(stream.fetch, 0)) == [b"plain"], "kept's still open"
        assert await broker.transactions.end_txn("kept", kept, 0, True) == 0
        assert await _produce(broker, b"after", ts_ms=TS_MS + 5) == 5   # two markers at 3 and 4
        for got in (stream.fetch(0), await asyncio.to_thread(stream.fetch, 0)):
            assert values(got) == [b"plain", b"kept-1", b"after"]
        assert values(await asyncio.to_thread(stream.fetch, 0, isolation="read_uncommitted")) == [
            b"plain", b"kept-1", b"dropped-2", b"after"]
        broker.store.flush()
        assert values(await asyncio.to_thread(stream.fetch, 0)) == [b"plain", b"kept-1", b"after"], "from objects"
        # ListOffsets by time finds the first record at or after it, aborted or not (as Kafka's time index),
        # and gives that record's own timestamp.
        assert await asyncio.to_thread(_offset_for_time, stream, TS_MS + 2) == (2, TS_MS + 2)
    loop.run_until_complete(run())


def test_a_loop_that_does_not_answer_fails_the_read_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txn_read_view, "LOOP_WAIT_S", 0.05)
    busy = asyncio.new_event_loop()
    held, free = threading.Event(), threading.Event()

    def hold() -> None:   # a callback that keeps the loop from answering until the read has failed
        held.set()
        free.wait(CALL_S)

    busy.call_soon(hold)
    runner = threading.Thread(target=busy.run_forever)
    runner.start()
    try:
        assert held.wait(CALL_S)
        with pytest.raises(TxnViewUnavailableError, match="read_uncommitted"):
            LoopTxnView(PartitionTxns(), busy).last_stable_offset(1, 10)
    finally:
        free.set()
        busy.call_soon_threadsafe(busy.stop)
        runner.join(CALL_S)
        busy.close()


def test_a_loop_that_does_not_run_is_not_waited_for() -> None:
    idle = asyncio.new_event_loop()   # changes nothing while it does not run: asked at once
    try:
        txns = PartitionTxns()
        txns.began(1, 7, 4)
        assert LoopTxnView(txns, idle).last_stable_offset(1, 10) == 4
    finally:
        idle.close()


# Through the web console of a real broker ------------------------------------------------------------------

@pytest.mark.slow
def test_the_console_shows_committed_records_only(tmp_path: Path) -> None:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    with running_broker(tmp_path / "data", "--console", "127.0.0.1:0") as process:
        admin = AdminClient({"bootstrap.servers": process.bootstrap})
        admin.create_topics([NewTopic(topic, 1)])[topic].result(CALL_S)
        producer = Producer({"bootstrap.servers": process.bootstrap, "transactional.id": f"{topic}-writer"})
        producer.init_transactions(CALL_S)
        for value, commit in ((b"committed-first", True), (b"aborted-value", False), (b"committed-last", True)):
            producer.begin_transaction()
            producer.produce(topic, value=value, partition=0)
            assert producer.flush(CALL_S) == 0
            if commit:
                producer.commit_transaction(CALL_S)
            else:
                producer.abort_transaction(CALL_S)
        url = f"{console_address(process.output)}/topics/{topic}/messages?partition=0&offset=0&count=50"
        with urllib.request.urlopen(url, timeout=CALL_S) as response:
            page = response.read().decode()
        assert process.stop() == 0, "".join(process.output)
    shown = re.findall(r'<pre class="value">([^<]*)</pre>', page)
    assert shown == ["committed-first", "committed-last"]
