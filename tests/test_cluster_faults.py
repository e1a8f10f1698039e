"""Faults of what a cluster stands on, under load from real Kafka clients (idempotent kafka-python and
confluent-kafka producers, acks=all, and a confluent-kafka group): a network partition between one
broker and PostgreSQL, and a restart of PostgreSQL.

Three brokers over one PostgreSQL and one SeaweedFS of this module's own. Brokers 1 and 2 run here on
127.0.0.1; broker 3 runs in a network namespace of its own, joined to this one by two veth links: one
to the database, one for the object store and its clients. Cutting the database link is a partition
between broker 3 and PostgreSQL alone: it still reaches the object store and its clients still reach it.

What must hold: a broker that cannot confirm its lease stops acknowledging, then stops (exit 75) once
its lease has surely run out, rather than diverging; the others replay its log and serve its
partitions; every acknowledged record is in the log exactly once and in order; the clients carry on
without a restart; committed offsets never go back.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from clusterkit import NOT_LEADER_OR_FOLLOWER, produce_error, stacks, tails
from netkit import Namespace, network_namespace
from stratalog.broker.cluster_node import EXIT_LEASE_LOST, EXIT_STORE_FAILED
from stratalog.chaos import cluster_probe
from stratalog.chaos.cluster_load import GroupReader, Load, LogAccount, account, committed, read_log
from stratalog.chaos.cluster_probe import NONE, PartitionView
from stratalog.chaos.cluster_process import BrokerCluster, Placement, SeaweedServer, running_cluster, seaweed_server
from stratalog.chaos.postgres import PostgresServer, running_postgres
from stratalog.kafka.client import BrokerConnectionError
from waiting import wait_progressing, wait_until

PARTITIONS = 6
#: Between rounds of one record per partition, per producer: about 2 x 6 x 50 = 600 records a second.
ROUND_S = 0.02
#: Records acknowledged after each step before the next: the load goes on.
AFTER_STEP_RECORDS = 600
#: The partitioned broker: in the namespace.
CUT_OFF = 3
#: From the cut until it exits: its lease (3 s) and margin, then a renewal that fails within libpq's
#: tcp_user_timeout (5 s) or connect_timeout (10 s); a loaded machine adds to each.
FENCED_S_MAX = 60.0
#: How long the group may take to read every acknowledged record once the load stopped.
GROUP_READ_S_MAX = 60.0
#: How long acknowledgements must have stopped while the object store hangs before it answers again.
STALL_S = 2.0
#: Between probes of the cut-off broker.
PROBE_S = 0.05
#: From the cut until every partition is served by the others: the lease, a replay, a reconcile.
FAILOVER_S_MAX = 60.0


@dataclass
class FaultyCluster:
    cluster: BrokerCluster
    postgres: PostgresServer
    s3: SeaweedServer
    namespace: Namespace


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyCluster]:
    base = tmp_path_factory.mktemp("faults")
    with network_namespace(["db", "data"]) as namespace:
        db_link, data_link = namespace.links["db"], namespace.links["data"]
        with running_postgres(extra_listen=(db_link.host,)) as postgres, \
                seaweed_server(base / "seaweedfs", address=data_link.host) as s3:
            place = Placement(host=data_link.inside, launcher=tuple(namespace.command([])),
                              database=postgres.dsn_at(db_link.host))
            with running_cluster(base / "brokers", postgres.dsn, s3.endpoint.uri("faults"), 3,
                                 placements={CUT_OFF: place}, verbose=True) as cluster:
                yield FaultyCluster(cluster, postgres, s3, namespace)


@pytest.fixture
def whole(faulty: FaultyCluster) -> FaultyCluster:
    """The module's cluster as each test must find it, whatever a failed test before left: every link up,
    the object store answering, every broker running (a supervisor's restart, whatever its exit)."""
    for link in faulty.namespace.links:
        faulty.namespace.mend(link)
    if faulty.s3.process is None or faulty.s3.process.poll() is not None:
        faulty.s3.start()   # on the same ports, with the same objects
    faulty.s3.resume()
    for broker_id, broker in sorted(faulty.cluster.brokers.items()):
        if broker.process.poll() is not None:
            faulty.cluster.start(broker_id)
    return faulty


def served(cluster: BrokerCluster, topic: str, dead: frozenset[int] = frozenset()) -> dict[int, PartitionView] | None:
    via = next(i for i in cluster.live() if i not in dead)
    return cluster_probe.served_without(cluster, via, topic, PARTITIONS, dead)


def balanced(cluster: BrokerCluster, topic: str) -> dict[int, PartitionView] | None:
    view = served(cluster, topic)
    if view is None or sorted(Counter(v.leader_id for v in view.values()).values()) != [2, 2, 2]:
        return None
    return view


def describe(cluster: BrokerCluster, topic: str) -> str:
    """What each live broker's Metadata says of ``topic``, what each leader answers ListOffsets with, each
    broker's last lines and what its threads and tasks are doing (for a failure's message)."""
    said = []
    for broker_id in cluster.live():
        try:
            with cluster.connect(broker_id) as connection:
                view = cluster_probe.metadata(connection, topic)[1]
            answers = {}
            for p, v in view.items():
                if v.leader_id in cluster.brokers:
                    with cluster.connect(v.leader_id) as connection:
                        answers[p] = cluster_probe.list_offsets_error(connection, topic, p)
            said.append(f"broker {broker_id}: {view}; ListOffsets at leaders: {answers}")
        except (OSError, BrokerConnectionError) as e:
            said.append(f"broker {broker_id}: {e!r}")
    return "\n".join(said) + "\n" + tails(cluster) + "\n" + stacks(cluster)


def create_topic(cluster: BrokerCluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap(1)})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=60)
    wait_until(lambda: balanced(cluster, topic),
               lambda: f"every partition served, two by each broker:\n{describe(cluster, topic)}", timeout_s=120)


