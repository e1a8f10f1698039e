"""kill -9 of the broker under load from idempotent Kafka producers, and what survived.

Producers (librdkafka, idempotent, acks=all, in this process) write numbered records to a topic while
the broker, a child process, is killed with SIGKILL at random moments and restarted on the same port;
the producers retry what was not acknowledged across each restart. A consumer group's offsets are
committed before the first kill. At the end every producer flushes, and a consumer reads the whole
topic. Promises checked, each a count that must be zero:

| count                     | the promise                                                          |
|---------------------------|----------------------------------------------------------------------|
| acknowledged_lost         | a record whose produce was acknowledged is in the topic               |
| duplicates                | no record is stored twice (idempotence across restarts)               |
| offset_mismatches         | a record sits at the offset its acknowledgement gave                  |
| out_of_order              | one producer's records in one partition are in the order it sent them |
| delivery_failures         | no produce fails for good (the producer retries across restarts)      |
| committed_offsets_lost    | the group's committed offsets are as committed                       |
| unaccounted               | every record sent is acknowledged once the producers flushed          |
| stalled                   | the producers get acknowledgements again after each restart           |
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from stratalog.chaos.broker_process import BrokerProcess, start_broker
from stratalog.chaos.harness import ChaosHarnessError, MustBeZeroFigures

TOPIC = "chaos"
#: Offsets committed for the group "kept" before the first kill, per partition.
COMMITTED = (7, 3)
#: A record is sent every this many microseconds per producer, about: load, not a flood.
_SEND_PAUSE_EVERY = 64
_SEND_PAUSE_S = 0.002
#: How long a consumer may see nothing before the read-back gives up.
READ_IDLE_S_MAX = 30.0
#: How long the producers may go without an acknowledgement after a restart (a restart takes ~1 s).
ACK_WAIT_S_MAX = 60.0
#: How long the producers may take to have everything acknowledged at the end.
FLUSH_WAIT_S_MAX = 60.0
MUST_BE_ZERO = ("acknowledged_lost", "duplicates", "offset_mismatches", "out_of_order", "delivery_failures",
                "committed_offsets_lost", "unaccounted", "stalled")


@dataclass(frozen=True, slots=True)
class BrokerChaosConfig:
    iterations: int = 50
    seed: int = 0
    producers: int = 2
    partitions: int = 2
    kill_after_s_min: float = 0.3
    kill_after_s_max: float = 0.8


@dataclass(frozen=True, slots=True)
class IterationFigures:
    index: int
    records_acknowledged: int
    restart_ms: float
    failures: int = 0


@dataclass(frozen=True, slots=True)
class BrokerChaosFigures(MustBeZeroFigures):
    iterations: int
    records_sent: int
    records_acknowledged: int
    records_read: int
    restart_ms_mean: float
    restart_ms_max: float
    elapsed_s: float
    acknowledged_lost: int
    duplicates: int
    offset_mismatches: int
    out_of_order: int
    delivery_failures: int
    committed_offsets_lost: int
    unaccounted: int
    #: 1 when the producers got no acknowledgement for ACK_WAIT_S_MAX after a restart (the run stopped there).
    stalled: int

    must_be_zero: ClassVar[tuple[str, ...]] = MUST_BE_ZERO


class NumberedProducer:
    """Sends keys ``p<id>-<n>`` in order from a thread, round robin over the partitions; keeps what was
    acknowledged where."""

    def __init__(self, producer_id: int, bootstrap: str, partitions: int) -> None:
        from confluent_kafka import Producer

        self.producer_id = producer_id
        self.partitions = partitions
        self.acked: dict[int, tuple[int, int]] = {}  # n -> (partition, offset)
        self.failed: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        #: A fatal error (an idempotence violation): the producer is unusable from then on.
        self.fatal: str | None = None
        self._producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                   "linger.ms": 2, "message.timeout.ms": 300_000, "retry.backoff.ms": 50,
                                   "reconnect.backoff.max.ms": 200, "log_level": 0,
                                   "error_cb": self._on_error})
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"chaos-producer-{producer_id}")

    def key(self, n: int) -> str:
        return f"p{self.producer_id}-{n}"

    def start(self) -> None:
        self._thread.start()

    def _on_delivery(self, err: Any, msg: Any) -> None:
        n = int(msg.key().decode().split("-")[1])
        if err is not None:
            self.failed.append(f"{msg.key().decode()}: {err}")
        else:
            self.acked[n] = (msg.partition(), msg.offset())

    def _on_error(self, err: Any) -> None:
        if err.fatal() and self.fatal is None:
            self.fatal = str(err)
            self.failed.append(f"fatal: {err}")

    def _run(self) -> None:
        from confluent_kafka import KafkaException

        while not self._stop.is_set() and self.fatal is None:
            key = self.key(self.sent)
            try:
                self._producer.produce(TOPIC, key=key.encode(), value=key.encode() * 4,
                                       partition=self.sent % self.partitions, on_delivery=self._on_delivery)
            except BufferError:
                self._producer.poll(0.05)
                continue
            except KafkaException as e:
                # A fatal producer error (an idempotence violation: a sequence the broker lost track of).
                self.failed.append(f"{key}: {e}")
                return
            self.sent += 1
            self._producer.poll(0)
            if self.sent % _SEND_PAUSE_EVERY == 0:
                time.sleep(_SEND_PAUSE_S)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def finish(self, timeout_s: float) -> int:
        """Stop sending and wait for every acknowledgement; return how many never came."""
        from confluent_kafka import KafkaException

        self.stop()
        # Polled, not flush(): after a fatal error librdkafka's flush raises an object Python cannot catch.
        deadline = time.monotonic() + timeout_s
        while len(self._producer) and self.fatal is None and time.monotonic() < deadline:
            try:
                self._producer.poll(0.1)
            except KafkaException as e:  # the fatal error, raised here before error_cb saw it
                self._on_error(e.args[0])
        # After a fatal error (counted in failed) what the producer holds is lost.
        return len(self._producer)


def run_broker_chaos(data_dir: Path, config: BrokerChaosConfig,
                     on_iteration: Callable[[IterationFigures], None] = lambda _: None) -> BrokerChaosFigures:
    try:
        from confluent_kafka import Consumer, TopicPartition

        # NewTopic lives in confluent_kafka.admin, whose type stubs leave it out of __all__.
        from confluent_kafka.admin import AdminClient, NewTopic
    except ImportError as e:  # pragma: no cover - the bench and test extras install it
        raise ChaosHarnessError("the broker harness drives librdkafka: pip install confluent-kafka") from e
    started = time.monotonic()
    rng = random.Random(config.seed)
    broker: BrokerProcess = start_broker(data_dir)
    port = broker.port   # the system's pick; every restart comes back there, where the clients reconnect
    producers: list[NumberedProducer] = []
    restarts_ms: list[float] = []
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, config.partitions, 1)])[TOPIC].result(30)
        committer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kept", "enable.auto.commit": False})
        committer.commit(offsets=[TopicPartition(TOPIC, p, COMMITTED[p % 2]) for p in range(config.partitions)],
                         asynchronous=False)
        committer.close()
        producers = [NumberedProducer(i, broker.bootstrap, config.partitions) for i in range(config.producers)]
        for p in producers:
            p.start()
        stalled = 0
        for index in range(config.iterations):
            before = sum(len(p.acked) for p in producers)
            started_s = time.monotonic()
            deadline = started_s + rng.uniform(config.kill_after_s_min, config.kill_after_s_max)
            while time.monotonic() < deadline or sum(len(p.acked) for p in producers) == before:
                if time.monotonic() - started_s > ACK_WAIT_S_MAX:
                    stalled = 1  # the producers stopped getting acknowledgements: no use killing on
                    break
                time.sleep(0.01)  # the kill comes at a random moment, after some acknowledgements
            if stalled:
                break
            broker.kill9()
            broker.close_output()  # the killed broker's pipe, closed here rather than whenever it is collected
            t0 = time.monotonic()
            broker = start_broker(data_dir, port=port)
            restarts_ms.append(1000 * (time.monotonic() - t0))
            on_iteration(IterationFigures(index, sum(len(p.acked) for p in producers) - before, restarts_ms[-1]))
        unaccounted = sum(p.finish(FLUSH_WAIT_S_MAX) for p in producers)
        figures = _check(broker, producers, config, unaccounted, restarts_ms, started, stalled)
        if broker.stop() != 0:
            raise ChaosHarnessError("the broker did not stop cleanly after the run:\n" + "".join(broker.output[-20:]))
        return figures
    finally:
        for p in producers:
            p.stop()
        if broker.process.poll() is None:
            broker.process.kill()
            broker.process.wait(30)
        broker.close_output()


def _check(broker: BrokerProcess, producers: list[NumberedProducer], config: BrokerChaosConfig, unaccounted: int,
           restarts_ms: list[float], started: float, stalled: int) -> BrokerChaosFigures:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kept", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    partitions = [TopicPartition(TOPIC, p) for p in range(config.partitions)]
    committed = [tp.offset for tp in consumer.committed(partitions, timeout=30)]
    committed_lost = sum(c != COMMITTED[p % 2] for p, c in enumerate(committed))
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(config.partitions)])
    seen: dict[str, list[tuple[int, int]]] = {}
    expected = sum(p.sent for p in producers)
    read = 0
    idle_since = time.monotonic()
    while read < expected and time.monotonic() - idle_since < READ_IDLE_S_MAX:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        idle_since = time.monotonic()
        read += 1
        key, partition, offset = msg.key(), msg.partition(), msg.offset()
        assert key is not None and partition is not None and offset is not None
        seen.setdefault(key.decode(), []).append((partition, offset))
    consumer.close()
    lost = mismatched = disordered = 0
    for p in producers:
        for n, where in p.acked.items():
            places = seen.get(p.key(n))
            if not places:
                lost += 1
            elif places[0] != where:
                mismatched += 1
        for partition in range(config.partitions):
            offsets = [seen[p.key(n)][0][1] for n in range(partition, p.sent, config.partitions) if p.key(n) in seen]
            disordered += sum(a > b for a, b in itertools.pairwise(offsets))
    return BrokerChaosFigures(
        iterations=config.iterations, records_sent=expected,
        records_acknowledged=sum(len(p.acked) for p in producers), records_read=read,
        restart_ms_mean=sum(restarts_ms) / max(1, len(restarts_ms)), restart_ms_max=max(restarts_ms, default=0.0),
        elapsed_s=time.monotonic() - started, acknowledged_lost=lost,
        duplicates=sum(len(v) - 1 for v in seen.values()), offset_mismatches=mismatched, out_of_order=disordered,
        delivery_failures=sum(len(p.failed) for p in producers), committed_offsets_lost=committed_lost,
        unaccounted=unaccounted, stalled=stalled)
