"""An idempotent producer's produce pipeline: several Produce requests of one partition in flight on one
connection at once, as Kafka lets an idempotent producer keep (max.in.flight.requests.per.connection up
to 5). The broker appends each request as it reads it, without waiting for the one before to be durable,
and answers them in the order they came, each once durable; a batch sent again while the first copy is
still in flight, or after it landed, gets that copy's offset and is not written twice; a gap in the
sequence is refused.

librdkafka keeps one request per partition in flight with idempotence, whatever the broker does
(BENCHMARKS.md, "Transactions."), and kafka-python and aiokafka mute a partition while its batch is in
flight: the pipelines here are sent on the wire, as a Java producer sends them.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import i16, i32, i32Timedelta

from brokerkit import BrokerProcess, running_broker
from clusterkit import init_producer_id, partition_log
from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener
from stratalog.broker.server import BrokerServer
from stratalog.engine import Stream
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.client import KafkaConnection
from stratalog.kafka.records import encode_batch
from waiting import WAIT_S

#: Kafka's bound on an idempotent producer's requests in flight, and the batches the broker remembers per
#: producer and partition for it (producers.BATCHES_KEPT).
PIPELINE_DEPTH = 5
NONE, OUT_OF_ORDER_SEQUENCE_NUMBER = 0, 45
PRODUCE_VERSION = 3


def batch(producer_id: int, epoch: int, sequence: int) -> bytes:
    """One record ``v<sequence>``, as an idempotent producer's batch at ``sequence``."""
    return encode_batch([(None, f"v{sequence}".encode(), (), 1_000)], base_offset=0, producer_id=producer_id,
                        producer_epoch=epoch, base_sequence=sequence)


def produce(topic: str, records: bytes) -> tuple[int, int, Any]:
    """A Produce request (acks=all) of one batch into partition 0, for ``call_pipelined``."""
    return ApiKey.PRODUCE, PRODUCE_VERSION, ProduceRequest(
        acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)), topic_data=(
            TopicProduceData(name=TopicName(topic), partition_data=(
                PartitionProduceData(index=i32(0), records=records),)),))


def answers(responses: list[Any]) -> list[tuple[int, int]]:
    """(error code, base offset) of each Produce response, in the order they came."""
    out = []
    for response in responses:
        answer = response.responses[0].partition_responses[0]
        out.append((int(answer.error_code), int(answer.base_offset)))
    return out


# Against `stratalog serve` ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path_factory.mktemp("pipeline") / "data") as b:
        yield b


def create_topic(broker: BrokerProcess, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=WAIT_S).values():
        future.result(WAIT_S)


def test_a_pipeline_lands_in_order_and_the_same_pipeline_again_lands_nowhere(broker: BrokerProcess) -> None:
    create_topic(broker, "pipelined")
    with KafkaConnection(broker.bootstrap, {}, client_id="pipeline") as connection:
        producer_id, epoch = init_producer_id(connection)
        pipeline = [produce("pipelined", batch(producer_id, epoch, s)) for s in range(PIPELINE_DEPTH)]
        first = answers(connection.call_pipelined(pipeline))
        # Every answer lost (a connection that broke): the producer sends the whole pipeline again.
        again = answers(connection.call_pipelined(pipeline))
        log = partition_log(connection, "pipelined", 0)
    assert first == [(NONE, s) for s in range(PIPELINE_DEPTH)]
    assert again == first, "each retry gets its batch's first offset"
    assert log == [(s, f"{producer_id}/{epoch}/{s}", f"v{s}".encode()) for s in range(PIPELINE_DEPTH)]


def test_a_gap_within_a_pipeline_is_refused_and_the_batches_before_it_land(broker: BrokerProcess) -> None:
    create_topic(broker, "gapped")
    with KafkaConnection(broker.bootstrap, {}, client_id="pipeline") as connection:
        producer_id, epoch = init_producer_id(connection)
        got = answers(connection.call_pipelined([produce("gapped", batch(producer_id, epoch, s)) for s in (0, 1, 3)]))
        log = partition_log(connection, "gapped", 0)
    assert got == [(NONE, 0), (NONE, 1), (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)]
    assert [value for _, _, value in log] == [b"v0", b"v1"]


