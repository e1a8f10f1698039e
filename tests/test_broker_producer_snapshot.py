"""Idempotent producers' snapshot against the one race that can skip a batch: a batch becomes durable on
a WAL thread before the event loop settles it into the producer states. A snapshot taken between the two
must still lead a restarted broker to that batch: otherwise a retry of it is stored a second time, or
the producer's next batch is refused as out of order (librdkafka then fails the producer with
OUT_OF_ORDER_SEQUENCE_NUMBER, as a kill -9 test on a loaded machine saw)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from stratalog.broker.api_log import _check_and_append
from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener
from stratalog.broker.producer_recovery import replay
from stratalog.broker.producers import ProducerStates, Verdict
from stratalog.broker.session import Session
from stratalog.broker.txn_partitions import PartitionTxns
from stratalog.kafka.records import encode_batch
from waiting import wait_until

PRODUCER_ID = 7


def batch(sequence: int) -> bytes:
    return encode_batch([(None, f"v{sequence}".encode(), (), 1_000)], base_offset=0, producer_id=PRODUCER_ID,
                        producer_epoch=0, base_sequence=sequence)


def test_a_snapshot_between_durable_and_settled_leads_the_restart_to_the_batch(
        loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    async def open_broker() -> Broker:
        return Broker.open(tmp_path / "data", BrokerConfig())

    broker = loop.run_until_complete(open_broker())
    try:
        broker.create_topic("t", 1, {})
        session = Session(Listener.parse("PLAINTEXT://127.0.0.1:9092"), "127.0.0.1", broker.authorizer,
                          principal="User:ANONYMOUS")

        async def produce_and_snapshot_in_the_window() -> None:
            future, stream = _check_and_append(broker, session, "t", 0, batch(0))
            # The loop is held here, so the batch's callbacks (which settle it) cannot run, while the WAL
            # thread makes it durable: the stream's end moves past it.
            wait_until(lambda: stream.end_offset == 1, "the batch to become durable")
            assert not future.done()
            broker._save_producers()                 # the periodic snapshot, in the window
            assert await future == 0

        loop.run_until_complete(produce_and_snapshot_in_the_window())
        stream = broker.partition("t", 0)
        assert stream is not None
        # What a restart does: the snapshot, then the batches after its ends.
        restarted = ProducerStates(broker.config.producers_max)
        ends = broker.producer_snapshots.load(restarted, PartitionTxns())
        replay(restarted, PartitionTxns(), stream, ends.get(stream.stream_id, 0))
        verdict, _ = restarted.check(PRODUCER_ID, 0, stream.stream_id, 1, 1)
        assert verdict is Verdict.APPEND, "the producer's next batch follows the one the snapshot raced"
        assert restarted.check(PRODUCER_ID, 0, stream.stream_id, 0, 1) == (Verdict.DUPLICATE, 0)
    finally:
        loop.run_until_complete(broker.close())
