"""The servers the tests and harnesses start pick free ports, which another process of a busy machine may
take before the server binds them: a first start then moves to other free ports instead of failing."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import psycopg
import pytest

from clusterkit import running_cluster
from conftest import SeaweedS3
from stratalog.chaos import cluster_process, ports, postgres
from stratalog.kafka.client import KafkaConnection

pytest_plugins = ["pgkit"]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another process holds, listening."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_picked_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    picked = ports.free_ports(50)
    assert len(set(picked)) == 50
    assert all(ports.PICK_LOW <= port < ports.ephemeral_low() for port in picked)
    for port in picked:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_postgres_moves_to_another_port_when_its_own_was_taken(taken_port: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    picks = iter([taken_port])
    free_port = postgres.free_port
    monkeypatch.setattr(postgres, "free_port", lambda: next(picks, None) or free_port())
    with postgres.running_postgres() as server:
        assert server.port != taken_port
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_seaweedfs_moves_to_other_ports_when_one_of_its_own_was_taken(taken_port: int, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    free_ports = cluster_process.free_ports
    picks: list[list[int]] = []

    def pick(count: int, host: str = "127.0.0.1") -> list[int]:
        ports = free_ports(count, host)
        if not picks:
            ports[0] = taken_port   # the first component's port: taken already
        picks.append(ports)
        return ports

    monkeypatch.setattr(cluster_process, "free_ports", pick)
    with cluster_process.seaweed_server(tmp_path / "seaweedfs") as server:
        assert len(picks) == 2 and taken_port not in picks[1]
        assert f":{picks[1][cluster_process.SEAWEEDFS_COMPONENTS.index('s3')]}" in server.endpoint.endpoint_url
        s3 = boto3.client("s3", endpoint_url=server.endpoint.endpoint_url, region_name="us-east-1",
                          aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key)
        s3.put_object(Bucket=server.endpoint.bucket, Key="k", Body=b"v")
        assert s3.get_object(Bucket=server.endpoint.bucket, Key="k")["Body"].read() == b"v"


def test_serve_on_a_taken_port_says_so_and_exits_1(taken_port: int, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "from stratalog.cli import main; main()", "serve", "--data-dir",
                           str(tmp_path / "data"), "--listen", f"127.0.0.1:{taken_port}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "Error: cannot listen: " in done.stderr and "address already in use" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_cluster_broker_moves_to_another_port_at_its_first_start_only(taken_port: int, tmp_path: Path,
                                                                         pg_database: str, seaweedfs: SeaweedS3,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    free_ports = cluster_process.free_ports
    picks = iter([[taken_port]])
    monkeypatch.setattr(cluster_process, "free_ports",
                        lambda count, *host: next(picks, None) or free_ports(count, *host))
    with running_cluster(tmp_path, pg_database, seaweedfs, 1) as cluster:
        moved = cluster.ports[1]
        assert moved != taken_port
        KafkaConnection(cluster.brokers[1].bootstrap, {}, client_id="probe").close()
        cluster.brokers[1].kill9()
        cluster.ports[1] = taken_port   # a restart keeps its port, which clients know: taken, it fails
        with pytest.raises(cluster_process.PortTakenError):
            cluster.start(1)
