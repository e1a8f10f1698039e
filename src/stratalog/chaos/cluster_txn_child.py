"""The two transactional producers of a cluster chaos run (``cluster_txn_load.py`` starts and watches
them), each a child process that says what it does on stdout, one line per step, and what librdkafka
logs on stderr:

- ``loop``: librdkafka's consume-transform-produce loop. A read_committed consumer of the group LOOP_GROUP
  reads SOURCE; each batch goes into SINK as ``o:<partition>:<offset>:<value>`` in one transaction that
  also commits the group's offsets (send_offsets_to_transaction). After a failure it aborts (or starts a
  new producer, whose init_transactions fences the old one and ends what it left open) and goes back to
  the group's committed offsets. Lines: ``consume``, ``write N``, ``offsets``, ``commit``,
  ``committed P:END ...``, ``failed WHY``, ``recovered aborted|renewed``, ``rewound P:OFFSET ...``, and
  ``reread P LAST OFFSET`` where it reads a partition again from OFFSET (having read up to LAST) without
  a rewind of its own: a rebalance or a reset of the client's position, reported beside any input it
  writes twice.
- ``aborter``: a record ``a:<txn>:<partition>`` into every partition of SINK per transaction, numbered
  from FIRST_TXN, every ABORT_EVERY-th aborted on purpose. Lines: ``begin T``, ``commit T``,
  ``committed T``, ``abort T``, ``aborted T``, ``failed T WHY``, ``recovered ...``.

Both print ``init`` before each init_transactions, ``gave-up WHY`` (and exit 3) when no producer can be
initialised, and ``done`` once a ``stop`` line (or the end of stdin) has stopped them. Child processes,
so that a call librdkafka never returns from can be ended with its process: send_offsets_to_transaction
ignores its timeout (librdkafka issue 5456) and waits for good for a group coordinator that a Metadata
answer without it decommissioned (issue 5511), which a broker dead for longer than a failover is.

Usage: python -m stratalog.chaos.cluster_txn_child loop BOOTSTRAP SOURCE SINK
       python -m stratalog.chaos.cluster_txn_child aborter BOOTSTRAP SINK PARTITIONS FIRST_TXN

confluent_kafka is imported where it is used: the harness imports this module for its names alone.
"""

from __future__ import annotations

import itertools
import sys
import threading
from typing import Any

LOOP_GROUP = "chaos-txn-loop"
LOOP_TXN_ID, ABORTER_TXN_ID = "chaos-txn-loop", "chaos-txn-aborter"
LOOP_PREFIX, ABORTER_PREFIX = b"o", b"a"
#: Every ABORT_EVERY-th of the aborter's transactions is aborted on purpose, the others committed: several
#: aborted ranges in every partition between two kills, at the aborter's pace.
ABORT_EVERY = 3
#: The aborter's pause between transactions: a few a second, each with a record in every partition (so
#: markers from every broker), little beside the loop's load.
ABORTER_PAUSE_S = 0.2
#: Records one loop transaction takes from the input at most (a backlog after a failover goes in a few).
PER_TXN_MAX = 2_000
#: How long the loop's consumer waits for a batch before it looks whether to stop.
CONSUME_S = 1.0
#: Bound on each librdkafka call that talks to a coordinator (init, send offsets, commit, abort, committed):
#: a failover takes 5 to 20 s here; a call that times out costs an abort and a retry, nothing else.
CALL_S = 30.0
#: The producers' transaction.timeout.ms (the tests' loop's): what a producer replaced mid-transaction left
#: open is aborted by its successor's init_transactions at once, or by its coordinator after this.
TRANSACTION_TIMEOUT_MS = 30_000
#: Producers made in a row, each init_transactions bounded by CALL_S, before the worker gives up: a
#: coordinator not found for minutes is a stall, not a failover.
INIT_ATTEMPTS_MAX = 5
#: How long the loop tries to read its group's committed offsets after a failure (a moving coordinator
#: answers NOT_COORDINATOR until it is found again), and how often.
REWIND_S_MAX = 2 * CALL_S
REWIND_RETRY_S = 1.0
#: The exit status of a worker that gave up.
GAVE_UP = 3


class GaveUpError(Exception):
    """No producer could be initialised, or no committed offsets read: a stall."""


class _Worker:
    """What both share: the lines they print, their stop, their producer made again after a failure."""

    def __init__(self, bootstrap: str, txn_id: str) -> None:
        self.bootstrap, self.txn_id = bootstrap, txn_id
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def say(self, *words: object) -> None:
        with self._lock:
            print(*words, flush=True)

    def new_producer(self) -> Any:
        """A transactional producer of the worker's id, initialised: that fences any earlier one and ends
        what it left open (a transaction asked to commit is committed, any other aborted)."""
        from confluent_kafka import KafkaException, Producer

        errors = []
        for _ in range(INIT_ATTEMPTS_MAX):
            self.say("init")
            # metadata.recovery.strategy=none: with the default, librdkafka re-bootstraps after a few seconds
            # without a broker and decommissions every broker it knew (tests/txnkit.py).
            producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.txn_id,
                                 "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS, "linger.ms": 5,
                                 "metadata.recovery.strategy": "none"})
            try:
                producer.init_transactions(CALL_S)
                return producer
            except KafkaException as e:
                errors.append(str(e.args[0]))
        raise GaveUpError(f"{INIT_ATTEMPTS_MAX} producers failed to initialise: {'; '.join(errors)}")

    def recover(self, producer: Any, error: Any) -> Any:
        """After a failed transaction: abort it when the client says it can, else a new producer."""
        from confluent_kafka import KafkaException

        if error.txn_requires_abort():
            try:
                producer.abort_transaction(CALL_S)
                self.say("recovered", "aborted")
                return producer
            except KafkaException:
                pass   # the next producer's init aborts it
        producer = self.new_producer()
        self.say("recovered", "renewed")
        return producer


