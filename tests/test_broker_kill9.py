"""kill -9 of the broker under load from idempotent producers: every acknowledged record once, in order.

Two librdkafka producers (idempotent, acks=all) write numbered records to a 2-partition topic while the
broker is killed with SIGKILL and restarted on the same port, again and again. The producers retry what
was not acknowledged across each restart. Afterwards a consumer reads both partitions: every record a
producer saw acknowledged must be there exactly once, records of one producer in one partition in the
order it sent them, and a group's committed offsets intact.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import BrokerProcess, start_broker

#: Kills in the suite (the issue asks for at least 20; `stratalog chaos broker` runs more).
KILLS = 20
#: How long the producers run between a restart and the next kill.
RUN_BEFORE_KILL_S = (0.3, 0.8)
TOPIC = "kill9"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NumberedProducer:
    """Sends ``p<id>-<n>`` keys in order from a thread; remembers which were acknowledged."""

    def __init__(self, producer_id: int, bootstrap: str) -> None:
        self.producer_id = producer_id
        self.acked: list[tuple[int, int, int]] = []  # (n, partition, offset)
        self.failed: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                   "linger.ms": 2, "message.timeout.ms": 300_000, "retry.backoff.ms": 50,
                                   "reconnect.backoff.max.ms": 200, "log_level": 0})
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _on_delivery(self, err: KafkaError | None, msg: object) -> None:
        key = msg.key().decode()  # type: ignore[attr-defined]
        n = int(key.split("-")[1])
        if err is not None:
            self.failed.append(f"{key}: {err}")
        else:
            self.acked.append((n, msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    def _run(self) -> None:
        while not self._stop.is_set():
            key = f"p{self.producer_id}-{self.sent}"
            try:
                self._producer.produce(TOPIC, key=key.encode(), value=key.encode() * 4,
                                       partition=self.sent % 2, on_delivery=self._on_delivery)
            except BufferError:
                self._producer.poll(0.05)
                continue
            self.sent += 1
            self._producer.poll(0)
            if self.sent % 64 == 0:
                time.sleep(0.002)  # about 10-20 k records a second each: load, not a flood

    def finish(self) -> None:
        self._stop.set()
        self._thread.join()
        left = self._producer.flush(120)
        assert left == 0, f"producer {self.producer_id}: {left} records never acknowledged"


@pytest.mark.slow
def test_kill9_under_idempotent_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    broker: BrokerProcess = start_broker(data_dir, port=port)
    rng = random.Random(23)
    producers: list[NumberedProducer] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)
        committer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kept",
                              "enable.auto.commit": False})
        committer.commit(offsets=[TopicPartition(TOPIC, 0, 7), TopicPartition(TOPIC, 1, 3)], asynchronous=False)
        committer.close()
        producers = [NumberedProducer(i, broker.bootstrap) for i in range(2)]
        for p in producers:
            p.start()
        for _ in range(KILLS):
            before = sum(len(p.acked) for p in producers)
            deadline = time.monotonic() + rng.uniform(*RUN_BEFORE_KILL_S)
            while time.monotonic() < deadline or sum(len(p.acked) for p in producers) == before:
                time.sleep(0.02)  # the kill comes at a random moment after some acknowledgements
            broker.kill9()
            broker = start_broker(data_dir, port=port)
        for p in producers:
            p.finish()
        check_and_stop(broker, producers)
    finally:
        for p in producers:
            p._stop.set()
        if broker.process.poll() is None:
            broker.process.kill()
            broker.process.wait(30)


def check_and_stop(broker: BrokerProcess, producers: list[NumberedProducer]) -> None:
    try:
        for p in producers:
            assert not p.failed, p.failed[:5]
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kept",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        committed = consumer.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=30)
        assert [tp.offset for tp in committed] == [7, 3], "committed offsets survive every kill"
        consumer.assign([TopicPartition(TOPIC, 0, 0), TopicPartition(TOPIC, 1, 0)])
        expected = sum(p.sent for p in producers)
        seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
        records = 0
        idle_since = time.monotonic()
        while records < expected and time.monotonic() - idle_since < 30:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            idle_since = time.monotonic()
            records += 1
            key = msg.key().decode()
            seen[key].append((msg.partition(), msg.offset()))
        consumer.close()
        duplicates = {k: v for k, v in seen.items() if len(v) > 1}
        assert not duplicates, f"{len(duplicates)} records stored twice, e.g. {list(duplicates.items())[:3]}"
        for p in producers:
            missing = [n for n, _, _ in p.acked if f"p{p.producer_id}-{n}" not in seen]
            assert not missing, f"producer {p.producer_id}: {len(missing)} acknowledged records lost"
            for partition in (0, 1):
                order = sorted((seen[f"p{p.producer_id}-{n}"][0][1], n) for n in range(p.sent)
                               if n % 2 == partition and f"p{p.producer_id}-{n}" in seen)
                numbers = [n for _, n in order]
                assert numbers == sorted(numbers), f"producer {p.producer_id} partition {partition} out of order"
            for n, partition, offset in p.acked:
                assert seen[f"p{p.producer_id}-{n}"][0] == (partition, offset), "the acknowledged offset holds it"
        assert sum(len(p.acked) for p in producers) == sum(p.sent for p in producers)
    finally:
        assert broker.stop() == 0
