"""The broker's tables on SQLite and on PostgreSQL (a real server on 127.0.0.1, pgkit.py).

The cases of test_broker_offsets.py, test_broker_acls.py and test_broker_quotas.py run here again, on both
databases: this module's ``store``, ``authorizer`` and ``quotas`` fixtures are parametrized by database.
Beside them: what those files test through a SQLite path of their own (reopening, schema versions),
topics and producer snapshots, two brokers' registries on one database, a database out of reach, and the
data directory files the code before PostgreSQL wrote (tests/data/broker-tables-v1), which must open as
they are.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from stratalog.broker.acls import AclFilter, Authorizer, AuthorizerConfig, Operation, PatternType, Permission
from stratalog.broker.credentials import CredentialStore, ScramMechanism, password_matches
from stratalog.broker.metadata_db import BrokerTables
from stratalog.broker.offsets import (
    CommittedOffsets,
    OffsetEntry,
    OffsetMetadataTooLargeError,
    OffsetsClosedError,
    OffsetsConfig,
    OffsetsSchemaError,
    OffsetsUnavailableError,
)
from stratalog.broker.producer_recovery import ProducerSnapshots
from stratalog.broker.producers import ProducerStates
from stratalog.broker.quotas import PRODUCER_BYTE_RATE, REQUEST_RATE, QuotaConfig, Quotas
from stratalog.broker.topics import TopicExistsError, TopicRegistry
from stratalog.broker.txn_partitions import AbortedRange, PartitionTxns
from stratalog.chaos.postgres import PostgresServer
from stratalog.engine.metadata_backends import postgres_schema, without_password
from test_broker_acls import (  # the authorizer's cases, run on both databases
    acl,
    test_a_change_takes_effect_at_once_though_decisions_are_cached,  # noqa: F401
    test_a_literal_allow_gives_that_operation_on_that_name_only,  # noqa: F401
    test_deny_wins_over_allow,  # noqa: F401
    test_filters_select_as_describe_and_delete_acls_do,  # noqa: F401
    test_idempotent_write_needs_the_cluster_or_write_on_some_topic,  # noqa: F401
    test_super_users_may_do_everything,  # noqa: F401
)
from test_broker_offsets import (  # the committed offsets' cases, run on both databases
    entry,
    test_a_commit_is_fetched_back_whole_and_replaces_the_previous_one,  # noqa: F401
    test_commits_from_many_threads_all_land,  # noqa: F401
    test_deleting_a_group_a_topic_or_partitions_drops_only_those,  # noqa: F401
    test_expiry_drops_old_offsets_of_long_empty_groups_only,  # noqa: F401
    test_fetching_some_partitions_leaves_out_those_never_committed,  # noqa: F401
)
from test_broker_quotas import (  # the quotas' cases, run on both databases
    Clock,
    clock,  # noqa: F401  (a fixture the quota cases take)
    test_the_most_specific_entity_wins_in_kafkas_order,  # noqa: F401
    test_the_rate_forgets_what_falls_out_of_its_windows,  # noqa: F401
    test_throttle_time_is_the_excess_over_the_quota_times_the_span,  # noqa: F401
)
from waiting import wait_until

pytest_plugins = ["pgkit"]

#: Files the broker wrote before its tables could live in PostgreSQL (see the README beside them).
V1_FILES = Path(__file__).parent / "data" / "broker-tables-v1"
V1_ORDERS_ID = uuid.UUID("d20af6c8-dbaa-4573-9355-bc5c807931b9")


@pytest.fixture
def store(tables_at: Path | str) -> Iterator[CommittedOffsets]:
    with CommittedOffsets(tables_at) as offsets:
        yield offsets


@pytest.fixture
def authorizer(tables_at: Path | str) -> Iterator[Authorizer]:
    made = Authorizer(tables_at, AuthorizerConfig(enabled=True, super_users=("User:root",)))
    yield made
    made.close()


@pytest.fixture
def quotas(tables_at: Path | str, clock: Clock) -> Iterator[Quotas]:  # noqa: F811  (the imported fixture)
    made = Quotas(tables_at, QuotaConfig(window_s=1.0, windows=11), clock_s=clock)
    yield made
    made.close()


# The SQL both databases run --------------------------------------------------------------------------------

def test_the_schema_in_postgres_words_has_bytes_and_8_byte_floats() -> None:
    assert postgres_schema("CREATE TABLE t (a BLOB NOT NULL, b REAL, c INTEGER, blobby TEXT);") == \
        "CREATE TABLE t (a BYTEA NOT NULL, b DOUBLE PRECISION, c BIGINT, blobby TEXT);"


@pytest.mark.parametrize(("uri", "shown"), [
    ("postgresql://broker:s3cret@db.example:5432/meta", "postgresql://broker@db.example:5432/meta"),
    ("postgresql://broker@db.example/meta?password=s3cret&sslmode=require",
     "postgresql://broker@db.example/meta?sslmode=require"),
    ("postgres://db.example/meta", "postgres://db.example/meta"),
])
def test_a_uri_is_shown_without_its_password(uri: str, shown: str) -> None:
    assert without_password(uri) == shown
    assert BrokerTables(Path("data"), uri).shown == shown


def test_the_broker_tables_are_files_of_the_data_directory_or_one_database() -> None:
    files = BrokerTables(Path("d"))
    assert (files.broker, files.offsets, files.producers) == (Path("d/broker.sqlite"), Path("d/offsets.sqlite"),
                                                              Path("d/producers.sqlite"))
    uri = "postgresql://u:p@h/db"
    shared = BrokerTables(Path("d"), uri)
    assert shared.broker == shared.offsets == shared.producers == uri
    with pytest.raises(ValueError, match="PostgreSQL URI") as refused:
        BrokerTables(Path("d"), "postgersql://u:hunter2@h/db")
    assert "hunter2" not in str(refused.value)


# Committed offsets ---------------------------------------------------------------------------------------

def test_offsets_survive_reopening(tables_at: Path | str) -> None:
    with CommittedOffsets(tables_at) as offsets:
        offsets.commit("g", [entry("t", 0, 42, metadata="m", leader_epoch=4)])
    with CommittedOffsets(tables_at) as reopened:
        assert reopened.fetch("g") == {("t", 0): entry("t", 0, 42, metadata="m", leader_epoch=4)}
        assert reopened.groups() == ["g"]


def test_a_commit_with_metadata_over_the_bound_stores_nothing(tables_at: Path | str) -> None:
    with CommittedOffsets(tables_at, OffsetsConfig(offset_metadata_bytes_max=8)) as offsets:
        with pytest.raises(OffsetMetadataTooLargeError):
            offsets.commit("g", [entry("t", 0, 1, metadata="ok"), entry("t", 1, 1, metadata="123456789")])
        assert offsets.fetch("g") == {}


def test_a_closed_offsets_store_refuses_calls(tables_at: Path | str) -> None:
    offsets = CommittedOffsets(tables_at)
    offsets.close()
    with pytest.raises(OffsetsClosedError):
        offsets.commit("g", [entry("t", 0, 1)])


def test_offsets_of_a_newer_schema_are_refused(tables_at: Path | str) -> None:
    CommittedOffsets(tables_at).close()
    if isinstance(tables_at, Path):
        with sqlite3.connect(tables_at) as conn:
            conn.execute("PRAGMA user_version=2")
    else:
        with psycopg.connect(tables_at, autocommit=True) as conn:
            conn.execute("UPDATE schema_versions SET version = 2 WHERE name = 'committed_offsets'")
    with pytest.raises(OffsetsSchemaError, match="schema version 2") as refused:
        CommittedOffsets(tables_at)
    if isinstance(tables_at, str):
        password = urlsplit(tables_at).password
        assert password and password not in str(refused.value), "a URI is named without its password"


def test_offsets_out_of_reach_fail_the_call_and_come_back_with_the_database(
        pg_server: PostgresServer, pg_database: str) -> None:
    with CommittedOffsets(pg_database) as offsets:
        offsets.commit("g", [entry("t", 0, 1)])
        pg_server.stop()
        try:
            with pytest.raises(OffsetsUnavailableError) as failed:
                offsets.commit("g", [entry("t", 0, 2)])
            assert pg_server.password not in str(failed.value)
            with pytest.raises(OffsetsUnavailableError):
                offsets.fetch("g")
        finally:
            pg_server.start()
        assert offsets.fetch("g") == {("t", 0): entry("t", 0, 1)}, "the failed commit stored nothing"
        offsets.commit("g", [entry("t", 0, 3)])
        assert offsets.fetch("g") == {("t", 0): entry("t", 0, 3)}


def _accepts(uri: str) -> bool:
    try:
        with psycopg.connect(uri) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


@pytest.mark.parametrize("how", ["restart", "a backend killed"])
def test_tables_opened_before_a_database_restart_work_at_their_first_call_after_it(
        pg_server: PostgresServer, pg_database: str, how: str) -> None:
    registry, offsets = TopicRegistry(pg_database), CommittedOffsets(pg_database)
    credentials = CredentialStore(pg_database)
    try:
        registry.add("before", 1, {})
        if how == "restart":
            pg_server.restart()   # every idle connection is told it ends, at its next use
        else:
            # The registry's backend dies without a word (the OOM killer's way); PostgreSQL then restarts
            # every other backend, whose connections are told so.
            pid = registry._db.execute("SELECT pg_backend_pid()").fetchone()[0]
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: _accepts(pg_database), "PostgreSQL accepting connections after a backend's crash")
        registry.add("after", 1, {})
        assert registry.next_counter("producer_id") == 0
        offsets.commit("g", [entry("after", 0, 1)])
        assert credentials.users() == {}
    finally:
        registry.close()
        offsets.close()
        credentials.close()


# Topics, counters, doomed streams ------------------------------------------------------------------------

def test_topics_survive_reopening_with_their_ids_partitions_and_configs(tables_at: Path | str) -> None:
    registry = TopicRegistry(tables_at)
    orders = registry.add("orders", 3, {"retention.ms": "1000"})
    registry.add("gone", 2, {})
    registry.set_partitions("orders", 5)
    registry.set_configs("orders", {"retention.bytes": "10"})
    registry.remove("gone")
    registry.close()

    again = TopicRegistry(tables_at)
    try:
        got = again.get("orders")
        assert got is not None and got.topic_id == orders.topic_id
        assert (got.partitions, got.configs) == (5, {"retention.bytes": "10"})
        assert again.by_id(orders.topic_id) == got and again.get("gone") is None
        assert again.doomed_streams() == ["gone/0", "gone/1"]
        again.forget_doomed(["gone/0"])
        assert again.doomed_streams() == ["gone/1"]
    finally:
        again.close()


def test_a_counter_counts_on_across_reopening(tables_at: Path | str) -> None:
    registry = TopicRegistry(tables_at)
    assert [registry.next_counter("producer_id") for _ in range(3)] == [0, 1, 2]
    assert registry.next_counter("other") == 0
    registry.close()
    again = TopicRegistry(tables_at)
    try:
        assert again.next_counter("producer_id") == 3
    finally:
        again.close()


def test_two_registries_on_one_database_never_hand_out_the_same_number(tables_at: Path | str) -> None:
    registries = [TopicRegistry(tables_at), TopicRegistry(tables_at)]
    taken: list[list[int]] = [[], []]

    def take(i: int) -> None:
        for _ in range(40):
            taken[i].append(registries[i].next_counter("producer_id"))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(taken[0] + taken[1]) == list(range(80))
    finally:
        for r in registries:
            r.close()


def test_a_topic_another_registry_made_meanwhile_exists_already(tables_at: Path | str) -> None:
    first, second = TopicRegistry(tables_at), TopicRegistry(tables_at)
    try:
        first.add("orders", 1, {})
        with pytest.raises(TopicExistsError):
            second.add("orders", 2, {})
    finally:
        first.close()
        second.close()


# Producer snapshots --------------------------------------------------------------------------------------

def test_a_producer_snapshot_is_loaded_as_saved_and_the_next_one_replaces_it(tables_at: Path | str) -> None:
    snapshots = ProducerSnapshots(tables_at)
    snapshots.save([(7, 1, 0, [(0, 4, 10)]), (8, 2, 3, [(5, 9, 20)])], {1: 11, 2: 21}, [(1, 7, 3), (2, 8, 20)])
    snapshots.save([(7, 1, 1, [(0, 4, 10), (5, 5, 15)])], {1: 16}, [(1, 7, 10)])
    snapshots.close()

    again = ProducerSnapshots(tables_at)
    try:
        states, txns = ProducerStates(10), PartitionTxns()
        assert again.load(states, txns) == {1: 16}
        assert states.entries() == [(7, 1, 1, [(0, 4, 10), (5, 5, 15)])]
        assert txns.entries() == [(1, 7, 10)], "the open transactions are the last snapshot's"
    finally:
        again.close()


def test_aborted_ranges_are_kept_once_and_go_below_a_trim(tables_at: Path | str) -> None:
    snapshots = ProducerSnapshots(tables_at)
    try:
        snapshots.add_aborted(1, [AbortedRange(5, 7, 2), AbortedRange(9, 8, 6)])
        snapshots.add_aborted(1, [AbortedRange(5, 7, 2)])     # a replay read the marker again
        snapshots.add_aborted(2, [AbortedRange(4, 7, 0)])
        snapshots.forget_aborted_before(1, 6)
        snapshots.save([], {1: 10, 2: 5})
        txns = PartitionTxns()
        snapshots.load(ProducerStates(10), txns)
        assert txns.ranges_of(1) == [AbortedRange(9, 8, 6)], "a snapshot does not replace the ranges"
        assert txns.ranges_of(2) == [AbortedRange(4, 7, 0)]
        gained = PartitionTxns()
        snapshots.load_partition(ProducerStates(10), gained, 2)
        assert gained.ranges_of(2) == [AbortedRange(4, 7, 0)] and gained.ranges_of(1) == []
    finally:
        snapshots.close()


def test_brokers_sharing_the_snapshot_replace_only_the_partitions_they_lead(tables_at: Path | str) -> None:
    first, second = ProducerSnapshots(tables_at), ProducerSnapshots(tables_at)
    try:
        first.save([(7, 1, 0, [(0, 4, 10)]), (7, 2, 0, [(0, 0, 3)])], {1: 11}, [(1, 7, 4), (2, 7, 0)],
                   partitions_only=True)
        second.save([(8, 2, 3, [(5, 9, 20)])], {2: 21}, [(2, 8, 19)], partitions_only=True)
        first.save([(7, 1, 1, [(0, 4, 10), (5, 5, 15)])], {1: 16}, [(1, 7, 15)], partitions_only=True)

        states, txns = ProducerStates(10), PartitionTxns()
        assert first.load(states, txns) == {1: 16, 2: 21}
        assert sorted(states.entries()) == [(7, 1, 1, [(0, 4, 10), (5, 5, 15)]), (8, 2, 3, [(5, 9, 20)])]
        assert sorted(txns.entries()) == [(1, 7, 15), (2, 8, 19)]
        gained, gained_txns = ProducerStates(10), PartitionTxns()
        assert second.load_partition(gained, gained_txns, 1) == 16
        assert gained.entries() == [(7, 1, 1, [(0, 4, 10), (5, 5, 15)])]
        assert gained_txns.entries() == [(1, 7, 15)]
        assert second.load_partition(ProducerStates(10), PartitionTxns(), 3) == 0     # never snapshotted
    finally:
        first.close()
        second.close()


def test_a_topic_another_broker_made_is_found_on_a_miss_and_at_a_refresh(tables_at: Path | str) -> None:
    here, there = TopicRegistry(tables_at, shared=True), TopicRegistry(tables_at)
    try:
        made = there.add("orders", 6, {})
        assert here.all() == []
        assert here.get("orders") == made                  # a miss reads the table
        there.add("payments", 2, {})
        there.set_partitions("orders", 8)
        here.refresh()
        assert [(t.name, t.partitions) for t in here.all()] == [("orders", 8), ("payments", 2)]
        alone = TopicRegistry(tables_at)
        there.add("audit", 1, {})
        assert alone.get("audit") is None                  # a broker alone trusts what it holds
        alone.close()
    finally:
        here.close()
        there.close()


# ACLs, quotas ----------------------------------------------------------------------------------------------

def test_the_offsets_of_transactions_not_ended_are_pending_for_their_group(tables_at: Path | str) -> None:
    """What OffsetFetch answers UNSTABLE_OFFSET_COMMIT for (KIP-447): a group's partitions that a
    transaction still open or preparing holds offsets for, in its own row or kept beside it by another
    broker (TxnOffsetCommit at a group coordinator that does not coordinate it); never those of an ended
    transaction or of another group."""
    from kio.schema.errors import ErrorCode

    from stratalog.broker.txn_state import PendingOffset, Txn, TxnState
    from stratalog.broker.txn_table import TxnTable

    def offset(group: str, partition: int) -> PendingOffset:
        return PendingOffset(group, "in", partition, 10, -1, None)

    table = TxnTable(tables_at)
    try:
        for txn_id, state, offsets in (("open", TxnState.ONGOING, (offset("g", 0), offset("h", 1))),
                                       ("preparing", TxnState.PREPARE_COMMIT, (offset("g", 2),)),
                                       ("aborting", TxnState.PREPARE_ABORT, (offset("g", 3),)),
                                       ("committed", TxnState.COMPLETE_COMMIT, (offset("g", 4),)),
                                       ("aborted", TxnState.COMPLETE_ABORT, (offset("g", 5),)),
                                       ("elsewhere", TxnState.ONGOING, ())):
            table.save(Txn(txn_id, len(txn_id), 0, 60_000, state, groups=("g",), offsets=offsets), 0)
        assert table.pending_offsets("g") == {("in", 0), ("in", 2), ("in", 3)}
        assert table.pending_offsets("h") == {("in", 1)}
        assert table.pending_offsets("nobody") == set()
        if isinstance(tables_at, Path):
            return   # offsets kept beside a transaction: a cluster's, always on PostgreSQL (FOR SHARE)
        taken = table.offset_commit_elsewhere("elsewhere", len("elsewhere"), 0, "g", [offset("g", 6)])
        assert taken == ErrorCode.none
        assert table.pending_offsets("g") == {("in", 0), ("in", 2), ("in", 3), ("in", 6)}
        table.save(Txn("elsewhere", len("elsewhere"), 0, 60_000, TxnState.COMPLETE_COMMIT, groups=("g",)), 0)
        assert table.pending_offsets("g") == {("in", 0), ("in", 2), ("in", 3)}, "kept beside it: gone at its end"
    finally:
        table.close()

def test_acls_survive_reopening_and_removal(tables_at: Path | str, authorizer: Authorizer) -> None:
    kept = [acl("orders", Operation.READ), acl("team.", Operation.WRITE, pattern=PatternType.PREFIXED)]
    authorizer.add([*kept, acl("orders", Operation.WRITE, Permission.DENY)])
    authorizer.remove(AclFilter(permission=Permission.DENY))
    authorizer.close()
    again = Authorizer(tables_at, AuthorizerConfig(enabled=True))
    try:
        assert sorted(again.acls(), key=str) == sorted(kept, key=str)
    finally:
        again.close()


def test_quotas_survive_reopening_and_are_removed(tables_at: Path | str, quotas: Quotas) -> None:
    entity = (("client-id", "app"), ("user", "alice"))
    quotas.alter(entity, {PRODUCER_BYTE_RATE: 5.5, REQUEST_RATE: 2.0}, [])
    quotas.alter((("user", None),), {REQUEST_RATE: 1e9 / 3}, [])
    quotas.close()
    again = Quotas(tables_at)
    try:
        assert again.entities() == {entity: {PRODUCER_BYTE_RATE: 5.5, REQUEST_RATE: 2.0},
                                    (("user", None),): {REQUEST_RATE: 1e9 / 3}}, "8-byte floats in both"
        again.alter(entity, {}, [PRODUCER_BYTE_RATE, REQUEST_RATE])
        assert again.entities() == {(("user", None),): {REQUEST_RATE: 1e9 / 3}}
    finally:
        again.close()


# Files written before ------------------------------------------------------------------------------------

def _layouts(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Each table's columns (name, type, not null, default, primary key position) and the indexes."""
    with sqlite3.connect(path) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index') "
                                            "ORDER BY name")]
        return {n: [tuple(r[1:]) for r in conn.execute(f"PRAGMA table_info('{n}')")] for n in names}


