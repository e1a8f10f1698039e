"""kill -9 of brokers of a cluster under load from real Kafka clients, for minutes, and what survived.

Brokers (``serve --cluster``) over a PostgreSQL and a SeaweedFS of their own, all on 127.0.0.1. Two
idempotent producers (confluent-kafka, and kafka-python in a child process; acks=all) write to every
partition while one consumer of a group reads and commits. Beside them runs a transactional load
(``cluster_txn_load.py``): librdkafka's consume-transform-produce loop copies that topic into another in
transactions that commit its group's offsets, and a second transactional producer aborts every third of
its transactions there. From the seed, the harness waits a while, kills
a live broker with SIGKILL, measures the failover (from the kill until every partition has a live leader
that answers for it), sometimes kills a second one the same way (never the last live broker), then
restarts the dead and waits until the partitions are spread evenly again; and so on until the time is up.
At the end the producers flush, the group reads every acknowledged record, the loop is given time to
commit every input, and the whole log and the loop's output are read.

| count (must be 0)       | the promise                                                                   |
|-------------------------|-------------------------------------------------------------------------------|
| lost                    | every acknowledged record is in the log                                       |
| log_duplicates          | no record is in the log twice (idempotence across failovers)                  |
| out_of_order            | one producer's records in one partition are in the order it sent them         |
| delivery_failures       | no produce fails for good (the producers retry across failovers)              |
| commits_backwards       | the group's committed offset of a partition never goes back                   |
| group_missed            | the group reads every acknowledged record                                     |
| unserved                | every partition is served again within FAILOVER_S_MAX of a kill               |
| stalled                 | the producers get acknowledgements again within ACK_WAIT_S_MAX of a restart   |
| txn_inputs_missing      | every input below the loop group's committed offsets is in the output         |
| txn_written_twice       | no record is in the output twice (read_committed, as all that follow)         |
| txn_outputs_uncommitted | no output of the loop's is of an input at or past its group's committed offset |
| txn_aborted_visible     | no record of an aborted transaction is read                                   |
| txn_committed_missing   | every record of a committed transaction is read                               |
| txn_stalled             | both transactional producers commit within TXN_STALL_S_MAX; every transaction ends |

Reported, not judged: records the group read twice (at-least-once: those read after its last commit
before its coordinator died), commits refused while the coordinator moved, brokers that exited by
themselves (a lease lost on a loaded machine: restarted like the killed ones); the transactions committed
and aborted, the loop's restarts (failed transactions, aborted or ended by a new producer) and how far
behind its input it was when it stopped.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from stratalog.chaos.cluster_load import GroupReader, Load, account, committed, read_log
from stratalog.chaos.cluster_probe import PartitionView, served_without
from stratalog.chaos.cluster_process import BrokerCluster, running_cluster, running_services
from stratalog.chaos.cluster_txn_load import OUTPUT_TOPIC, TXN_MUST_BE_ZERO, TxnAccount, TxnLoad, log_ends
from stratalog.chaos.harness import ChaosHarnessError, MustBeZeroFigures

TOPIC, GROUP = "chaos", "chaos-readers"
#: From a kill until every partition is served again: the lease (3 s) plus a replay and a reconcile take
#: 5 to 10 s here; a loaded 2-core machine may take several times that.
FAILOVER_S_MAX = 60.0
#: After a restart, how long the partitions may take to be spread evenly again (handoffs).
REBALANCE_S_MAX = 120.0
#: How long the producers may go without an acknowledgement after a round.
ACK_WAIT_S_MAX = 120.0
#: How long the group may take to read every acknowledged record at the end.
GROUP_READ_S_MAX = 180.0
#: Records acknowledged and read before the first kill: the load is flowing.
WARM_UP_RECORDS = 300
#: Brokers a second kill leaves alive at least, so one is always there to take over (and the fewest a run
#: needs).
LIVE_BROKERS_MIN = 2
#: The run's progress is reported this often while it waits.
TICK_S = 0.5
#: How long the transactional loop may take to commit every input once the producers stopped (it may be
#: behind by a backlog after the last kill): past it, what it left is reported (txn_inputs_behind).
TXN_CATCH_UP_S_MAX = 120.0
MUST_BE_ZERO = ("lost", "log_duplicates", "out_of_order", "delivery_failures", "commits_backwards",
                "group_missed", "unserved", "stalled", *TXN_MUST_BE_ZERO)


@dataclass(frozen=True, slots=True)
class ClusterChaosConfig:
    minutes: float = 5.0
    brokers: int = 3
    partitions: int = 6
    seed: int = 0
    #: Stop after this many kills even before the time is up (None: only the time).
    kills_max: int | None = None
    #: Between rounds of one record per partition, per producer: 0.02 s is 2 x 6 x 50 = 600 records/s.
    round_s: float = 0.02
    #: Seconds of load between a restart and the next kill, drawn from the seed.
    pause_s_min: float = 2.0
    pause_s_max: float = 8.0
    #: The chance that a kill is followed by a second before the restart (while two or more still live).
    second_kill_chance: float = 0.3


@dataclass(frozen=True, slots=True)
class KillFigures:
    """One kill: which broker, and how long until every partition was served again."""

    index: int
    broker_id: int
    #: Whether another broker was dead already (the second kill of a round).
    second: bool
    failover_s: float
    at_s: float
    records_acknowledged: int


@dataclass(frozen=True, slots=True)
class RunProgress:
    """What the progress line shows."""

    elapsed_s: float
    kills: int
    records_acknowledged: int
    records_read: int
    #: The transactional load's transactions, committed and aborted.
    transactions: int
    doing: str


@dataclass(frozen=True, slots=True)
class ClusterChaosFigures(TxnAccount, MustBeZeroFigures):
    """The run's figures: the transactional load's (TxnAccount's fields, first), then the rest."""

    brokers: int
    partitions: int
    kills: int
    second_kills: int
    failover_s_min: float
    failover_s_p50: float
    failover_s_max: float
    elapsed_s: float
    records_acknowledged: int
    records_in_log: int
    #: In the log but never acknowledged (sent, then the answer was lost with a broker): allowed.
    records_unacknowledged_in_log: int
    records_consumed: int
    group_duplicates: int
    commit_errors: int
    #: Commits of the group's consumer without an answer for COMMIT_ANSWER_S_MAX (noted, with its lines).
    commits_unanswered: int
    exited_by_themselves: int
    lost: int
    log_duplicates: int
    out_of_order: int
    delivery_failures: int
    commits_backwards: int
    group_missed: int
    unserved: int
    stalled: int
    #: What a stalled transactional worker was doing (with librdkafka's last lines), and why each of their
    #: processes was started again.
    notes: tuple[str, ...] = ()

    must_be_zero: ClassVar[tuple[str, ...]] = MUST_BE_ZERO


class _Run:
    """One run's state: the cluster, the clients, and what was counted so far."""

    def __init__(self, cluster: BrokerCluster, config: ClusterChaosConfig,
                 on_kill: Callable[[KillFigures], None], on_progress: Callable[[RunProgress], None]) -> None:
        self.cluster, self.config = cluster, config
        self.on_kill, self.on_progress = on_kill, on_progress
        self.rng = random.Random(config.seed)
        self.started = time.monotonic()
        self.kills: list[KillFigures] = []
        self.killed: set[int] = set()
        self.exited_by_themselves = 0
        self.unserved = self.stalled = self.commits_backwards = 0
        self.commits_seen: dict[int, int] = {}
        self.doing = "starting"
        self.load: Load | None = None
        self.reader: GroupReader | None = None
        self.txn: TxnLoad | None = None

    # Waiting ---------------------------------------------------------------------------------------

    def tick(self) -> None:
        load, reader, txn = self.load, self.reader, self.txn
        self.on_progress(RunProgress(time.monotonic() - self.started, len(self.kills),
                                     load.acked_count() if load else 0, reader.read_count() if reader else 0,
                                     txn.transactions() if txn else 0, self.doing))

    def wait(self, ready: Callable[[], Any], timeout_s: float, poll_s: float = 0.05) -> Any:
        """``ready()``'s first truthy value, or None after ``timeout_s``; the progress line kept fresh."""
        deadline = time.monotonic() + timeout_s
        next_tick = 0.0
        while True:
            value = ready()
            if value:
                return value
            now = time.monotonic()
            if now >= next_tick:
                self.tick()
                next_tick = now + TICK_S
            if now > deadline:
                return None
            time.sleep(poll_s)

    # Rounds ----------------------------------------------------------------------------------------

    def served(self, dead: frozenset[int]) -> dict[tuple[str, int], PartitionView] | None:
        """Every partition of both topics with its leader, once each has a live one (none of ``dead``)
        that answers for it; None before."""
        live = [i for i in self.cluster.live() if i not in dead]
        if not live:
            return None
        views: dict[tuple[str, int], PartitionView] = {}
        for topic in (TOPIC, OUTPUT_TOPIC):
            # Asked of the first live broker, not a drawn one: the seed's draws stay the kills' alone.
            view = served_without(self.cluster, live[0], topic, self.config.partitions, dead)
            if view is None:
                return None
            views.update({(topic, p): v for p, v in view.items()})
        return views

    def balanced(self) -> bool:
        """Whether the partitions (of both topics: the brokers spread them all as one) are spread evenly."""
        view = self.served(frozenset())
        if view is None:
            return False
        loads = Counter(v.leader_id for v in view.values())
        counts = [loads.get(i, 0) for i in self.cluster.live()]
        return max(counts) - min(counts) <= 1

    def restart_exited(self) -> None:
        """Brokers that exited by themselves (a lost lease exits with 75) are started again."""
        for broker_id in sorted(self.cluster.ports):
            if broker_id not in self.killed and broker_id not in self.cluster.live():
                self.exited_by_themselves += 1
                self.cluster.start(broker_id)

    def kill(self, victim: int, dead: frozenset[int], second: bool) -> bool:
        """SIGKILL ``victim`` and wait until its partitions are served by the others; False if they never were."""
        assert self.load is not None
        self.doing = f"killed broker {victim}, waiting for every partition to be served"
        acked = self.load.acked_count()
        killed_at = time.monotonic()
        self.cluster.brokers[victim].kill9()
        self.killed.add(victim)
        view = self.wait(lambda: self.served(dead | {victim}), FAILOVER_S_MAX)
        failover_s = time.monotonic() - killed_at
        if view is None:
            self.unserved += 1
            return False
        figures = KillFigures(len(self.kills), victim, second, failover_s, killed_at - self.started, acked)
        self.kills.append(figures)
        self.on_kill(figures)
        return True

    def check_commits(self) -> None:
        for partition, offset in committed(self.cluster.bootstrap(*self.cluster.live()), TOPIC,
                                           self.config.partitions, GROUP).items():
            if offset < 0:
                continue   # none yet (or not answered)
            if offset < self.commits_seen.get(partition, -1):
                self.commits_backwards += 1
            self.commits_seen[partition] = max(offset, self.commits_seen.get(partition, -1))

    def load_goes_on(self) -> bool:
        assert self.load is not None
        acked = self.load.acked_count()
        self.doing = "waiting for acknowledgements"
        if self.wait(lambda: self.load is not None and self.load.acked_count() > acked, ACK_WAIT_S_MAX) is None:
            self.stalled = 1
        return not self.stalled

    def play_round(self) -> bool:
        """Pause, kill one broker (sometimes two), restart them; False when the run must stop."""
        config = self.config
        self.doing = "load"
        pause_s = self.rng.uniform(config.pause_s_min, config.pause_s_max)
        pause_ends = time.monotonic() + pause_s
        self.wait(lambda: time.monotonic() >= pause_ends, pause_s + 1, poll_s=0.1)
        self.restart_exited()
        live = self.cluster.live()
        victim = self.rng.choice(live)
        if not self.kill(victim, frozenset(), second=False):
            return False
        dead = frozenset({victim})
        room = config.kills_max is None or len(self.kills) < config.kills_max
        if room and len(live) - len(dead) >= LIVE_BROKERS_MIN and self.rng.random() < config.second_kill_chance:
            other = self.rng.choice([i for i in live if i not in dead])
            if not self.kill(other, dead, second=True):
                return False
            dead |= {other}
        self.doing = f"restarting broker {', '.join(map(str, sorted(dead)))}"
        for broker_id in sorted(dead):
            self.cluster.start(broker_id)
            self.killed.discard(broker_id)
        if self.wait(self.balanced, REBALANCE_S_MAX, poll_s=0.2) is None:
            self.unserved += 1
            return False
        self.check_commits()
        return self.load_goes_on()


def run_cluster_chaos(work: Path, config: ClusterChaosConfig,
                      on_kill: Callable[[KillFigures], None] = lambda _: None,
                      on_progress: Callable[[RunProgress], None] = lambda _: None) -> ClusterChaosFigures:
    """Run the whole harness in ``work`` (its servers' directories go there); everything it starts is
    stopped when it returns or raises."""
    if config.brokers < LIVE_BROKERS_MIN:
        raise ChaosHarnessError("a cluster chaos run needs two brokers or more: one must stay alive")
    from confluent_kafka.admin import AdminClient, NewTopic

    with running_services(work) as services, \
            running_cluster(work / "brokers", services.database, services.objects(), config.brokers) as cluster:
        run = _Run(cluster, config, on_kill, on_progress)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap(), "log_level": 0})
        for future in admin.create_topics([NewTopic(TOPIC, config.partitions, 1),
                                           NewTopic(OUTPUT_TOPIC, config.partitions, 1)]).values():
            future.result(timeout=60)
        run.doing = "waiting for the topics to be served"
        if run.wait(run.balanced, REBALANCE_S_MAX, poll_s=0.2) is None:
            raise ChaosHarnessError(f"the topics' {config.partitions} partitions were never served")
        run.load = load = Load(cluster.bootstrap(), TOPIC, config.partitions, config.round_s)
        run.txn = txn = TxnLoad(cluster.bootstrap(), TOPIC, config.partitions)
        try:
            run.reader = reader = GroupReader(cluster.bootstrap(), TOPIC, GROUP)
            run.doing = "warming up"
            if run.wait(lambda: load.acked_count() >= WARM_UP_RECORDS and reader.read_count() >= WARM_UP_RECORDS
                        and txn.flowing(), ACK_WAIT_S_MAX) is None:
                raise ChaosHarnessError("the producers, the group and the transactions never got going")
            deadline = run.started + 60 * config.minutes
            while time.monotonic() < deadline and (config.kills_max is None or len(run.kills) < config.kills_max):
                if not run.play_round():
                    break
            return _finish(run, load, reader, txn)
        finally:
            load.kill()
            txn.kill()