# In-process, durability held back -------------------------------------------------------------------


class HeldDurability:
    """Every append goes into the store at once, and its durability is withheld from the broker until
    ``release``: what the broker did before that, it did before any of the appends was durable."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, expected: int) -> None:
        self.held: list[tuple[Future[int], Future[int]]] = []
        #: Set once ``expected`` appends have reached the store.
        self.all_reached = asyncio.Event()
        engine_append = Stream.append_kafka

        def append_kafka(stream: Stream, kafka_batch: Any, count: int, max_timestamp_ms: int, *,
                         wait_s_max: float | None = None) -> Future[int]:
            engine = engine_append(stream, kafka_batch, count, max_timestamp_ms, wait_s_max=wait_s_max)
            withheld: Future[int] = Future()
            self.held.append((engine, withheld))
            if len(self.held) == expected:
                self.all_reached.set()
            return withheld

        monkeypatch.setattr(Stream, "append_kafka", append_kafka)

    def release(self) -> None:
        for engine, withheld in self.held:
            engine.add_done_callback(lambda done, out=withheld: _copy(done, out))


def _copy(source: Future[int], target: Future[int]) -> None:
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


def test_a_pipeline_is_appended_before_any_of_it_is_durable_and_answered_in_order(
        loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five batches of one producer, and the third once more while it is in flight (a retry): all five
    reach the store while none is durable, so the broker waits for no batch's durability before it
    appends the next; then the six answers come in order, the retry with the third's offset."""
    held = HeldDurability(monkeypatch, expected=PIPELINE_DEPTH)
    config = BrokerConfig(listeners=(Listener.parse("PLAINTEXT://127.0.0.1:0"),))
    broker = loop.run_until_complete(_open(tmp_path / "data", config))
    server = BrokerServer(broker)
    try:
        port = loop.run_until_complete(server.start())[0].port
        broker.create_topic("t", 1, {})
        pipeline = [produce("t", batch(7, 0, s)) for s in (*range(PIPELINE_DEPTH), 2)]
        responses: Future[list[Any]] = Future()
        client = threading.Thread(target=_send, args=(f"127.0.0.1:{port}", pipeline, responses), daemon=True)
        client.start()
        loop.run_until_complete(asyncio.wait_for(held.all_reached.wait(), WAIT_S))
        assert not responses.done(), "nothing is answered before it is durable"
        held.release()
        loop.run_until_complete(asyncio.wait_for(asyncio.wrap_future(responses), WAIT_S))
        client.join(WAIT_S)
        stream = broker.partition("t", 0)
        assert stream is not None
        # Off the loop: a read_committed read asks the loop which transactions are open.
        records = loop.run_until_complete(asyncio.to_thread(stream.fetch, 0))
        values = [record.value for record in records]
    finally:
        loop.run_until_complete(server.stop())
        loop.run_until_complete(broker.close())
    assert len(held.held) == PIPELINE_DEPTH, "the retry was not appended"
    assert answers(responses.result()) == [(NONE, s) for s in (*range(PIPELINE_DEPTH), 2)]
    assert values == [f"v{s}".encode() for s in range(PIPELINE_DEPTH)]


async def _open(data_dir: Path, config: BrokerConfig) -> Broker:
    return Broker.open(data_dir, config)


def _send(bootstrap: str, pipeline: list[tuple[int, int, Any]], responses: Future[list[Any]]) -> None:
    """The client's side, on a thread of its own: the broker's event loop runs on the test's."""
    try:
        with KafkaConnection(bootstrap, {}, client_id="pipeline") as connection:
            responses.set_result(connection.call_pipelined(pipeline))
    except BaseException as e:
        responses.set_exception(e)