@pytest.fixture
def v1_dir(tmp_path: Path) -> Path:
    copy = tmp_path / "v1"
    shutil.copytree(V1_FILES, copy)
    return copy


def test_files_written_before_open_as_they_were(v1_dir: Path) -> None:
    topics = TopicRegistry(v1_dir / "broker.sqlite")
    try:
        orders = topics.get("orders")
        assert orders is not None and orders.topic_id == V1_ORDERS_ID
        assert (orders.partitions, orders.configs) == (3, {"retention.ms": "86400000"})
        assert topics.doomed_streams() == ["gone/0", "gone/1"]
        assert topics.next_counter("producer_id") == 2
    finally:
        topics.close()
    credentials = CredentialStore(v1_dir / "broker.sqlite")
    try:
        alice = credentials.get("alice", ScramMechanism.SCRAM_SHA_256)
        assert alice is not None and password_matches(alice, "wonderland")
        assert credentials.users() == {"alice": [(ScramMechanism.SCRAM_SHA_256, 4096)]}
    finally:
        credentials.close()
    authorizer = Authorizer(v1_dir / "broker.sqlite")
    assert authorizer.acls() == [acl("orders", Operation.READ)]
    authorizer.close()
    quotas = Quotas(v1_dir / "broker.sqlite")
    assert quotas.entities() == {(("user", "alice"),): {PRODUCER_BYTE_RATE: 1048576.5}}
    quotas.close()
    with CommittedOffsets(v1_dir / "offsets.sqlite") as offsets:
        assert offsets.fetch("g") == {("orders", 0): OffsetEntry("orders", 0, 42, 3, "note", 1700000000000)}
        offsets.commit("g", [OffsetEntry("orders", 0, 43, 3, None, 1700000000001)])
    with sqlite3.connect(v1_dir / "offsets.sqlite") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    snapshots = ProducerSnapshots(v1_dir / "producers.sqlite")
    try:
        states = ProducerStates(10)
        assert snapshots.load(states, PartitionTxns()) == {1: 20, 2: 0}
        assert states.entries() == [(7, 1, 0, [(0, 4, 10), (5, 9, 15)])]
    finally:
        snapshots.close()


