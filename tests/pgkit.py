"""PostgreSQL for the broker's table tests: one real server on 127.0.0.1 for the test session (started at
the first test that asks, stopped when the session ends), a database of its own per test, and a
fixture that runs a test once on SQLite and once on PostgreSQL.

A test module uses it with ``pytest_plugins = ["pgkit"]``: registered once as a plugin, the server is
shared by every module that asks instead of being made again for each.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stratalog.chaos.postgres import PostgresServer, running_postgres

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


def _admin(server: PostgresServer) -> str:
    return server.dsn.rsplit("/", 1)[0] + "/postgres"


@pytest.fixture
def pg_database(pg_server: PostgresServer) -> Iterator[str]:
    """The URI of an empty database of this test's own, dropped after it."""
    name = f"tables_{next(_names)}"
    with psycopg.connect(_admin(pg_server), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_server.dsn.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(_admin(pg_server), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgres"])
def tables_at(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a table lives: a SQLite file in the test's directory, or a PostgreSQL database's URI."""
    if request.param == "sqlite":
        return tmp_path / "broker.sqlite"
    uri: str = request.getfixturevalue("pg_database")
    return uri
