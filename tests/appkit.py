"""Stream-processing applications (tests/apps/) against a test's broker: the app as a child process that
the test kills with SIGKILL and starts again with its local state deleted, the keyed events it counts, and
what the broker holds of its work (the input offsets it committed, its output, its compacted changelog).

test_app_quixstreams.py and test_app_faust.py each run `count_through_kills` with their app; brokerkit.py
starts the broker.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from appvenv import APPS
from brokerkit import BrokerProcess, metrics_address, scrape_metrics
from waiting import WAIT_S, wait_progressing, wait_until

INPUT_TOPIC = "events"
#: Partitions of the input topic, as apps/faust_counter.py PARTITIONS (a faust table is partitioned as its input).
INPUT_PARTITIONS = 3
EVENTS = 20_000
KEYS = 200
#: The events go in these many batches; the app is killed after every second one (so twice), each batch
#: committed first. Two batches between kills give every key two changelog records, so a pass has work.
BATCHES = 6
BATCHES_PER_RUN = 2
#: The broker's cleaner and uploads at test speed (tests/test_broker_compaction.py), and group sessions
#: short enough that a killed app's partitions go to its next run within seconds.
BROKER_CONFIG = ("log_cleaner_interval_ms = 100\nproducer_snapshot_interval_ms = 200\n"
                 "transaction_abort_interval_ms = 200\n"
                 "[store]\nupload_interval_s = 0.2\n"
                 "[groups]\ngroup_min_session_timeout_ms = 1000\ngroup_initial_rebalance_delay_ms = 0\n")
#: The last lines of an app's log that a failure shows.
LOG_TAIL_LINES = 60


def broker_args(tmp_path: Path) -> tuple[str, ...]:
    """`stratalog serve` arguments: BROKER_CONFIG, and /metrics on an ephemeral port."""
    path = tmp_path / "broker.toml"
    path.write_text(BROKER_CONFIG)
    return "--config", str(path), "--metrics-listen", "127.0.0.1:0"


@dataclass
class AppProcess:
    """One app of tests/apps/, run as ``SCRIPT BOOTSTRAP STATE_DIR [ARGS]`` by ``python`` (its own environment's:
    appvenv.py), its output in ``log_path``. With ``ready_line``, a start returns once the app's log says
    it (the app has rebuilt its state and consumes its input)."""

    python: Path
    script: str
    bootstrap: str
    state_dir: Path
    log_path: Path
    ready_line: str | None = None
    #: Arguments after the state directory.
    args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    runs: int = 0
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        assert self.process is None, "already running"
        self.runs += 1
        self._log = self.log_path.open("ab")
        self._log.write(f"--- run {self.runs}\n".encode())
        self._log.flush()
        run_start_bytes = self._log.tell()
        argv = [str(self.python), str(APPS / self.script), self.bootstrap, str(self.state_dir), *self.args]
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if self.ready_line is not None:
            ready = self.ready_line.encode()

            def said_ready() -> bool:
                self.alive()
                with self.log_path.open("rb") as log:
                    log.seek(run_start_bytes)
                    return ready in log.read()

            wait_until(said_ready, lambda: f"the app to say {self.ready_line!r}:\n{self.log_tail()}", poll_s=0.1)

    def kill9(self) -> None:
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, the apps' clean stop; SIGKILL if it has not stopped after WAIT_S."""
        self._end(signal.SIGTERM)

    def _end(self, how: signal.Signals) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(how)
            try:
                process.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=WAIT_S)
        if self._log is not None:
            self._log.close()

    def alive(self) -> None:
        assert self.process is not None and self.process.poll() is None, f"the app exited:\n{self.log_tail()}"

    def log_tail(self) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-LOG_TAIL_LINES:])


def event_keys(seed: int) -> list[str]:
    """EVENTS keys drawn from KEYS, unevenly: key k with weight k % 10 + 1, so counts differ by key (from
    about 18 to 180) and every key comes up in every batch."""
    keys = [f"key-{k}" for k in range(KEYS)]
    return random.Random(seed).choices(keys, weights=[k % 10 + 1 for k in range(KEYS)], k=EVENTS)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions)]).values():
        future.result(WAIT_S)