def test_new_files_have_the_table_layouts_of_those_written_before(v1_dir: Path, tmp_path: Path) -> None:
    new = tmp_path / "new"
    new.mkdir()
    for close in (TopicRegistry(new / "broker.sqlite").close, CredentialStore(new / "broker.sqlite").close,
                  Authorizer(new / "broker.sqlite").close, Quotas(new / "broker.sqlite").close,
                  CommittedOffsets(new / "offsets.sqlite").close, ProducerSnapshots(new / "producers.sqlite").close):
        close()
    for name in ("broker.sqlite", "offsets.sqlite", "producers.sqlite"):
        old = _layouts(v1_dir / name)
        assert {n: layout for n, layout in _layouts(new / name).items() if n in old} == old, name


def test_tables_added_since_are_made_in_files_written_before(v1_dir: Path, tmp_path: Path) -> None:
    """The open transactions and aborted ranges came after: an old producers.sqlite gets them as a new one."""
    new = tmp_path / "new"
    new.mkdir()
    ProducerSnapshots(new / "producers.sqlite").close()
    ProducerSnapshots(v1_dir / "producers.sqlite").close()
    layouts = _layouts(v1_dir / "producers.sqlite")
    assert layouts == _layouts(new / "producers.sqlite")
    assert {"producer_snapshot_txns", "aborted_ranges"} <= layouts.keys()
