"""Exactly once through aiokafka's consume-transform-produce loop (a read_committed consumer, a
transactional producer, send_offsets_to_transaction) while the broker is killed with -9 ROUNDS times:
every input record appears in the output exactly once, read_committed (read back with librdkafka)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import aiokafka
import pytest
from aiokafka.structs import TopicPartition as AioTopicPartition

from txnkit import INPUT_RECORDS, ROUNDS, assert_each_input_once, through_kills

pytestmark = pytest.mark.slow

PER_TXN = 2_000
CALL_S = 60.0
#: Between tries while the broker is down (it restarts in about a second).
RETRY_S = 0.2


class AioPipeline(threading.Thread):
    """aiokafka's loop on an event loop of its own: after any failure it aborts (or makes a new producer,
    which fences the old) and goes back to the group's committed offsets."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.group, self.txn_id = f"aio-{uuid.uuid4().hex[:6]}", f"aio-tx-{uuid.uuid4().hex[:6]}"
        self.restarts = 0
        self.stopping = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._loop())
        except BaseException as e:   # reported by the test
            self.failure = e

    async def _producer(self) -> aiokafka.AIOKafkaProducer:
        while True:
            producer = aiokafka.AIOKafkaProducer(bootstrap_servers=self.bootstrap, transactional_id=self.txn_id,
                                                 request_timeout_ms=10_000)
            try:
                await producer.start()
                return producer
            except Exception:   # the broker is down: try again
                await producer.stop()
                await asyncio.sleep(RETRY_S)

    async def _rewind(self, consumer: aiokafka.AIOKafkaConsumer) -> None:
        for tp in consumer.assignment():
            offset = await consumer.committed(tp)
            consumer.seek(tp, offset if offset is not None else 0)

    async def _loop(self) -> None:
        consumer = aiokafka.AIOKafkaConsumer("in", bootstrap_servers=self.bootstrap, group_id=self.group,
                                             isolation_level="read_committed", enable_auto_commit=False,
                                             auto_offset_reset="earliest", request_timeout_ms=10_000)
        await consumer.start()
        producer = await self._producer()
        try:
            while not self.stopping.is_set():
                batches = await consumer.getmany(timeout_ms=1000, max_records=PER_TXN)
                messages = [m for records in batches.values() for m in records]
                if not messages:
                    continue
                try:
                    async with producer.transaction():
                        for m in messages:
                            await producer.send("out", b"out-" + m.value, partition=m.partition)
                        ends = {AioTopicPartition("in", tp.partition): records[-1].offset + 1
                                for tp, records in batches.items()}
                        await producer.send_offsets_to_transaction(ends, self.group)
                except Exception:   # the broker died under the transaction: start it again
                    self.restarts += 1
                    await producer.stop()
                    producer = await self._producer()
                    await self._until_rewound(consumer)
        finally:
            await producer.stop()
            await consumer.stop()

    async def _until_rewound(self, consumer: aiokafka.AIOKafkaConsumer) -> None:
        while True:
            try:
                await self._rewind(consumer)
                return
            except Exception:   # the broker is still down
                await asyncio.sleep(RETRY_S)


def test_aiokafka_consume_transform_produce_writes_each_input_once_across_kill9(tmp_path: Path) -> None:
    values, pipeline = through_kills(tmp_path / "data", AioPipeline)
    assert_each_input_once(values)
    print(f"{INPUT_RECORDS} inputs through {ROUNDS} kills with aiokafka: each once; the pipeline went back "
          f"{pipeline.restarts} times")