def _finish(run: _Run, load: Load, reader: GroupReader, txn: TxnLoad) -> ClusterChaosFigures:
    cluster, config = run.cluster, run.config
    run.restart_exited()
    run.doing = "flushing the producers"
    run.tick()
    load.stop()
    txn.input_stopped()
    acked = load.acked_values()
    run.doing = "waiting for the group to read every acknowledged record"
    run.wait(lambda: acked <= reader.values(), GROUP_READ_S_MAX, poll_s=0.2)
    group_missed = len(acked - reader.values())
    reader.stop()
    run.doing = "waiting for the transactional loop to commit every input"
    ends = log_ends(cluster.bootstrap(), TOPIC, config.partitions)
    run.wait(lambda: txn.loop.caught_up(ends), TXN_CATCH_UP_S_MAX, poll_s=0.2)
    run.doing = "stopping the transactional producers"
    run.tick()
    stalled = txn.stop()
    run.check_commits()
    run.doing = "reading the log and the transactions' output"
    run.tick()
    log = read_log(cluster.bootstrap(), TOPIC, config.partitions)
    counts = account(acked, log)
    txn_account = txn.account(log, stalled)
    read_counts = Counter(v for _, _, v in reader.read)
    failovers = [k.failover_s for k in run.kills]
    return ClusterChaosFigures(
        **dataclasses.asdict(txn_account), notes=(*stalled, *txn.notes(), *reader.notes),
        brokers=config.brokers, partitions=config.partitions, kills=len(run.kills),
        second_kills=sum(k.second for k in run.kills),
        failover_s_min=min(failovers, default=0.0), failover_s_p50=statistics.median(failovers) if failovers else 0.0,
        failover_s_max=max(failovers, default=0.0), elapsed_s=time.monotonic() - run.started,
        records_acknowledged=counts.acknowledged, records_in_log=counts.in_log,
        records_unacknowledged_in_log=counts.unacknowledged_in_log, records_consumed=len(reader.read),
        group_duplicates=sum(n - 1 for n in read_counts.values() if n > 1), commit_errors=reader.commit_errors,
        commits_unanswered=reader.commits_unanswered,
        exited_by_themselves=run.exited_by_themselves, lost=counts.lost,
        log_duplicates=counts.log_duplicates, out_of_order=counts.out_of_order,
        delivery_failures=len(load.failed), commits_backwards=run.commits_backwards, group_missed=group_missed,
        unserved=run.unserved, stalled=run.stalled)
