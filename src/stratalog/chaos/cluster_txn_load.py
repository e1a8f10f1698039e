"""The transactional load of a cluster chaos run, beside the idempotent one (``cluster_load.py``), and the
read-back that judges it.

Two transactional producers of librdkafka write into one output topic, each a child process
(``cluster_txn_child.py``, which says what each does) watched from a thread of its own here:

- the loop: librdkafka's consume-transform-produce loop from the chaos topic (which the idempotent
  producers feed all run long) into the output, committing its group's offsets in its transactions;
- the aborter: a record into every partition per transaction, every ABORT_EVERY-th transaction aborted on
  purpose, so that aborted records lie among committed ones in every partition all run long.

Each worker's lines are counted as they come (transactions committed and aborted, failures, where the
group's offsets stand). A worker that says nothing for SILENT_S_MAX is stuck in a call past its timeout
(librdkafka issues 5456 and 5511; the child's module says which calls): its process is killed and a new
one started, whose init_transactions fences the old producer and aborts what it left open, as a
supervisor would restart a stuck application. So is one that exits by itself.

At the end the output is read read_committed (once no transaction is open in it: each partition's last
stable offset is its end) and read_uncommitted, and counted against the chaos topic's log and the loop
group's committed offsets (TXN_MUST_BE_ZERO): every input below those offsets is in the output once and
nothing else of the loop's is; no record of a transaction the aborter aborted is read, and every record
of one it committed is.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import ClassVar

from stratalog.chaos.cluster_load import committed, wait_for
from stratalog.chaos.cluster_txn_child import ABORTER_PREFIX, CALL_S, LOOP_GROUP, LOOP_PREFIX
from stratalog.chaos.harness import ChaosHarnessError
from stratalog.chaos.launch import dying_with_parent

#: The output topic of both workers.
OUTPUT_TOPIC = "chaos-txn-out"
#: A worker prints a line before each call, and each call is bounded by CALL_S: silent longer, it is stuck
#: in a call past its timeout.
SILENT_S_MAX = CALL_S + 30.0
#: How long a worker may take to stop once asked: the steps of its transaction under way, each silent for
#: at most SILENT_S_MAX before its process is killed.
STOP_S_MAX = 4 * SILENT_S_MAX
#: How often the watching thread looks at its worker.
WATCH_S = 0.5
#: Processes of one worker started in a row without a commit before it is taken as stalled (a child that
#: fails at its start would otherwise be started again for good).
FRUITLESS_STARTS_MAX = 5
#: The longest the loop (while its input flows) or the aborter may go without committing: as long as the
#: idempotent producers may go without an acknowledgement (chaos/cluster.py ACK_WAIT_S_MAX).
TXN_STALL_S_MAX = 120.0
#: How long a worker's pipes may take to be read to their end once its process ended.
PUMP_JOIN_S = 30.0
#: How long the output's transactions may take to end once the workers stopped: what a killed worker left
#: open is aborted within its timeout and the coordinator's abort interval (10 s by default).
SETTLE_S_MAX = 120.0
#: How long one read of the output to its end may take, and the records taken from its consumer at once.
READ_S_MAX = 300.0
READ_BATCH_MAX = 10_000
#: Each worker's last lines of librdkafka's log kept, to say where a stalled one stood; and the notes
#: kept of the run's restarts of workers.
CLIENT_LOG_LINES = 40
NOTES_MAX = 20
#: The figures of the transactional load that must be zero (TxnAccount's).
TXN_MUST_BE_ZERO = ("txn_inputs_missing", "txn_written_twice", "txn_outputs_uncommitted", "txn_aborted_visible",
                    "txn_committed_missing", "txn_stalled")


class TxnWorker:
    """One transactional worker's child process, watched from a thread of its own: started, its lines
    counted as they come, started again when stuck or gone, stopped with a ``stop`` line."""

    role: ClassVar[str]

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.committed = 0
        #: Failed transactions a process recovered from (aborted, or a new producer), and of them aborted.
        self.restarts = self.recovery_aborts = 0
        #: Processes started again: killed when stuck in a call, or gone by themselves.
        self.processes_restarted = 0
        self.notes: list[str] = []
        #: Why the worker was given up: a stall, counted.
        self.gave_up: str | None = None
        #: An error of the harness itself, raised by finish().
        self.failure: BaseException | None = None
        self._stopping = threading.Event()
        self._stderr: deque[str] = deque(maxlen=CLIENT_LOG_LINES)
        self._said = ("starting", time.monotonic())
        self._fruitless_starts = 0
        self._last_commit_at = time.monotonic()
        self._gap_s_max = 0.0
        self._timing = True
        self._child: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._supervise, daemon=True, name=f"stratalog-chaos-{self.role}")

    # What each worker says --------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The arguments of cluster_txn_child after the module's name."""
        raise NotImplementedError

    def handle(self, words: list[str]) -> None:
        """One line the process printed, split."""

    def lost(self) -> None:
        """Its process ended without finishing what it was doing."""

    def committed_now(self) -> None:
        self.committed += 1
        self._fruitless_starts = 0
        now = time.monotonic()
        if self._timing:
            self._gap_s_max = max(self._gap_s_max, now - self._last_commit_at)
        self._last_commit_at = now

    def stop_timing(self) -> None:
        """Commits are not timed from now on (the loop's input stopped: it runs out of work)."""
        if self._timing:
            self._gap_s_max = max(self._gap_s_max, time.monotonic() - self._last_commit_at)
            self._timing = False

    @property
    def gap_s_max(self) -> float:
        """The longest time without a commit, from the start to stop_timing (or now)."""
        if not self._timing:
            return self._gap_s_max
        return max(self._gap_s_max, time.monotonic() - self._last_commit_at)

    def describe(self) -> str:
        said, since = self._said
        lines = "\n".join(self._stderr)
        return (f"{self.role}: last said {said!r} {time.monotonic() - since:.1f} s ago; committed {self.committed}, "
                f"recovered from {self.restarts} failures, {self.processes_restarted} processes started again; "
                f"librdkafka's last lines:\n{lines}")

    def _note(self, note: str) -> None:
        if len(self.notes) < NOTES_MAX:
            self.notes.append(f"{self.role}: {note}")

    # The process ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def _supervise(self) -> None:
        try:
            while not self._stopping.is_set() and self.gave_up is None:
                if self._fruitless_starts >= FRUITLESS_STARTS_MAX:
                    self.gave_up = f"{FRUITLESS_STARTS_MAX} processes in a row ended without a commit"
                    return
                self._fruitless_starts += 1
                self._run_one()
        except BaseException as e:   # a fault of the harness: finish() raises it
            self.failure = e

    def _run_one(self) -> None:
        """One process, from its start until it stops, is killed, or ends."""
        # Started from this thread, and killed by Linux if it ends first (dying_with_parent).
        child = subprocess.Popen(
            dying_with_parent([sys.executable, "-W", "ignore", "-m", "stratalog.chaos.cluster_txn_child",
                               *self.command()]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._child = child
        self._said = ("started", time.monotonic())
        pumps = [threading.Thread(target=self._read_lines, args=(child,), daemon=True),
                 threading.Thread(target=self._read_log, args=(child,), daemon=True)]
        for pump in pumps:
            pump.start()
        try:
            ending = self._watch(child)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=PUMP_JOIN_S)
            for pump in pumps:
                pump.join(timeout=PUMP_JOIN_S)
            for stream in (child.stdin, child.stdout, child.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        if ending is not None:
            self.lost()
            self.processes_restarted += 1
            self._note(ending)

    def _watch(self, child: subprocess.Popen[str]) -> str | None:
        """Until the process ends: None once it stopped when asked, else why it ended (it is killed when
        stuck, at the stop too)."""
        asked = False
        while True:
            if self._stopping.is_set() and not asked:
                asked = True
                assert child.stdin is not None
                with contextlib.suppress(OSError):
                    child.stdin.write("stop\n")
                    child.stdin.flush()
            try:
                status: int | None = child.wait(timeout=WATCH_S)
            except subprocess.TimeoutExpired:
                status = None
            said, since = self._said
            if status is not None:
                if self.gave_up is not None or (asked and status == 0):
                    return None
                return f"exited with status {status} after saying {said!r}"
            if time.monotonic() - since > SILENT_S_MAX:
                child.kill()
                return f"killed: silent for {SILENT_S_MAX:.0f} s after saying {said!r}"

    def _read_lines(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            self._said = (line.strip(), time.monotonic())
            words = line.split()
            if words[:1] == ["gave-up"]:
                self.gave_up = line.strip()
            elif words:
                self.handle(words)

    def _read_log(self, child: subprocess.Popen[str]) -> None:
        assert child.stderr is not None
        for line in child.stderr:
            self._stderr.append(f"{time.strftime('%H:%M:%S')} {line.rstrip()}")

    def finish(self) -> None:
        """Ask it to stop and wait (a stuck process is killed on the way: at most SILENT_S_MAX)."""
        self._stopping.set()
        self._thread.join(timeout=STOP_S_MAX)
        if self.failure is not None:
            raise ChaosHarnessError(f"the {self.role}'s watcher failed: {self.failure!r}") from self.failure
        if self._thread.is_alive():
            raise ChaosHarnessError(f"the {self.role}'s watcher did not stop: {self.describe()}")

    def kill(self) -> None:
        """At the end, whatever happened (a harness error, an interrupt): no process left behind."""
        self._stopping.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(timeout=PUMP_JOIN_S)


class LoopWorker(TxnWorker):
    """The consume-transform-produce loop from ``source`` into OUTPUT_TOPIC."""

    role = "loop"

    def __init__(self, bootstrap: str, source: str) -> None:
        super().__init__(bootstrap)
        self.source = source
        #: Where the group's committed offsets stand, as far as the loop knows: what its commits sent, or
        #: what it read back after a failure (a commit the client saw fail may have landed).
        self.positions: dict[int, int] = {}

    def command(self) -> list[str]:
        return ["loop", self.bootstrap, self.source, OUTPUT_TOPIC]

    def handle(self, words: list[str]) -> None:
        what = words[0]
        if what == "committed":
            self._positions(words[1:])
            self.committed_now()
        elif what == "rewound":
            self._positions(words[1:])
        elif what == "reread":
            partition, last, offset = words[1:4]
            self._note(f"{time.strftime('%H:%M:%S')} read partition {partition} again from offset {offset} (it "
                       f"had read up to {last}) without a rewind of its own")
        elif what == "failed":
            self.restarts += 1
            self._note(f"{time.strftime('%H:%M:%S')} a transaction failed: {' '.join(words[1:])}")
        elif words == ["recovered", "aborted"]:
            self.recovery_aborts += 1

    def _positions(self, pairs: list[str]) -> None:
        for pair in pairs:
            partition, offset = pair.split(":")
            self.positions[int(partition)] = int(offset)

    def caught_up(self, ends: dict[int, int]) -> bool:
        """Whether the group has committed every input below ``ends``, as far as the loop knows."""
        positions = dict(self.positions)
        return all(positions.get(p, 0) >= end for p, end in ends.items())


class AborterWorker(TxnWorker):
    """Transactions of a record into every partition of OUTPUT_TOPIC, every ABORT_EVERY-th aborted. Keeps
    those committed, those never asked to commit (aborted, however they ended: none of their records may
    be read read_committed), and those whose commit failed (in doubt)."""

    role = "aborter"

    def __init__(self, bootstrap: str, partitions: int) -> None:
        super().__init__(bootstrap)
        self.partitions = partitions
        self.committed_txns: set[int] = set()
        self.aborted_txns: set[int] = set()
        self.in_doubt: set[int] = set()
        self._next_txn = 0
        #: The transaction under way and whether it was asked to commit.
        self._current: tuple[int, bool] | None = None

    def command(self) -> list[str]:
        return ["aborter", self.bootstrap, OUTPUT_TOPIC, str(self.partitions), str(self._next_txn)]

    def handle(self, words: list[str]) -> None:
        what, txn = words[0], int(words[1]) if len(words) > 1 and words[1].isdigit() else -1
        if what == "begin":
            self._current, self._next_txn = (txn, False), txn + 1
        elif what == "commit":
            self._current = (txn, True)
        elif what == "abort":
            self.aborted_txns.add(txn)
        elif what == "committed":
            self.committed_txns.add(txn)
            self._current = None
            self.committed_now()
        elif what == "aborted":
            self._current = None
        elif what == "failed":
            self.restarts += 1
            self.lost()
        elif words == ["recovered", "aborted"]:
            self.recovery_aborts += 1

    def lost(self) -> None:
        if self._current is not None:
            txn, asked_to_commit = self._current
            (self.in_doubt if asked_to_commit else self.aborted_txns).add(txn)
            self._current = None

    def flowing(self) -> bool:
        return self.committed > 0 and len(self.aborted_txns) > 0


@dataclass(frozen=True, slots=True)
class TxnAccount:
    """The transactional load's figures: those named in TXN_MUST_BE_ZERO, and the rest as they are."""

    #: Inputs below the loop group's committed offsets; the loop's records in the output, read_committed.
    txn_inputs_committed: int
    txn_outputs: int
    #: Inputs in the chaos topic beyond the group's committed offsets when the loop stopped (it is given
    #: time to catch up once the idempotent producers stop).
    txn_inputs_behind: int
    txn_loop_committed: int
    #: The loop's failed transactions it recovered from (each aborted, or ended by a new producer), and of
    #: them those it aborted.
    txn_loop_restarts: int
    txn_loop_aborted: int
    #: The loop's processes started again (killed when stuck in a call past its timeout, or gone).
    txn_loop_processes_restarted: int
    #: The longest the loop went without committing while its input flowed.
    txn_loop_gap_s_max: float
    txn_aborter_committed: int
    txn_aborter_aborted: int
    #: Commits that failed (or whose process was killed): their records may be read or not, not judged.
    txn_aborter_in_doubt: int
    txn_aborter_restarts: int
    txn_aborter_processes_restarted: int
    #: Records of aborted transactions in the output read_uncommitted: what read_committed must leave out.
    txn_aborted_records_in_log: int
    txn_inputs_missing: int
    #: Records read twice read_committed: an input written twice, or a record of the aborter's.
    txn_written_twice: int
    #: The loop's records of inputs at or past the group's committed offsets (or whose value is not the
    #: input's at that offset): a transaction's records committed without its offsets.
    txn_outputs_uncommitted: int
    txn_aborted_visible: int
    txn_committed_missing: int
    #: Workers that went TXN_STALL_S_MAX without committing or were given up; and output partitions whose
    #: last stable offset never reached their end (a transaction that never ended).
    txn_stalled: int


class TxnLoad:
    """The loop and the aborter, started together; :meth:`stop` stops them, :meth:`account` counts."""

    def __init__(self, bootstrap: str, source: str, partitions: int) -> None:
        self.bootstrap, self.source, self.partitions = bootstrap, source, partitions
        self.loop = LoopWorker(bootstrap, source)
        self.aborter = AborterWorker(bootstrap, partitions)
        self.loop.start()
        self.aborter.start()

    def flowing(self) -> bool:
        """The loop has committed, the aborter committed and aborted: the load is under way."""
        return self.loop.committed > 0 and self.aborter.flowing()

    def transactions(self) -> int:
        return self.loop.committed + len(self.aborter.committed_txns) + len(self.aborter.aborted_txns)

    def input_stopped(self) -> None:
        self.loop.stop_timing()

    def stop(self) -> list[str]:
        """Stop both; why each stalled one did, with what it was doing (empty when neither did)."""
        stalled = []
        for worker in (self.loop, self.aborter):
            worker.stop_timing()
            worker.finish()
            if worker.gave_up is not None or worker.gap_s_max > TXN_STALL_S_MAX:
                why = worker.gave_up or f"went {worker.gap_s_max:.0f} s without a commit"
                stalled.append(f"{why}: {worker.describe()}")
        return stalled

    def notes(self) -> list[str]:
        return self.loop.notes + self.aborter.notes

    def kill(self) -> None:
        self.loop.kill()
        self.aborter.kill()

    def account(self, log: dict[int, list[bytes]], stalled: list[str]) -> TxnAccount:
        """Count the output against ``log`` (the chaos topic, read back) and the group's committed offsets,
        once :meth:`stop` returned ``stalled``."""
        loop, aborter, partitions = self.loop, self.aborter, range(self.partitions)
        offsets = group_offsets(self.bootstrap, self.source, self.partitions)
        unsettled = settle(self.bootstrap, OUTPUT_TOPIC, self.partitions)
        visible = Counter(read_output(self.bootstrap, OUTPUT_TOPIC, "read_committed"))
        everything = read_output(self.bootstrap, OUTPUT_TOPIC, "read_uncommitted")
        expected = {b"%s:%d:%d:%s" % (LOOP_PREFIX, p, o, log[p][o])
                    for p in partitions for o in range(min(offsets[p], len(log[p])))}
        outputs = {v for v in visible if v.startswith(LOOP_PREFIX + b":")}
        aborted = {b"%s:%d:%d" % (ABORTER_PREFIX, t, p) for t in aborter.aborted_txns for p in partitions}
        committed_records = {b"%s:%d:%d" % (ABORTER_PREFIX, t, p) for t in aborter.committed_txns for p in partitions}
        return TxnAccount(
            txn_inputs_committed=len(expected), txn_outputs=sum(visible[v] for v in outputs),
            txn_inputs_behind=sum(max(len(log[p]) - offsets[p], 0) for p in partitions),
            txn_loop_committed=loop.committed, txn_loop_restarts=loop.restarts,
            txn_loop_aborted=loop.recovery_aborts, txn_loop_processes_restarted=loop.processes_restarted,
            txn_loop_gap_s_max=loop.gap_s_max,
            txn_aborter_committed=len(aborter.committed_txns), txn_aborter_aborted=len(aborter.aborted_txns),
            txn_aborter_in_doubt=len(aborter.in_doubt), txn_aborter_restarts=aborter.restarts,
            txn_aborter_processes_restarted=aborter.processes_restarted,
            txn_aborted_records_in_log=sum(v in aborted for v in everything),
            txn_inputs_missing=len(expected - outputs),
            txn_written_twice=sum(n - 1 for n in visible.values()),
            txn_outputs_uncommitted=len(outputs - expected),
            txn_aborted_visible=sum(n for v, n in visible.items() if v in aborted),
            txn_committed_missing=len(committed_records - set(visible)),
            txn_stalled=len(stalled) + unsettled)


def group_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """The loop group's committed offset of each partition of ``topic`` (0 where none), asked again while
    the group's coordinator moves (librdkafka raises NOT_COORDINATOR then, rather than asking again)."""
    from confluent_kafka import KafkaException

    def ask() -> dict[int, int] | None:
        try:
            return {p: max(o, 0) for p, o in committed(bootstrap, topic, partitions, LOOP_GROUP).items()}
        except KafkaException:
            return None

    found: dict[int, int] = wait_for(ask, "the transactional loop's committed offsets", READ_S_MAX, poll_s=1.0)
    return found


def log_ends(bootstrap: str, topic: str, partitions: int, isolation: str = "read_uncommitted") -> dict[int, int]:
    """Each partition's end as a consumer of ``isolation`` sees it: for read_committed, the last stable
    offset (librdkafka's ListOffsets asks with the consumer's isolation level)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-ends", "isolation.level": isolation,
                         "enable.auto.commit": False, "log_level": 0})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def settle(bootstrap: str, topic: str, partitions: int) -> int:
    """Wait until no transaction is open in ``topic`` (each partition's last stable offset is its end);
    how many partitions still had one after SETTLE_S_MAX."""
    from confluent_kafka import KafkaException

    behind = list(range(partitions))

    def settled() -> bool:
        try:
            ends = log_ends(bootstrap, topic, partitions)
            stable = log_ends(bootstrap, topic, partitions, "read_committed")
        except KafkaException:
            return False   # a leader moving
        behind[:] = [p for p in range(partitions) if stable[p] < ends[p]]
        return not behind

    try:
        wait_for(settled, "the output's transactions to end", SETTLE_S_MAX, poll_s=1.0)
    except ChaosHarnessError:
        return len(behind)
    return 0


def read_output(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Every value of ``topic`` from its start as a consumer of ``isolation`` reads it, until it is at the
    end of every partition (for read_committed, the last stable offset)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-reader", "isolation.level": isolation,
                         "enable.partition.eof": True, "enable.auto.commit": False, "log_level": 0})
    try:
        partitions = consumer.list_topics(topic, 30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        values: list[bytes] = []
        at_end: set[int] = set()

        def done() -> bool:
            for message in consumer.consume(READ_BATCH_MAX, 0.5):
                error, partition, value = message.error(), message.partition(), message.value()
                assert partition is not None   # set on records and on ends of partitions alike
                if error is None:
                    assert value is not None   # every record written here has one
                    at_end.discard(partition)
                    values.append(value)
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                else:
                    raise KafkaException(error)
            return len(at_end) == len(partitions)

        wait_for(done, f"the output read {isolation} to its end", READ_S_MAX, poll_s=0)
        return values
    finally:
        consumer.close()