def restart_exited(cluster: BrokerCluster, allowed: frozenset[int] = frozenset({EXIT_LEASE_LOST})) -> list[int]:
    """What a supervisor does: start again every broker that stopped; each must have stopped the way it
    should (``allowed`` exit statuses: fenced, or its store failed)."""
    exited = [i for i, b in cluster.brokers.items() if b.process.poll() is not None]
    for broker_id in exited:
        status = cluster.brokers[broker_id].process.returncode
        assert status in allowed, (broker_id, status, "".join(cluster.brokers[broker_id].output[-20:]))
        cluster.start(broker_id)
    return exited


def settle(load: Load, reader: GroupReader, cluster: BrokerCluster, topic: str, group: str) -> LogAccount:
    """Stop the load, let the group read everything acknowledged, and count the log against it."""
    load.stop()
    if load.failed:
        log = read_log(cluster.bootstrap(), topic, PARTITIONS)
        acked = load.acked_values()
        near = []
        for failure in load.failed[:6]:
            words = failure.split()
            producer = "c" if words[0] == "confluent" else "k"
            where = words[1].split(":") if producer == "c" else words[1:3]
            partition, seq = int(where[0]), int(where[1])
            seqs = [(i, v.decode(), v in acked) for i, v in enumerate(log[partition])
                    if v.startswith(f"{producer}:".encode()) and abs(int(v.split(b":")[2]) - seq) <= 6]
            near.append((failure.strip()[:80], seqs))
        raise AssertionError(f"{load.failed[:5]}\n{tails(cluster)}\n{near}")
    acked = load.acked_values()
    try:
        wait_until(lambda: acked <= reader.values(),
                   lambda: f"the group to read every acknowledged record ({len(acked - reader.values())} of "
                           f"{len(acked)} not read); {reader.describe()}", timeout_s=GROUP_READ_S_MAX)
    finally:
        reader.stop()
        log = read_log(cluster.bootstrap(), topic, PARTITIONS)
        counts = account(acked, log)
        missed = sorted(acked - reader.values())
        print(f"\n{counts}; the group missed {len(missed)}: {missed[:10]}; in the log: "
              f"{[v in {x for values in log.values() for x in values} for v in missed[:10]]}", file=sys.stderr)
    assert committed(cluster.bootstrap(), topic, PARTITIONS, group) == {p: len(v) for p, v in log.items()}
    return counts


def probe_until_it_stops(cluster: BrokerCluster, topic: str, partition: int) -> list[tuple[bytes, int]]:
    """Produce one record at a time to the cut-off broker's ``partition`` until the broker stops: each
    record's value and the error code it got."""
    broker = cluster.brokers[CUT_OFF]
    probes: list[tuple[bytes, int]] = []
    deadline = time.monotonic() + FENCED_S_MAX
    with cluster.connect(CUT_OFF) as connection:
        while broker.process.poll() is None:
            assert time.monotonic() < deadline, f"broker {CUT_OFF} did not stop within {FENCED_S_MAX:g} s"
            value = f"probe:{len(probes)}".encode()
            try:
                probes.append((value, produce_error(connection, topic, partition, value)))
            except (OSError, BrokerConnectionError):
                break   # it is stopping
            time.sleep(PROBE_S)   # paced: a record every PROBE_S, not a flood
    broker.process.wait(timeout=FENCED_S_MAX)
    return probes


