"""Load on a cluster from real Kafka clients, and what it left: two idempotent producers (confluent-kafka
in a thread, kafka-python in a child process, both acks=all) writing ``<producer>:<partition>:<seq>`` to
every partition in rounds, one consumer of a group reading and committing, and the read-back of the
whole log and of the group's committed offsets."""

from __future__ import annotations

import functools
import itertools
import logging
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stratalog.chaos.harness import ChaosHarnessError

#: The producers' two names, the first part of every value.
CONFLUENT, KAFKA_PYTHON = "c", "k"
#: How long the producers may take to have everything answered once stopped (retries across a failover).
FLUSH_S_MAX = 150.0
#: The group's consumer commits after this many records.
COMMIT_EVERY_RECORDS = 100
#: A commit of the group's consumer without an answer for this long is noted, with the client's last lines
#: (librdkafka retries a commit across a coordinator's move within a few seconds; a sync commit once waited
#: 306 s, with no line from the client, which logs only while it is polled).
COMMIT_ANSWER_S_MAX = 60.0
#: How long the consumer waits for its last commit's answer before it closes.
LAST_COMMIT_S_MAX = 60.0
#: How long a read of the whole log may take.
READ_S_MAX = 300.0
#: The group consumer's last librdkafka lines (its group protocol: cgrp) kept, to say where it stood when
#: a wait for it runs out.
GROUP_LOG_LINES = 60


def wait_for(ready: Callable[[], Any], what: str, timeout_s: float, poll_s: float = 0.1) -> Any:
    """``ready()``'s first truthy value, asked every ``poll_s``; ChaosHarnessError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ChaosHarnessError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(poll_s)


def _fields(message: Any) -> tuple[int, int, bytes]:
    """A consumed record's partition, offset and value (each set on a record without an error)."""
    partition, offset, value = message.partition(), message.offset(), message.value()
    assert partition is not None and offset is not None and value is not None
    return partition, offset, value