class Loop(_Worker):
    """librdkafka's consume-transform-produce loop from ``source`` into ``sink`` (the module's doc)."""

    def __init__(self, bootstrap: str, source: str, sink: str) -> None:
        super().__init__(bootstrap, LOOP_TXN_ID)
        self.source, self.sink = source, sink
        #: The last offset read of each partition since the loop's last rewind.
        self._last_read: dict[int, int] = {}

    def run(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": LOOP_GROUP,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "isolation.level": "read_committed",
                             # As the group reader's (cluster_load.py): a member lost with its coordinator,
                             # or with a killed process, is noticed in seconds.
                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 300})
        try:
            consumer.subscribe([self.source])
            producer = self.new_producer()
            while not self.stopping.is_set():
                self.say("consume")
                messages = [m for m in consumer.consume(PER_TXN_MAX, CONSUME_S) if m.error() is None]
                if not messages:
                    continue
                self._say_rereads(messages)
                try:
                    self._transact(producer, consumer, messages)
                except KafkaException as e:
                    self.say("failed", str(e.args[0]).replace("\n", " "))
                    producer = self.recover(producer, e.args[0])
                    self._rewind(consumer)
        finally:
            consumer.close()

    def _say_rereads(self, messages: list[Any]) -> None:
        """Say where the consumer went back in a partition without the loop's own rewind (a rebalance that
        started it from the group's committed offset, or the client's position reset): what the harness
        reports beside an input written twice."""
        for m in messages:
            partition, offset = m.partition(), m.offset()
            last = self._last_read.get(partition)
            if last is not None and offset <= last:
                self.say("reread", partition, last, offset)
            self._last_read[partition] = offset

    def _transact(self, producer: Any, consumer: Any, messages: list[Any]) -> None:
        from confluent_kafka import TopicPartition

        self.say("write", len(messages))
        producer.begin_transaction()
        ends: dict[int, int] = {}
        for m in messages:
            partition, offset = m.partition(), m.offset()
            producer.produce(self.sink, b"%s:%d:%d:%s" % (LOOP_PREFIX, partition, offset, m.value()),
                             partition=partition)
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        self.say("offsets")
        producer.send_offsets_to_transaction([TopicPartition(self.source, p, o) for p, o in ends.items()],
                                             consumer.consumer_group_metadata(), CALL_S)
        self.say("commit")
        producer.commit_transaction(CALL_S)
        self.say("committed", *(f"{p}:{o}" for p, o in sorted(ends.items())))

    def _rewind(self, consumer: Any) -> None:
        """Back to the group's committed offsets: what the failed transaction read is read again. Without
        them the positions would run on past the failed batch, so the loop tries until REWIND_S_MAX."""
        from confluent_kafka import KafkaException, TopicPartition

        waited = 0.0
        while True:
            assigned = consumer.assignment()
            if not assigned:
                return   # the next assignment starts from the committed offsets
            try:
                found = consumer.committed(assigned, CALL_S)
                break
            except KafkaException as e:   # the group's coordinator moving
                if waited > REWIND_S_MAX:
                    raise GaveUpError(f"no committed offsets after a failure within {REWIND_S_MAX:.0f} s: {e}") from e
                self.stopping.wait(REWIND_RETRY_S)
                waited += REWIND_RETRY_S
        self._last_read.clear()   # what the failed transaction read is read again, as meant
        for tp in found:
            consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
        self.say("rewound", *(f"{tp.partition}:{max(tp.offset, 0)}" for tp in found))


class Aborter(_Worker):
    """Transactions of a record into every partition of ``sink``, every ABORT_EVERY-th aborted."""

    def __init__(self, bootstrap: str, sink: str, partitions: int, first_txn: int) -> None:
        super().__init__(bootstrap, ABORTER_TXN_ID)
        self.sink, self.partitions, self.first_txn = sink, partitions, first_txn

    def run(self) -> None:
        from confluent_kafka import KafkaException

        producer = self.new_producer()
        for txn in itertools.count(self.first_txn):
            if self.stopping.wait(ABORTER_PAUSE_S):
                return
            try:
                self.say("begin", txn)
                producer.begin_transaction()
                for p in range(self.partitions):
                    producer.produce(self.sink, b"%s:%d:%d" % (ABORTER_PREFIX, txn, p), partition=p)
                producer.flush(CALL_S)
                if txn % ABORT_EVERY == ABORT_EVERY - 1:
                    self.say("abort", txn)
                    producer.abort_transaction(CALL_S)
                    self.say("aborted", txn)
                else:
                    self.say("commit", txn)
                    producer.commit_transaction(CALL_S)
                    self.say("committed", txn)
            except KafkaException as e:
                self.say("failed", txn, str(e.args[0]).replace("\n", " "))
                producer = self.recover(producer, e.args[0])


def main() -> None:
    role, bootstrap, *rest = sys.argv[1:]
    worker: Loop | Aborter
    if role == "loop":
        worker = Loop(bootstrap, rest[0], rest[1])
    else:
        worker = Aborter(bootstrap, rest[0], int(rest[1]), int(rest[2]))

    def wait_for_stop() -> None:
        sys.stdin.readline()   # "stop", or the end of stdin: the harness is gone
        worker.stopping.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    try:
        worker.run()
    except GaveUpError as e:
        worker.say("gave-up", str(e).replace("\n", " "))
        sys.exit(GAVE_UP)
    worker.say("done")


if __name__ == "__main__":
    main()