def topic_config(bootstrap: str, topic: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(WAIT_S)
    return str(configs[name].value)


def produce(bootstrap: str, keys: Sequence[str]) -> None:
    """One event per key, acknowledged (idempotent, acks=all), to INPUT_TOPIC."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i, key in enumerate(keys):
        producer.produce(INPUT_TOPIC, key=key.encode(), value=json.dumps({"n": i}).encode())
        producer.poll(0)
    assert producer.flush(WAIT_S) == 0


def end_offsets(bootstrap: str, topic: str, isolation: str = "read_committed") -> dict[int, int]:
    """Each partition's end: its last stable offset read_committed (librdkafka's default), its high watermark
    read_uncommitted."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "appkit-offsets", "isolation.level": isolation})
    try:
        partitions = consumer.list_topics(topic, timeout=WAIT_S).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=WAIT_S)[1] for p in partitions}
    finally:
        consumer.close()


class Watermarks:
    """A topic's ends, summed over its partitions, read_committed (the last stable offsets) and
    read_uncommitted (the high watermarks), through two consumers kept open: a look is a ListOffsets round
    trip per partition, not a client's start (which takes seconds on a busy machine, long enough for a
    transaction to begin and end unseen)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self._consumers = {level: Consumer({"bootstrap.servers": bootstrap, "group.id": "appkit-watermarks",
                                            "isolation.level": level})
                           for level in ("read_committed", "read_uncommitted")}
        self._partitions: list[int] = []

    def ends(self) -> tuple[int, int]:
        """(sum of the last stable offsets, sum of the high watermarks); (0, 0) before the topic exists."""
        if not self._partitions:
            found = self._consumers["read_uncommitted"].list_topics(self.topic, timeout=WAIT_S).topics[self.topic]
            if found.error is not None:
                return 0, 0
            self._partitions = sorted(found.partitions)
        # The high watermarks first: records committed between the two looks then raise the stable offsets
        # past them, never make an open transaction appear where there is none.
        high, stable = (sum(self._consumers[level].get_watermark_offsets(TopicPartition(self.topic, p),
                                                                         timeout=WAIT_S)[1]
                            for p in self._partitions) for level in ("read_uncommitted", "read_committed"))
        return stable, high

    def open_records(self) -> int:
        """Records (and markers) past the last stable offsets: a transaction is open in the topic."""
        stable, high = self.ends()
        return high - stable

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()


def committed(bootstrap: str, group: str, partitions: Sequence[int]) -> dict[int, int]:
    """``group``'s committed offset of each partition of INPUT_TOPIC (-1001: none yet), without joining it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = consumer.committed([TopicPartition(INPUT_TOPIC, p) for p in partitions], timeout=WAIT_S)
        return {tp.partition: tp.offset for tp in got}
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Message]:
    """Every record of ``topic``, each partition from its start up to its end offset as of the call."""
    ends = end_offsets(bootstrap, topic, isolation)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "appkit-reader", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": isolation})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    pending = {p for p, end in ends.items() if end > 0}
    got: list[Message] = []
    try:
        def at_end() -> bool:
            message = consumer.poll(1.0)
            if message is None:
                return not pending
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
            elif message.offset() < ends[message.partition()]:
                got.append(message)
            # Compaction leaves gaps: a partition is read once the consumer's position reaches its end.
            position = consumer.position([TopicPartition(topic, message.partition())])[0].offset
            if position >= ends[message.partition()]:
                pending.discard(message.partition())
            return not pending
        wait_until(at_end, f"the records of {topic} up to {ends}", poll_s=0)
    finally:
        consumer.close()
    return got


def refused_requests(broker: BrokerProcess) -> list[str]:
    """The broker's log lines for requests of an API or version it does not serve (server.py)."""
    return [line for line in broker.output if "is not served" in line]


