"""Leases and holders in a real PostgreSQL server (cluster/leases.py): joins, renewals and lost leases on
the database's clock; takeovers that raise the leader epoch; handoffs carried out by their holder; and the
fence: a broker that lost a partition can no longer commit for it, even while it still runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest

from enginekit import MemoryStore, small_store_config
from stratalog.broker.cluster_ownership import ClusterOwnership
from stratalog.broker.listeners import Listener
from stratalog.broker.offsets import CommittedOffsets, OffsetEntry
from stratalog.cluster.assignment import Holder, Kind, MoveType, Resource
from stratalog.cluster.leases import BrokerIdTakenError, Cluster, LeaseLostError, NotHolderError
from stratalog.engine import StreamStore
from waiting import wait_until

pytest_plugins = ["pgkit"]

#: Short enough for a test to watch a lease run out within seconds; long enough that a loaded machine
#: gets a broker's next steps (or renewals, four per lease) done before it does.
SHORT_LEASE_MS = 2000
LONG_LEASE_MS = 60_000


@pytest.fixture
def brokers() -> Iterator[list[Cluster]]:
    """The brokers a test makes (with make_broker), closed after it."""
    made: list[Cluster] = []
    yield made
    for cluster in made:
        cluster.close()


def make_broker(made: list[Cluster], pg_database: str, broker_id: int, lease_ms: int = LONG_LEASE_MS) -> Cluster:
    cluster = Cluster(pg_database, broker_id, lease_ms)
    made.append(cluster)
    cluster.join("127.0.0.1", 9000 + broker_id)
    return cluster


def partitions(n: int) -> list[Resource]:
    return [Resource(Kind.PARTITION, f"t/{p}") for p in range(n)]


def test_a_join_is_a_new_incarnation_and_an_id_is_one_brokers(brokers: list[Cluster], pg_database: str) -> None:
    first = make_broker(brokers, pg_database, 1)
    assert first.epoch == 1
    assert set(first.live()) == {1}
    with pytest.raises(BrokerIdTakenError, match=r"broker id 1 is live at 127\.0\.0\.1:9001"):
        make_broker(brokers, pg_database, 1)
    first.leave(clean=True)
    again = make_broker(brokers, pg_database, 1)
    assert again.epoch == 2 and first.live()[1].epoch == 2


def test_a_lease_not_renewed_runs_out_and_its_broker_is_fenced(brokers: list[Cluster], pg_database: str) -> None:
    short = make_broker(brokers, pg_database, 1, SHORT_LEASE_MS)
    other = make_broker(brokers, pg_database, 2)
    short.renew()
    wait_until(lambda: 1 not in other.live(), "broker 1's lease to run out on the database's clock")
    with pytest.raises(LeaseLostError, match="must stop serving and join again"):
        short.renew()


def test_takeovers_raise_the_leader_epoch_and_fence_the_old_holder(brokers: list[Cluster], pg_database: str) -> None:
    b1 = make_broker(brokers, pg_database, 1, SHORT_LEASE_MS)
    res = partitions(4)
    moves = b1.reconcile(res)
    assert [m.type for m in moves] == [MoveType.TAKEOVER] * 4
    assert all(h.holder == Holder(1, 1) and h.leader_epoch == 1 for h in b1.holds().values())
    with b1.fenced(Kind.PARTITION, ["t/0", "t/1"]):
        pass                                                # it holds them: the fence lets it commit
    b2 = make_broker(brokers, pg_database, 2)
    wait_until(lambda: 1 not in b2.live(), "broker 1's lease to run out")
    assert b2.reconcile(res) == [], "a dead broker's partitions wait until its log is replayed"
    dead = b2.claim_dead_log()
    assert dead == Holder(1, 1)
    b2.finish_recovery(dead)
    assert b2.claim_dead_log() is None
    moves = b2.reconcile(res)
    assert {m.resource for m in moves} == set(res) and all(m.to == Holder(2, 1) for m in moves)
    assert all(h.holder == Holder(2, 1) and h.leader_epoch == 2 for h in b2.holds().values())
    # Broker 1 still runs (it paused past its lease): its commits for the partitions are refused.
    with pytest.raises(LeaseLostError), b1.fenced(Kind.PARTITION, ["t/0"]):
        pass
    b1.join("127.0.0.1", 9001)                               # a new incarnation holds nothing yet
    with pytest.raises(NotHolderError, match="no longer holds"), b1.fenced(Kind.PARTITION, ["t/0"]):
        pass


def test_a_claimed_log_is_the_claimants_to_retry_until_its_lease_runs_out(brokers: list[Cluster],
                                                                          pg_database: str) -> None:
    dead_one = make_broker(brokers, pg_database, 1, SHORT_LEASE_MS)
    dead_one.reconcile(partitions(2))
    b3 = make_broker(brokers, pg_database, 3)
    wait_until(lambda: 1 not in b3.live(), "broker 1's lease to run out")
    b2 = make_broker(brokers, pg_database, 2, SHORT_LEASE_MS)
    assert b2.claim_dead_log() == Holder(1, 1)
    # Its replay failed (no finish_recovery): it claims the same log again at its next try, and nobody
    # else may while it lives.
    assert b3.claim_dead_log() is None
    assert b2.claim_dead_log() == Holder(1, 1)
    wait_until(lambda: 2 not in b3.live(), "broker 2's lease to run out")
    assert b3.claim_dead_log() == Holder(1, 1)            # a claimant that died loses its claim
    b3.finish_recovery(Holder(1, 1))
    assert b3.claim_dead_log() == Holder(2, 1)            # the next: broker 2's own


def test_a_fenced_transaction_writes_nothing(brokers: list[Cluster], pg_database: str) -> None:
    b1 = make_broker(brokers, pg_database, 1)
    b1.reconcile(partitions(1))
    with pytest.raises(NotHolderError), b1.fenced(Kind.PARTITION, ["t/0", "t/9"]) as db:
        db.execute("CREATE TABLE written (x INTEGER)")
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT to_regclass('written')").fetchone() == (None,)


def test_a_joining_broker_gets_its_share_by_handoffs_its_holder_makes(brokers: list[Cluster],
                                                                    pg_database: str) -> None:
    b1 = make_broker(brokers, pg_database, 1)
    res = partitions(4)
    b1.reconcile(res)
    b2 = make_broker(brokers, pg_database, 2)
    moves = b2.reconcile(res)
    assert [m.type for m in moves] == [MoveType.HANDOFF] * 2
    assert b2.reconcile(res) == [], "a handoff under way is not planned twice"
    moving = [m.resource for m in moves]
    with pytest.raises(NotHolderError):
        b2.release(moving[0])                                # only the holder hands over
    for resource in moving:
        hold = b1.release(resource)
        assert hold.holder == Holder(2, 1) and hold.leader_epoch == 2 and hold.handing_to is None
    holders = [h.holder for h in b1.holds().values()]
    assert holders.count(Holder(1, 1)) == 2 and holders.count(Holder(2, 1)) == 2
    with pytest.raises(NotHolderError):
        b1.release(moving[0])                                # nothing left to hand over


def test_concurrent_reconciles_agree(brokers: list[Cluster], pg_database: str) -> None:
    members = [make_broker(brokers, pg_database, i) for i in range(3)]
    res = partitions(30)
    done = threading.Barrier(3)

    def run(cluster: Cluster) -> None:
        done.wait()
        cluster.reconcile(res)

    threads = [threading.Thread(target=run, args=(c,)) for c in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    holds = members[0].holds()
    assert len(holds) == 30 and all(h.leader_epoch == 1 for h in holds.values()), "each taken over once"
    per_broker = [sum(1 for h in holds.values() if h.holder is not None and h.holder.broker_id == i)
                  for i in range(3)]
    assert per_broker == [10, 10, 10]


def test_a_broker_that_lost_its_partition_commits_nothing_for_it(brokers: list[Cluster], pg_database: str,
                                                                 tmp_path: Path) -> None:
    """Two stores over one pg_database and one object store, as two brokers: the first leads t/0 until its
    lease runs out and the second takes t/0 over; the first, still running, then fails its upload instead
    of committing, and the second carries on from what was committed."""
    objects = MemoryStore()
    config = small_store_config(upload_attempts_max=2)
    b1 = make_broker(brokers, pg_database, 1, SHORT_LEASE_MS)
    paused = threading.Event()

    def renew_until_paused() -> None:      # as a broker does, four times per lease
        while not paused.wait(SHORT_LEASE_MS / 4000):
            b1.renew()

    renewer = threading.Thread(target=renew_until_paused)
    renewer.start()
    first = StreamStore.open(tmp_path / "b1", objects, config, metadata=pg_database, fence=b1.stream_fence)
    stream = first.create_stream("t/0")
    b1.reconcile(partitions(1))
    for i in range(10):
        stream.append([f"{i}".encode()]).result()
    first.flush()                                              # it holds t/0: committed
    paused.set()                                               # it pauses: no more renewals
    renewer.join()
    b2 = make_broker(brokers, pg_database, 2)
    wait_until(lambda: 1 not in b2.live(), "broker 1's lease to run out")
    dead = b2.claim_dead_log()
    assert dead is not None
    b2.finish_recovery(dead)            # its log is on its own disk here: the fence is what is tested
    assert [m.to for m in b2.reconcile(partitions(1))] == [Holder(2, 1)]
    stream.append([b"from a broker that lost t/0"]).result()  # durable in its own WAL only
    with pytest.raises(LeaseLostError):
        first.flush()
    with pytest.raises(LeaseLostError):
        first.close()                                          # its last upload is refused too
    with StreamStore.open(tmp_path / "b2", objects, config, metadata=pg_database, fence=b2.stream_fence) as second:
        taken = second.open_stream("t/0")
        assert [r.value for r in taken.fetch(0)] == [f"{i}".encode() for i in range(10)]
        taken.append([b"10"]).result()
        second.flush()
        assert [r.value for r in taken.fetch(0)][-1] == b"10"


def test_only_the_groups_coordinator_commits_its_offsets(brokers: list[Cluster], pg_database: str) -> None:
    b1 = make_broker(brokers, pg_database, 1)
    group, other = Resource(Kind.GROUP, "readers"), Resource(Kind.GROUP, "others")
    b1.reconcile([group, other])
    offsets = CommittedOffsets(pg_database)
    try:
        offsets.fence = b1.group_fence
        offsets.commit("readers", [OffsetEntry("t", 0, 10, -1, None, 0)])
        b2 = make_broker(brokers, pg_database, 2)
        b2.reconcile([group, other])           # two groups, two brokers: the last by name moves
        (moved,) = [r for r, h in b2.holds(Kind.GROUP).items() if h.handing_to is not None]
        assert moved == group
        b1.release(group)                                          # the handoff, as its holder makes it
        # Broker 1 still runs and commits for the group it no longer coordinates: refused, nothing stored.
        with pytest.raises(NotHolderError, match="no longer coordinates group 'readers'"):
            offsets.commit("readers", [OffsetEntry("t", 0, 99, -1, None, 0)])
        assert offsets.fetch("readers")[("t", 0)].offset == 10
        offsets.fence = b2.group_fence
        offsets.commit("readers", [OffsetEntry("t", 0, 20, -1, None, 0)])
        assert offsets.fetch("readers")[("t", 0)].offset == 20
    finally:
        offsets.close()


def test_each_listener_is_registered_and_a_client_is_told_the_one_of_its_protocol(brokers: list[Cluster],
                                                                                  pg_database: str) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:   # a table made before listeners were kept
        conn.execute("CREATE TABLE cluster_brokers (broker_id BIGINT PRIMARY KEY, epoch BIGINT NOT NULL, "
                     "host TEXT NOT NULL, port BIGINT NOT NULL, lease_expires_ms BIGINT NOT NULL, "
                     "left_clean BIGINT NOT NULL DEFAULT 0)")
    b1 = Cluster(pg_database, 1, LONG_LEASE_MS)
    brokers.append(b1)
    b1.join("10.0.0.1", 9092, [("PLAINTEXT", "10.0.0.1", 9092), ("SASL_SSL", "kafka-1.example", 9093)])
    make_broker(brokers, pg_database, 2)                        # no listeners given: its host and port
    live = b1.live()
    assert live[1].listeners == (("PLAINTEXT", "10.0.0.1", 9092), ("SASL_SSL", "kafka-1.example", 9093))
    assert live[1].endpoint("SASL_SSL") == ("kafka-1.example", 9093)
    assert live[1].endpoint("PLAINTEXT") == ("10.0.0.1", 9092)
    assert live[1].endpoint("SSL") == ("10.0.0.1", 9092), "no listener of that protocol: the first"
    assert live[2].endpoint("SASL_SSL") == ("127.0.0.1", 9002)
    ownership = ClusterOwnership(SimpleNamespace(live=live))  # type: ignore[arg-type]  # the node's live brokers
    tls_client = Listener.parse("SASL_SSL://0.0.0.0:9093")
    assert ownership.brokers(tls_client) == [(1, "kafka-1.example", 9093), (2, "127.0.0.1", 9002)]


def test_only_a_transactional_ids_holder_changes_it_or_forgets_it(brokers: list[Cluster], pg_database: str) -> None:
    b1, b2 = make_broker(brokers, pg_database, 1), make_broker(brokers, pg_database, 2)
    txn = Resource(Kind.TRANSACTION, "tx")
    b1.reconcile([txn])
    holder, other = (b1, b2) if b1.holds()[txn].holder == Holder(1, 1) else (b2, b1)
    with holder.fenced(Kind.TRANSACTION, ["tx"]) as db:
        holder.txn_fence(db, "tx")                           # its coordinator: the change commits
    with pytest.raises(NotHolderError, match="no longer coordinates transaction 'tx'"), \
            other.fenced(Kind.TRANSACTION, []) as db:
        other.txn_fence(db, "tx")
    assert not other.forget(txn), "only its holder forgets it"
    assert holder.forget(txn)
    assert txn not in holder.holds()
    holder.reconcile([txn])                                  # asked for again: given a holder anew
    assert txn in holder.holds()
