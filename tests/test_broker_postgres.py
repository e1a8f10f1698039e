"""`stratalog serve --metadata postgresql://...`: a real broker process whose topics, offsets, producer
snapshots and stream metadata live in a real PostgreSQL server (pgkit.py), both on 127.0.0.1.

Everything a client did is there after a restart of the broker, nothing of it is in SQLite files, and
the password is never printed. While PostgreSQL restarts, an offset commit is refused with a retriable
error (never acknowledged without being stored) and commits work again once it is back.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
from click.testing import CliRunner
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.list_groups.v4.request import ListGroupsRequest
from kio.schema.offset_commit.v2.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v3.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64, i64Timedelta

from brokerkit import BrokerProcess, running_broker, start_broker
from kafkaclients import Client, Outgoing, consume_until, make_client
from stratalog.chaos.postgres import PostgresServer
from stratalog.commands.serve import load_config
from stratalog.commands.users import users
from stratalog.kafka.client import KafkaConnection
from waiting import wait_until

pytest_plugins = ["pgkit"]

OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, LIST_GROUPS = 8, 9, 15, 16
COORDINATOR_NOT_AVAILABLE = 15
#: Enough upload attempts, backing off from 0.2 s, to outlast a PostgreSQL restart on a loaded machine.
OUTLASTING_CONFIG = "[store]\nupload_attempts_max = 12\n"


@pytest.fixture
def client() -> Iterator[Client]:
    made = make_client("confluent-kafka")
    yield made
    made.close()


def _rows(uri: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(uri) as conn:
        return conn.execute(sql).fetchall()


def _values(n: int, first: int = 0) -> list[bytes]:
    return [f"v{i}".encode() for i in range(first, first + n)]


def test_a_broker_over_postgres_keeps_topics_records_and_offsets_across_a_restart(
        tmp_path: Path, pg_server: PostgresServer, pg_database: str, client: Client) -> None:
    data_dir = tmp_path / "data"
    with running_broker(data_dir, "--metadata", pg_database) as broker:
        client.create_topic(broker.bootstrap, "orders", 2)
        producer = client.producer(broker.bootstrap, idempotent=True)
        producer.send_all([Outgoing(i % 2, None, v) for i, v in enumerate(_values(20))], "orders")
        producer.close()
        consumer = client.consumer(broker.bootstrap, "g", ["orders"])
        got = consume_until([consumer], 20)[0]
        consumer.commit()
        consumer.close()
        assert sorted(r.value for r in got) == sorted(_values(20))
        assert broker.stop() == 0
        first_output = "".join(broker.output)

    assert pg_server.password not in first_output
    assert "in postgresql://stratalog@127.0.0.1" in first_output
    assert sorted(p.name for p in data_dir.glob("*.sqlite*")) == [], "no table of the broker's is a file"
    assert _rows(pg_database, "SELECT name, partitions FROM topics") == [("orders", 2)]
    assert _rows(pg_database, "SELECT topic, partition, committed_offset FROM committed_offsets "
                              "WHERE group_id = 'g' ORDER BY partition") == [("orders", 0, 10), ("orders", 1, 10)]
    assert sorted(_rows(pg_database, "SELECT name FROM streams")) == [("orders/0",), ("orders/1",)]
    assert _rows(pg_database, "SELECT count(*) FROM producer_snapshot")[0][0] >= 1

    with running_broker(data_dir, "--metadata", pg_database) as broker:
        assert "orders" in client.list_topics(broker.bootstrap)
        producer = client.producer(broker.bootstrap)
        producer.send_all([Outgoing(i % 2, None, v) for i, v in enumerate(_values(6, first=20))], "orders")
        producer.close()
        resumed = client.consumer(broker.bootstrap, "g", ["orders"])
        newest = consume_until([resumed], 6)[0]
        resumed.close()
        assert sorted(r.value for r in newest) == sorted(_values(6, first=20)), "g resumed at its commits"
        everything = client.consumer(broker.bootstrap, "fresh", ["orders"])
        all_records = consume_until([everything], 26)[0]
        everything.close()
        assert sorted(r.value for r in all_records) == sorted(_values(26))
        assert broker.stop() == 0
        assert pg_server.password not in "".join(broker.output)


def _commit(connection: KafkaConnection, offset: int) -> int:
    """A standalone consumer's OffsetCommit of orders-0; the partition's error code."""
    response = connection.call(OFFSET_COMMIT, 2, OffsetCommitRequest(
        group_id=GroupId("standalone"), generation_id_or_member_epoch=i32(-1), member_id="",
        retention_time=i64Timedelta.parse(datetime.timedelta(milliseconds=-1)),
        topics=(OffsetCommitRequestTopic(name=TopicName("orders"), partitions=(
            OffsetCommitRequestPartition(partition_index=i32(0), committed_offset=i64(offset),
                                         committed_metadata=None),)),)))
    return int(response.topics[0].partitions[0].error_code)


def _fetch(connection: KafkaConnection) -> tuple[int, int]:
    """OffsetFetch of orders-0: (the group's error code, the committed offset)."""
    response = connection.call(OFFSET_FETCH, 3, OffsetFetchRequest(
        group_id=GroupId("standalone"),
        topics=(OffsetFetchRequestTopic(name=TopicName("orders"), partition_indexes=(i32(0),)),)))
    return int(response.error_code), int(response.topics[0].partitions[0].committed_offset)


def _groups_errors(connection: KafkaConnection) -> tuple[int, int]:
    """ListGroups' error code, and DescribeGroups' for the standalone group (known by its offsets only)."""
    listed = connection.call(LIST_GROUPS, 4, ListGroupsRequest(states_filter=()))
    described = connection.call(DESCRIBE_GROUPS, 5, DescribeGroupsRequest(
        groups=(GroupId("standalone"),), include_authorized_operations=False))
    return int(listed.error_code), int(described.groups[0].error_code)


def test_offset_commits_fail_retriably_while_postgres_restarts_and_work_after(
        tmp_path: Path, pg_server: PostgresServer, pg_database: str, client: Client) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(OUTLASTING_CONFIG)
    with running_broker(tmp_path / "data", "--metadata", pg_database, "--config", str(config)) as broker:
        client.create_topic(broker.bootstrap, "orders", 1)
        with KafkaConnection(broker.bootstrap, {}) as connection:
            assert _commit(connection, 1) == 0
            pg_server.stop()
            try:
                assert _commit(connection, 2) == COORDINATOR_NOT_AVAILABLE
                assert _commit(connection, 3) == COORDINATOR_NOT_AVAILABLE, "and again while it is down"
                assert _fetch(connection)[0] == COORDINATOR_NOT_AVAILABLE
                assert _groups_errors(connection) == (COORDINATOR_NOT_AVAILABLE, COORDINATOR_NOT_AVAILABLE)
            finally:
                pg_server.start()
            assert _fetch(connection) == (0, 1), "nothing refused was stored"
            assert _groups_errors(connection) == (0, 0)
            assert _commit(connection, 4) == 0
            assert _fetch(connection) == (0, 4)
        _check_consumer_commits(client, broker)
        assert broker.stop() == 0
        output = "".join(broker.output)
    assert "OffsetCommit of group standalone refused" in output
    assert pg_server.password not in output
    assert _rows(pg_database, "SELECT committed_offset FROM committed_offsets WHERE group_id = 'standalone'") == \
        [(4,)]


def _check_consumer_commits(client: Client, broker: BrokerProcess) -> None:
    """A real client's group commit goes through once the database is back."""
    producer = client.producer(broker.bootstrap)
    producer.send_all([Outgoing(0, None, v) for v in _values(3)], "orders")
    producer.close()
    consumer = client.consumer(broker.bootstrap, "after", ["orders"])
    consume_until([consumer], 3)
    consumer.commit()
    consumer.close()


def test_users_are_managed_in_the_metadata_database(pg_server: PostgresServer, pg_database: str) -> None:
    runner = CliRunner()
    added = runner.invoke(users, ["add", "alice", "--metadata", pg_database, "--password-stdin"],
                          input="wonderland\n")
    assert added.exit_code == 0, added.output
    listed = runner.invoke(users, ["list"], env={"STRATALOG_METADATA": pg_database})
    assert listed.exit_code == 0 and "alice" in listed.output and "SCRAM-SHA-512" in listed.output
    assert _rows(pg_database, 'SELECT DISTINCT "user" FROM scram_credentials') == [("alice",)]
    removed = runner.invoke(users, ["remove", "alice", "--metadata", pg_database])
    assert removed.exit_code == 0, removed.output
    assert _rows(pg_database, "SELECT count(*) FROM scram_credentials") == [(0,)]
    for result in (added, listed, removed):
        assert pg_server.password not in result.output


def test_a_broker_whose_metadata_database_is_unreachable_says_so_without_the_password(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("metadata_connect_wait_ms = 1500\n")
    with pytest.raises(RuntimeError, match="did not start") as failed:
        start_broker(tmp_path / "data", "--metadata", "postgresql://nobody:hunter2@127.0.0.1:9/none",
                     "--config", str(config))
    said = str(failed.value)
    assert "the metadata database does not answer" in said and "trying again for up to 1.5 s" in said
    assert "cannot reach the metadata database" in said
    assert "hunter2" not in said


class _LateDatabase:
    """A port in front of a PostgreSQL server that hangs up on every connection until ``open()``, then
    relays each to the server: a database that comes back while a broker starts."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.hung_up = 0
        self._open = threading.Event()
        self._relayed: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        """Stop taking connections, and end those relayed (after the broker that made them has stopped)."""
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._accepting.join()
        for relayed in self._relayed:
            relayed.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return   # closed
            if not self._open.is_set():
                self.hung_up += 1
                conn.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self._target_port))
            self._relayed += (conn, upstream)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_relay, args=(a, b), daemon=True).start()


def _relay(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def test_a_broker_waits_for_a_metadata_database_that_comes_back(tmp_path: Path, pg_server: PostgresServer,
                                                                pg_database: str) -> None:
    late = _LateDatabase(pg_server.port)
    uri = pg_database.replace(f":{pg_server.port}/", f":{late.port}/")
    started: list[BrokerProcess] = []
    starting = threading.Thread(target=lambda: started.append(start_broker(tmp_path / "data", "--metadata", uri)))
    starting.start()
    try:
        wait_until(lambda: late.hung_up >= 2, "the broker to try the database twice")
        late.open()
        starting.join()
        assert started, "the broker started once the database answered"
        broker = started[0]
        said = "".join(broker.output)
        assert "the metadata database does not answer" in said and "the metadata database answers" in said
        assert pg_server.password not in said
        with KafkaConnection(broker.bootstrap, {}) as connection:
            assert connection.call(18, 3, ApiVersionsRequest(client_software_name="t",
                                                             client_software_version="1")).error_code == 0
    finally:
        starting.join()
        for broker in started:
            broker.stop()
            broker.close_output()
        late.close()


def test_an_unreachable_metadata_database_is_named_without_its_password(tmp_path: Path) -> None:
    result = CliRunner().invoke(users, ["list", "--metadata",
                                        "postgresql://nobody:hunter2@127.0.0.1:9/none?connect_timeout=2"])
    assert result.exit_code != 0
    assert "cannot reach the metadata database" in result.output and "hunter2" not in result.output


def test_the_config_file_names_the_database_and_the_config_does_not_show_its_password(tmp_path: Path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text('metadata = "postgresql://broker:hunter2@db.example:5432/meta"\n')
    config = load_config(toml)
    assert config.metadata == "postgresql://broker:hunter2@db.example:5432/meta"
    assert "hunter2" not in repr(config)
    toml.write_text('metadata = "postgersql://broker:hunter2@db.example/meta"\n')
    with pytest.raises(click.BadParameter, match="PostgreSQL URI") as refused:
        load_config(toml)
    assert "hunter2" not in str(refused.value)
