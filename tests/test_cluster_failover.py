"""Failover at the store level, against a real PostgreSQL: a broker dies with acknowledged records only in
its object log; its partitions wait until a survivor has replayed that log; then the survivor takes them
over and serves every acknowledged record exactly once, in order. A replay cut short is done again by
the next claimant without duplicating what was committed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from enginekit import MemoryStore, abandon, small_store_config
from stratalog.cluster.assignment import Holder, Kind, MoveType, Resource
from stratalog.cluster.failover import log_owner, replay_dead_log, sweep_finished_logs
from stratalog.cluster.leases import Cluster, LeaseLostError
from stratalog.engine import StreamStore
from stratalog.engine.metadata import Metadata
from stratalog.errors import WALFailedError
from stratalog.objects.faulty import FaultyStore, ObjectFaultPlan
from stratalog.wal.config import ObjectWALConfig
from stratalog.wal.object_wal import ObjectWAL
from waiting import wait_until

pytest_plugins = ["pgkit"]

#: The lease of a broker a test lets die: renewed four times per lease, it outlives a loaded machine's
#: pauses, and runs out within seconds once renewals stop.
SHORT_LEASE_MS = 2000
LONG_LEASE_MS = 60_000
TOPIC_PARTITIONS = 3


def partitions() -> list[Resource]:
    return [Resource(Kind.PARTITION, f"t/{p}") for p in range(TOPIC_PARTITIONS)]


def wal_config() -> ObjectWALConfig:
    return ObjectWALConfig(linger_s=0.001, object_bytes_soft_max=16 << 10, put_retry_s_min=0.0)


class Broker:
    """What a broker keeps for failover: its lease, and a stream store on its own object log."""

    def __init__(self, pg_database: str, broker_id: int, lease_ms: int, objects: MemoryStore, data_dir: Path) -> None:
        self.cluster = Cluster(pg_database, broker_id, lease_ms)
        self.epoch = self.cluster.join("127.0.0.1", 9000 + broker_id)
        self.paused = threading.Event()
        self.lost: LeaseLostError | None = None
        self._renewer = threading.Thread(target=self._renew, daemon=True)
        self._renewer.start()
        wal = ObjectWAL.open(objects, log_owner(broker_id, self.epoch), wal_config())
        self.store = StreamStore.open(data_dir, objects, small_store_config(), metadata=pg_database,
                                      fence=self.cluster.stream_fence, wal=wal)

    def _renew(self) -> None:
        while not self.paused.wait(self.cluster.lease_ms / 4000):
            try:
                self.cluster.renew()
            except LeaseLostError as e:          # checked by close(): a broker meant to live lost its lease
                self.lost = e
                return

    def die(self) -> None:
        """kill -9: no more renewals, no final upload; its log keeps what was not uploaded."""
        self.paused.set()
        self._renewer.join()
        abandon(self.store)
        self.cluster.close()

    def close(self) -> None:
        self.paused.set()
        self._renewer.join()
        assert self.lost is None, f"a broker meant to stay alive lost its lease: {self.lost}"
        self.store.close()
        self.cluster.leave(clean=True)
        self.cluster.close()


def values(store: StreamStore, name: str) -> list[bytes]:
    return [r.value for r in store.open_stream(name).fetch(0, max_bytes=1 << 30)]


def test_a_dead_brokers_acknowledged_records_are_replayed_before_its_partitions_move(
        pg_database: str, tmp_path: Path) -> None:
    objects = MemoryStore()
    first = Broker(pg_database, 1, SHORT_LEASE_MS, objects, tmp_path / "b1")
    streams = first.store.create_streams([r.name for r in partitions()])
    assert [m.type for m in first.cluster.reconcile(partitions())] == [MoveType.TAKEOVER] * TOPIC_PARTITIONS
    expected: dict[str, list[bytes]] = {s.name: [] for s in streams if s.name}
    for i in range(30):
        for s in streams:
            s.append([f"{s.name}:{i}".encode()]).result()
            expected[str(s.name)].append(f"{s.name}:{i}".encode())
        if i == 9:
            first.store.flush()                   # 0..9 committed; 10..29 acknowledged, in the log alone
    first.die()

    second = Broker(pg_database, 2, LONG_LEASE_MS, objects, tmp_path / "b2")
    try:
        wait_until(lambda: 1 not in second.cluster.live(), "broker 1's lease to run out")
        assert second.cluster.reconcile(partitions()) == [], "nobody serves them before the replay"
        replayed = replay_dead_log(second.cluster, objects, pg_database, tmp_path / "scratch", small_store_config(),
                                   wal_config())
        assert replayed is not None and replayed.dead == Holder(1, 1)
        assert replayed.report.batches_replayed == 20 * TOPIC_PARTITIONS
        assert replay_dead_log(second.cluster, objects, pg_database, tmp_path / "scratch") is None
        moves = second.cluster.reconcile(partitions())
        assert [m.to for m in moves] == [Holder(2, second.epoch)] * TOPIC_PARTITIONS
        # The survivor's store sees what the replay committed (it reads the metadata anew at open).
        second.store.close()
        second.store = StreamStore.open(tmp_path / "b2", objects, small_store_config(), metadata=pg_database,
                                        fence=second.cluster.stream_fence,
                                        wal=ObjectWAL.open(objects, log_owner(2, second.epoch), wal_config()))
        for name, want in expected.items():
            assert values(second.store, name) == want, name
            second.store.open_stream(name).append([b"after failover"]).result()
        second.store.flush()                      # it leads them now: its commits pass the fence
        assert all(values(second.store, n)[-1] == b"after failover" for n in expected)
        assert not [i.key for i in objects.list(f"wal/{log_owner(1, 1)}/") if not i.key.endswith("/trim")]
    finally:
        second.close()


def died_with_records(pg_database: str, objects: MemoryStore, data_dir: Path, records: int) -> Broker:
    """Broker 1, dead (kill -9) after appending ``records`` records to t/0, which it held: all in its log."""
    first = Broker(pg_database, 1, SHORT_LEASE_MS, objects, data_dir)
    (stream,) = first.store.create_streams(["t/0"])
    first.cluster.reconcile([Resource(Kind.PARTITION, "t/0")])
    for i in range(records):
        stream.append([f"{i}".encode()]).result()
    first.die()
    return first


def test_a_replay_cut_short_is_done_again_without_duplicates(pg_database: str, tmp_path: Path) -> None:
    objects = MemoryStore()
    died_with_records(pg_database, objects, tmp_path / "b1", 40)

    second = Broker(pg_database, 2, SHORT_LEASE_MS, objects, tmp_path / "b2")
    wait_until(lambda: 1 not in second.cluster.live(), "broker 1's lease to run out")
    # The first claimant's puts fail after its first (the replayed object, then committed): the log's trim
    # marker is refused, the replay stops and the log stays open, its records already in objects.
    faulty = FaultyStore(objects, plan=ObjectFaultPlan(fail_before={"put": set(range(2, 10_000))}))
    with pytest.raises(WALFailedError, match="injected fault"):
        replay_dead_log(second.cluster, faulty, pg_database, tmp_path / "scratch",
                        small_store_config(upload_attempts_max=1, upload_bytes_threshold=1 << 10),
                        wal_config())
    meta = Metadata(pg_database)
    assert meta.stream("t/0").committed_end_offset == 40, "the replay committed before it failed"
    meta.close()
    second.die()                                # and it dies holding the claim

    third = Broker(pg_database, 3, LONG_LEASE_MS, objects, tmp_path / "b3")
    try:
        wait_until(lambda: 2 not in third.cluster.live(), "broker 2's lease to run out")
        done = []
        while (replayed := replay_dead_log(third.cluster, objects, pg_database, tmp_path / "scratch",
                                           small_store_config(), wal_config())) is not None:
            done.append(replayed.dead)
        assert Holder(1, 1) in done
        third.cluster.reconcile([Resource(Kind.PARTITION, "t/0")])
        third.store.close()
        third.store = StreamStore.open(tmp_path / "b3", objects, small_store_config(), metadata=pg_database,
                                       fence=third.cluster.stream_fence,
                                       wal=ObjectWAL.open(objects, log_owner(3, third.epoch), wal_config()))
        assert values(third.store, "t/0") == [f"{i}".encode() for i in range(40)]
    finally:
        third.close()


def test_objects_left_under_finished_logs_are_swept_and_no_others(pg_database: str, tmp_path: Path) -> None:
    objects = MemoryStore()
    first = died_with_records(pg_database, objects, tmp_path / "b1", 20)
    dead_log = f"wal/{log_owner(1, first.epoch)}/"

    def keys(prefix: str = "") -> set[str]:
        return {i.key for i in objects.list(prefix)}

    second = Broker(pg_database, 2, LONG_LEASE_MS, objects, tmp_path / "b2")
    try:
        wait_until(lambda: 1 not in second.cluster.live(), "broker 1's lease to run out")
        assert keys(dead_log) and sweep_finished_logs(second.cluster, objects) == 0, "a log not replayed stays"
        replayed = replay_dead_log(second.cluster, objects, pg_database, tmp_path / "scratch", small_store_config(),
                                   wal_config())
        assert replayed is not None and replayed.dead == Holder(1, first.epoch)
        objects.put(dead_log + "00000000000000ff", b"put by broker 1, cut off, after the replay")
        (live,) = second.store.create_streams(["t/1"])
        second.cluster.reconcile([Resource(Kind.PARTITION, f"t/{p}") for p in range(2)])
        live.append([b"in broker 2's log only"]).result()
        second_log = keys(f"wal/{log_owner(2, second.epoch)}/")
        others = keys() - keys(dead_log)
        assert sweep_finished_logs(second.cluster, objects) >= 1
        assert keys(dead_log) == set()
        assert keys() == others and keys(f"wal/{log_owner(2, second.epoch)}/") == second_log, \
            "nothing but the finished log's objects went"
        second.store.reload_stream("t/0")
        assert values(second.store, "t/0") == [f"{i}".encode() for i in range(20)]
    finally:
        second.close()