def lease_expiry_ms(postgres: PostgresServer, broker_id: int) -> tuple[int, int]:
    """Broker ``broker_id``'s incarnation and the end of its lease in the database (ms since the epoch)."""
    with psycopg.connect(postgres.dsn) as conn:
        row = conn.execute("SELECT epoch, lease_expires_ms FROM cluster_brokers WHERE broker_id = %s",
                           (broker_id,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.slow
def test_a_broker_cut_off_from_the_database_stops_acknowledging_and_loses_nothing(whole: FaultyCluster) -> None:
    faulty = whole
    cluster, topic, group = faulty.cluster, "partitioned", "partitioned-readers"
    create_topic(cluster, topic)
    before = served(cluster, topic)
    assert before is not None
    cut_off_partitions = sorted(p for p, v in before.items() if v.leader_id == CUT_OFF)
    load = Load(cluster.bootstrap(), topic, PARTITIONS, ROUND_S)
    try:
        reader = GroupReader(cluster.bootstrap(), topic, group)
        wait_until(lambda: load.acked_count() >= AFTER_STEP_RECORDS and reader.read_count() >= 200,
                   "records acknowledged and read before the cut")
        epoch, _ = lease_expiry_ms(faulty.postgres, CUT_OFF)
        acked_at_cut = load.acked_count()
        cut_at = time.monotonic()
        faulty.namespace.cut("db")
        try:
            probes = probe_until_it_stops(cluster, topic, cut_off_partitions[0])
            fenced_s = time.monotonic() - cut_at
            # It acknowledged while its lease stood, then refused (NOT_LEADER_OR_FOLLOWER) until it stopped,
            # never acknowledging again in between.
            answers = [error for _, error in probes]
            assert NOT_LEADER_OR_FOLLOWER in answers, answers
            refused_from = answers.index(NOT_LEADER_OR_FOLLOWER)
            assert set(answers[refused_from:]) == {NOT_LEADER_OR_FOLLOWER}, answers
            assert set(answers[:refused_from]) <= {NONE}, answers
            assert cluster.brokers[CUT_OFF].process.returncode == EXIT_LEASE_LOST
            assert any("is fenced and stops" in line for line in cluster.brokers[CUT_OFF].output)
            after = wait_until(lambda: served(cluster, topic, frozenset({CUT_OFF})),
                               lambda: f"its partitions served by the others:\n{describe(cluster, topic)}",
                               timeout_s=FAILOVER_S_MAX)
            failover_s = time.monotonic() - cut_at
            for p in cut_off_partitions:
                assert after[p].leader_id != CUT_OFF and after[p].leader_epoch > before[p].leader_epoch
            wait_until(lambda: load.acked_count() >= acked_at_cut + AFTER_STEP_RECORDS,
                       "acknowledgements after the failover", timeout_s=120)
            # Its incarnation's lease was never renewed again, and its log was replayed by another.
            assert lease_expiry_ms(faulty.postgres, CUT_OFF)[0] == epoch
            with psycopg.connect(faulty.postgres.dsn) as conn:
                state = conn.execute("SELECT state FROM cluster_logs WHERE broker_id = %s AND epoch = %s",
                                     (CUT_OFF, epoch)).fetchone()
            assert state == ("recovered",)
        finally:
            faulty.namespace.mend("db")
        assert restart_exited(cluster) == [CUT_OFF]   # a new incarnation, through the mended link
        wait_until(lambda: balanced(cluster, topic), "the restarted broker leading partitions again",
                   timeout_s=120)
        acked_at_return = load.acked_count()
        wait_until(lambda: load.acked_count() >= acked_at_return + AFTER_STEP_RECORDS,
                   "acknowledgements after it came back", timeout_s=120)
        counts = settle(load, reader, cluster, topic, group)
        log = read_log(cluster.bootstrap(), topic, PARTITIONS)
        acked_probes = {value for value, error in probes if error == NONE}
        assert acked_probes <= set(log[cut_off_partitions[0]])
    finally:
        load.kill()
    print(f"\npartition: {len(acked_probes)} probes acknowledged after the cut, "
          f"{answers.count(NOT_LEADER_OR_FOLLOWER)} refused; broker {CUT_OFF} stopped {fenced_s:.1f} s after the "
          f"cut, its partitions served by others after {failover_s:.1f} s; {counts}", file=sys.stderr)
    assert (counts.lost, counts.log_duplicates, counts.out_of_order) == (0, 0, 0)
    assert counts.acknowledged > 3 * AFTER_STEP_RECORDS


@pytest.mark.slow
def test_a_restart_of_the_database_under_load_loses_nothing(whole: FaultyCluster) -> None:
    faulty = whole
    cluster, topic, group = faulty.cluster, "db-restart", "db-restart-readers"
    create_topic(cluster, topic)
    load = Load(cluster.bootstrap(), topic, PARTITIONS, ROUND_S)
    try:
        reader = GroupReader(cluster.bootstrap(), topic, group)
        wait_until(lambda: load.acked_count() >= AFTER_STEP_RECORDS and reader.read_count() >= 200,
                   "records acknowledged and read before the restart")
        committed_before = committed(cluster.bootstrap(), topic, PARTITIONS, group)
        faulty.postgres.restart()
        # A restart shorter than the lease costs nothing; a longer one fences every broker (exit 75),
        # which its supervisor starts again: either way the load must go on.
        acked_at_restart = load.acked_count()
        restarted: list[int] = []

        def carried_on() -> bool:
            restarted.extend(restart_exited(cluster))
            return load.acked_count() >= acked_at_restart + AFTER_STEP_RECORDS

        wait_until(carried_on, "acknowledgements after the database came back", timeout_s=180)
        wait_until(lambda: restart_exited(cluster) == [] and balanced(cluster, topic),
                   lambda: f"every partition served, two by each broker:\n{describe(cluster, topic)}", timeout_s=120)
        assert all(o >= committed_before[p]
                   for p, o in committed(cluster.bootstrap(), topic, PARTITIONS, group).items())
        counts = settle(load, reader, cluster, topic, group)
    finally:
        load.kill()
    print(f"\ndatabase restart: brokers fenced and started again: {restarted}; {counts}", file=sys.stderr)
    assert (counts.lost, counts.log_duplicates, counts.out_of_order) == (0, 0, 0)


@pytest.mark.slow
def test_an_object_store_that_hangs_then_restarts_under_load_loses_nothing(whole: FaultyCluster) -> None:
    faulty = whole
    cluster, topic, group = faulty.cluster, "s3-faults", "s3-faults-readers"
    create_topic(cluster, topic)
    load = Load(cluster.bootstrap(), topic, PARTITIONS, ROUND_S)
    restarted: list[int] = []
    # A put that fails for good stops that broker's store: it leaves, and its supervisor starts it again.
    either = frozenset({EXIT_LEASE_LOST, EXIT_STORE_FAILED})
    try:
        reader = GroupReader(cluster.bootstrap(), topic, group)
        wait_progressing(lambda: load.acked_count() >= AFTER_STEP_RECORDS and reader.read_count() >= 200,
                         lambda: (load.acked_count(), reader.read_count()),
                         "records acknowledged and read before the object store hangs")
        faulty.s3.pause()
        try:
            # Hung puts: acknowledgements stop (the log's puts wait; nothing is acknowledged past them).
            seen = [load.acked_count(), time.monotonic()]

            def acks_stopped() -> bool:
                now, count = time.monotonic(), load.acked_count()
                if count != seen[0]:
                    seen[:] = [count, now]
                return now - seen[1] >= STALL_S
            wait_until(acks_stopped, f"no acknowledgement for {STALL_S:g} s while the object store hangs",
                       timeout_s=60)
        finally:
            faulty.s3.resume()
        acked_at_resume = load.acked_count()

        def carried_on(mark: int) -> bool:
            restarted.extend(restart_exited(cluster, either))
            return load.acked_count() >= mark + AFTER_STEP_RECORDS

        wait_until(lambda: carried_on(acked_at_resume), "acknowledgements after the object store answered again",
                   timeout_s=180)
        faulty.s3.stop()
        faulty.s3.start()   # on the same ports, with the same objects
        acked_at_restart = load.acked_count()
        wait_until(lambda: carried_on(acked_at_restart), "acknowledgements after the object store restarted",
                   timeout_s=180)
        wait_until(lambda: restart_exited(cluster, either) == [] and balanced(cluster, topic),
                   lambda: f"every partition served, two by each broker:\n{describe(cluster, topic)}", timeout_s=120)
        counts = settle(load, reader, cluster, topic, group)
    finally:
        faulty.s3.resume()
        load.kill()
    print(f"\nobject store hung and restarted: brokers stopped and started again: {restarted}; {counts}",
          file=sys.stderr)
    assert (counts.lost, counts.log_duplicates, counts.out_of_order) == (0, 0, 0)