class Load:
    """Two idempotent producers writing ``<producer>:<partition>:<seq>`` in rounds until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, round_s: float) -> None:
        from confluent_kafka import Producer

        self.topic, self.partitions, self.round_s = topic, partitions, round_s
        self.acked: dict[str, set[tuple[int, int]]] = {CONFLUENT: set(), KAFKA_PYTHON: set()}
        self.failed: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._confluent = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                    "linger.ms": 5, "message.timeout.ms": 120_000, "log_level": 0})
        self._kafka_python = subprocess.Popen(
            [sys.executable, "-W", "ignore", "-m", "stratalog.chaos.kafka_python_load", bootstrap, topic,
             str(partitions), str(round_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._threads = [threading.Thread(target=self._run_confluent, daemon=True),
                         threading.Thread(target=self._run_kafka_python, daemon=True)]
        for thread in self._threads:
            thread.start()

    def acked_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.acked.values())

    def acked_values(self) -> set[bytes]:
        with self._lock:
            return {f"{producer}:{p}:{seq}".encode() for producer, pairs in self.acked.items() for p, seq in pairs}

    def _acked(self, producer: str, partition: int, seq: int) -> None:
        with self._lock:
            self.acked[producer].add((partition, seq))

    def _failed(self, what: str) -> None:
        with self._lock:
            self.failed.append(what)

    def _run_confluent(self) -> None:
        from confluent_kafka import KafkaException

        fatal: list[str] = []

        def delivered(error: Any, message: object, partition: int, seq: int) -> None:
            if error is None:
                self._acked(CONFLUENT, partition, seq)
            else:
                self._failed(f"confluent {partition}:{seq}: {error}")
                if error.fatal():
                    fatal.append(str(error))

        for seq in itertools.count():
            if self._stop.wait(self.round_s) or fatal:
                break
            try:
                for p in range(self.partitions):
                    self._confluent.produce(self.topic, value=f"{CONFLUENT}:{p}:{seq}".encode(), partition=p,
                                            on_delivery=functools.partial(delivered, partition=p, seq=seq))
            except KafkaException as e:
                fatal.append(str(e.args[0]))
                break
            self._confluent.poll(0)
        if fatal:
            # A fatal error (an idempotent producer's sequence refused) ends the producer: it takes no more
            # records, and confluent-kafka 2.16's flush of it raises a SystemError out of its callbacks.
            self._failed(f"confluent: the producer failed for good: {fatal[0]}")
            return
        remaining = self._confluent.flush(FLUSH_S_MAX)
        if remaining:
            self._failed(f"confluent: {remaining} records never answered")

    def _run_kafka_python(self) -> None:
        assert self._kafka_python.stdout is not None
        for line in self._kafka_python.stdout:
            word, *rest = line.split(maxsplit=3)
            if word == "ack":
                self._acked(KAFKA_PYTHON, int(rest[0]), int(rest[1]))
            elif word == "fail":
                self._failed(f"kafka-python {' '.join(rest)}")
            elif word == "done":
                return
        self._failed(f"kafka-python's process ended early ({self._kafka_python.wait()})")

    def stop(self) -> None:
        """Stop sending and wait until every record sent is answered (acknowledged or failed)."""
        self._stop.set()
        assert self._kafka_python.stdin is not None
        self._kafka_python.stdin.write("stop\n")
        self._kafka_python.stdin.close()
        for thread in self._threads:
            thread.join(timeout=FLUSH_S_MAX + 60)
            if thread.is_alive():
                raise ChaosHarnessError("a producer did not finish")
        status = self._kafka_python.wait(timeout=60)
        if status != 0:
            self._failed(f"kafka-python's process exited with {status}")
        assert self._kafka_python.stdout is not None
        self._kafka_python.stdout.close()

    def kill(self) -> None:
        """At the end, whatever happened: no child left behind."""
        self._stop.set()
        if self._kafka_python.poll() is None:
            self._kafka_python.kill()
            self._kafka_python.wait(timeout=30)


class _Recent(logging.Handler):
    """A logger's last lines, kept in a bounded deque."""

    def __init__(self, lines: deque[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{time.strftime('%H:%M:%S')} {record.getMessage()}")


class GroupReader:
    """One consumer of a group in a thread of its own: what it reads, committed every
    COMMIT_EVERY_RECORDS records. A commit is asked for asynchronously and its answer taken by the polls
    that go on reading, one commit at a time (two in flight could land out of order and take the group's
    offsets back): a commit the client never answers does not stop the reading, it is counted and noted
    with the client's lines about the group, which reach Python only while the client is polled.
    :meth:`describe` says what it is doing and how long it has been at it, with those lines."""

    _count = itertools.count()

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        from confluent_kafka import Consumer

        self.read: list[tuple[int, int, bytes]] = []          # partition, offset, value
        self.commit_errors = 0
        #: Commits without an answer after COMMIT_ANSWER_S_MAX, and what the client said meanwhile.
        self.commits_unanswered = 0
        self.notes: list[str] = []
        #: When the commit in flight was asked for (None: none is), and whether it was noted unanswered.
        self._commit_asked: float | None = None
        self._unanswered_noted = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._doing = ("starting", time.monotonic())
        self._log: deque[str] = deque(maxlen=GROUP_LOG_LINES)
        logger = logging.getLogger(f"stratalog.chaos.group-reader.{next(self._count)}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        logger.addHandler(_Recent(self._log))
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                   "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                   "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                                   "debug": "cgrp", "logger": logger, "on_commit": self._answered})
        self._consumer.subscribe([topic])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read_count(self) -> int:
        with self._lock:
            return len(self.read)

    def _answered(self, error: Any, _partitions: Any) -> None:
        """librdkafka's answer to the commit in flight (called from a poll)."""
        if error is not None:
            self.commit_errors += 1   # the coordinator moved, or nothing was read yet: the next commit goes on
        self._commit_asked = None

    def _run(self) -> None:
        since_commit = 0
        while not self._stop.is_set():
            self._doing = ("polling", time.monotonic())
            since_commit += self._take(self._consumer.poll(0.2))
            self._note_unanswered()
            if since_commit >= COMMIT_EVERY_RECORDS and self._commit_asked is None:
                self._commit()
                since_commit = 0
        self._doing = ("committing before it closes", time.monotonic())
        until = time.monotonic() + LAST_COMMIT_S_MAX
        last_asked = False
        while time.monotonic() < until:   # the commit in flight answered, then the last one
            if self._commit_asked is None:
                if last_asked:
                    break
                self._commit()
                last_asked = True
            self._take(self._consumer.poll(0.2))
        self._note_unanswered(ended=True)
        self._doing = ("closing", time.monotonic())
        self._consumer.close()
        self._doing = ("closed", time.monotonic())

    def _take(self, message: Any) -> int:
        """Keep a record read (1), or nothing (0)."""
        if message is None or message.error() is not None:
            return 0
        with self._lock:
            self.read.append(_fields(message))
        return 1

    def _commit(self) -> None:
        from confluent_kafka import KafkaException

        try:
            self._consumer.commit(asynchronous=True)
        except KafkaException:
            self.commit_errors += 1
            return
        self._commit_asked, self._unanswered_noted = time.monotonic(), False

    def _note_unanswered(self, ended: bool = False) -> None:
        """Count and note the commit in flight once it has waited COMMIT_ANSWER_S_MAX (or the reader ended)."""
        asked = self._commit_asked
        if asked is None or self._unanswered_noted:
            return
        waited_s = time.monotonic() - asked
        if waited_s < COMMIT_ANSWER_S_MAX and not ended:
            return
        self._unanswered_noted = True
        self.commits_unanswered += 1
        lines = "\n".join(self._log)
        self.notes.append(f"{time.strftime('%H:%M:%S')} a commit of the group's consumer had no answer after "
                          f"{waited_s:.1f} s; the client's last lines:\n{lines}")

    def values(self) -> set[bytes]:
        with self._lock:
            return {v for _, _, v in self.read}

    def describe(self) -> str:
        """What the consumer is doing and since when, its commit errors, and its last lines about the group."""
        doing, since = self._doing
        lines = "\n".join(self._log)
        return (f"the group's consumer has been {doing} for {time.monotonic() - since:.1f} s, read "
                f"{self.read_count()} records, met {self.commit_errors} commit errors and "
                f"{self.commits_unanswered} commits without an answer; its last lines:\n{lines}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        if self._thread.is_alive():
            raise ChaosHarnessError(f"the group's consumer did not stop: {self.describe()}")


def read_log(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """Every partition read from offset 0 to its end, outside any group: value ``i`` of a partition's list
    is the record at offset ``i``. A read that skips an offset or reads one twice raises ChaosHarnessError (the
    log of a topic without transactions has no gaps, and a consumer never goes back by itself)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "log-reader", "enable.auto.commit": False,
                         "log_level": 0})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        log: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        positions = {p: 0 for p in range(partitions)}

        def done() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                partition, offset, value = _fields(message)
                if offset != positions[partition]:
                    raise ChaosHarnessError(f"partition {partition}: read offset {offset} where "
                                            f"{positions[partition]} was next")
                log[partition].append(value)
                positions[partition] = offset + 1
            return all(positions[p] >= ends[p] for p in range(partitions))

        wait_for(done, f"the log read to its end ({positions} of {ends})", READ_S_MAX, poll_s=0)
        return log
    finally:
        consumer.close()


@dataclass(frozen=True, slots=True)
class LogAccount:
    """What the log holds against what the producers were told: the counts a cluster run must keep at
    zero (``lost``, ``log_duplicates``, ``out_of_order``) and the rest."""

    acknowledged: int
    in_log: int
    #: In the log but never acknowledged (sent, then the answer was lost with a broker): allowed.
    unacknowledged_in_log: int
    lost: int
    log_duplicates: int
    #: Pairs of one producer's records in one partition whose sequence numbers go backwards.
    out_of_order: int


def account(acked: set[bytes], log: dict[int, list[bytes]]) -> LogAccount:
    """Count ``log`` (read_log's) against the values ``acked``."""
    in_log = Counter(v for values in log.values() for v in values)
    out_of_order = 0
    for values in log.values():
        for producer in (CONFLUENT, KAFKA_PYTHON):
            prefix = f"{producer}:".encode()
            seqs = [int(v.split(b":")[2]) for v in values if v.startswith(prefix)]
            out_of_order += sum(a > b for a, b in itertools.pairwise(seqs))
    return LogAccount(acknowledged=len(acked), in_log=sum(in_log.values()),
                      unacknowledged_in_log=len(set(in_log) - acked), lost=len(acked - set(in_log)),
                      log_duplicates=sum(n - 1 for n in in_log.values() if n > 1), out_of_order=out_of_order)


def committed(bootstrap: str, topic: str, partitions: int, group: str) -> dict[int, int]:
    """The group's committed offset of each partition (-1001: none yet)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "log_level": 0})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}