def cleaner_passes(broker: BrokerProcess) -> float:
    samples = scrape_metrics(metrics_address(broker.output))
    return sum(v for (name, _), v in samples.items() if name == "stratalog_cleaner_passes_total")


@dataclass(frozen=True)
class Changelog:
    """The app's changelog topic and how its records say a key's count (each framework has its own key
    format)."""

    topic: str
    decode: Callable[[bytes, bytes], tuple[str, int]]

    def latest(self, bootstrap: str) -> tuple[dict[str, int], int, int]:
        """The latest count of each key, the records read, and the offsets they span (the end offsets'
        sum: the log start stays 0, as nothing is deleted)."""
        records = read_topic(bootstrap, self.topic)
        latest: dict[str, int] = {}
        for message in records:
            key, value = message.key(), message.value()
            assert key is not None and value is not None, "the counters never delete a key"
            name, count = self.decode(key, value)
            latest[name] = count
        return latest, len(records), sum(end_offsets(bootstrap, self.topic).values())


def wait_committed(app: AppProcess, group: str, ends: dict[int, int]) -> None:
    """Until ``group`` committed every event produced so far: the app's checkpoint after its last one."""
    def done() -> bool:
        app.alive()
        return committed(app.bootstrap, group, list(ends)) == ends

    wait_progressing(done, lambda: committed(app.bootstrap, group, list(ends)),
                     lambda: f"{group} to commit {ends}; the app's log:\n{app.log_tail()}", poll_s=0.1)


def wait_compacted(broker: BrokerProcess, changelog: Changelog) -> None:
    """Until the broker's cleaner has run (its passes counted) and the changelog shows it: fewer records
    than the offsets they span, the superseded counts removed."""
    seen: list[object] = []

    def compacted() -> bool:
        _, records, span = changelog.latest(broker.bootstrap)
        passes = cleaner_passes(broker)
        seen[:] = [f"{records} records over {span} offsets, {passes:g} passes"]
        return passes > 0 and records < span

    wait_until(compacted, lambda: f"the cleaner to compact {changelog.topic}: {seen}", poll_s=0.2)


def count_through_kills(broker: BrokerProcess, app: AppProcess, group: str, changelog: Changelog,
                        output_topic: str) -> tuple[Counter[str], dict[str, list[int]], dict[str, int]]:
    """Feed the app EVENTS keyed events in BATCHES, killing it with SIGKILL after every BATCHES_PER_RUN
    (once they are committed and the changelog was compacted) and starting it again with its state
    directory deleted. What the events' true counts are, the running counts of each key in the output (in
    order), and the changelog's latest count of each key; the app is stopped."""
    create_topic(broker.bootstrap, INPUT_TOPIC, INPUT_PARTITIONS)
    keys = event_keys(seed=37)
    size = EVENTS // BATCHES
    batches = [keys[i * size:(i + 1) * size if i < BATCHES - 1 else EVENTS] for i in range(BATCHES)]
    try:
        for n, batch in enumerate(batches):
            if n % BATCHES_PER_RUN == 0:
                if n > 0:   # what the killed run kept locally goes: its next run has only the changelog
                    assert any(app.state_dir.rglob("*")), f"no local state in {app.state_dir}"
                    shutil.rmtree(app.state_dir)
                app.start()
            produce(broker.bootstrap, batch)
            wait_committed(app, group, end_offsets(broker.bootstrap, INPUT_TOPIC))
            if n % BATCHES_PER_RUN == BATCHES_PER_RUN - 1 and n < BATCHES - 1:
                wait_compacted(broker, changelog)
                app.kill9()
        latest, _, _ = changelog.latest(broker.bootstrap)
    finally:
        app.stop()
    running: dict[str, list[int]] = {}
    for message in read_topic(broker.bootstrap, output_topic):
        key, value = message.key(), message.value()
        assert key is not None and value is not None
        running.setdefault(key.decode(), []).append(int(json.loads(value)))
    return Counter(keys), running, latest
