"""The databases the stream store's metadata lives in: SQLite in the data directory (one node), or
PostgreSQL (several brokers sharing one source of truth).

:class:`~stratalog.engine.metadata.Metadata` writes its SQL once, with ``?`` placeholders; a backend runs
it on its database, turns transactions into that database's way of serialising writers, and maps its
errors onto one set. Both give the same guarantee: a transaction is durable when ``commit`` returns (SQLite
in WAL mode with ``synchronous=FULL``; PostgreSQL with ``synchronous_commit`` on, its default), and
writers run one at a time (SQLite's ``BEGIN IMMEDIATE``; in PostgreSQL a transaction-scoped advisory
lock, so ids taken as "largest + 1" never collide between brokers).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from stratalog.errors import StratalogError

#: The URI schemes that name a PostgreSQL database (libpq's).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
#: The advisory lock every metadata writer holds for its transaction (any fixed number: it only has to
#: be the same for every writer of one database).
WRITER_LOCK_KEY = 0x5354524C   # "STRL"
#: How long a PostgreSQL connection attempt may take before the call fails (a database that is down
#: must fail the commit, so the store stops acknowledging, rather than hang it).
CONNECT_TIMEOUT_S = 10

_INTEGER = re.compile(r"\bINTEGER\b")
_WITHOUT_ROWID = re.compile(r"\)\s*WITHOUT ROWID")


class MetadataUnavailableError(StratalogError):
    """The metadata database could not be reached or refused a statement for a reason outside the store
    (connection lost, server restarting). Safe to retry: the transaction did not commit, or the retry
    finds it did."""


class DuplicateError(StratalogError):
    """A statement broke a uniqueness rule (a name or id taken)."""


class Rows(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Backend(Protocol):
    """One connection to a metadata database. Not thread-safe: Metadata holds a lock around it."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    def begin_writer(self) -> None:
        """Begin a transaction that writes, after every other writer's has ended."""

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...


class SqliteBackend:
    """A SQLite file; ``read_only`` opens it beside a running store (WAL mode lets readers in)."""

    def __init__(self, path: Path, schema: str, read_only: bool = False) -> None:
        if read_only:
            self._db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                       isolation_level=None)
            return
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(schema)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        try:
            return self._db.execute(sql, params)
        except sqlite3.IntegrityError as e:
            raise DuplicateError(str(e)) from e

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            self._db.executemany(sql, rows)
        except sqlite3.IntegrityError as e:
            raise DuplicateError(str(e)) from e

    def begin_writer(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self._db.execute("COMMIT")

    def rollback(self) -> None:
        self._db.execute("ROLLBACK")

    def close(self) -> None:
        self._db.close()


def postgres_schema(sqlite_schema: str) -> str:
    """The SQLite schema in PostgreSQL's words: 64-bit integers, no ``WITHOUT ROWID``."""
    return _WITHOUT_ROWID.sub(")", _INTEGER.sub("BIGINT", sqlite_schema))


class PostgresBackend:
    """A PostgreSQL database named by a libpq URI. The connection is remade after it is lost (a server
    restart), on the next call: the call that found it lost fails with MetadataUnavailableError."""

    def __init__(self, uri: str, schema: str) -> None:
        try:
            import psycopg
        except ImportError as e:
            raise MetadataUnavailableError("PostgreSQL metadata needs psycopg: pip install 'stratalog[postgres]'") \
                from e
        self._psycopg = psycopg
        self._uri = uri
        self._conn: Any = None
        self.begin_writer()
        try:
            self._connect().execute(postgres_schema(schema))   # no parameters: several statements in one go
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def _connect(self) -> Any:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = self._psycopg.connect(self._uri, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
            except self._psycopg.OperationalError as e:
                raise MetadataUnavailableError(f"cannot reach the metadata database: {e}") from e
        return self._conn

    def _run(self, sql: str, params: Sequence[Any], many: bool = False) -> Any:
        statement = sql.replace("?", "%s")
        conn = self._connect()
        try:
            if many:
                with conn.cursor() as cursor:
                    cursor.executemany(statement, params)
                return None
            return conn.execute(statement, params)
        except self._psycopg.errors.UniqueViolation as e:
            raise DuplicateError(str(e)) from e
        except self._psycopg.OperationalError as e:
            self._drop()
            raise MetadataUnavailableError(f"the metadata database failed a statement: {e}") from e

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(self._psycopg.Error):
                self._conn.close()
        self._conn = None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        cursor: Rows = self._run(sql, params)
        return cursor

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._run(sql, list(rows), many=True)

    def begin_writer(self) -> None:
        self._run("BEGIN", ())
        self._run("SELECT pg_advisory_xact_lock(?)", (WRITER_LOCK_KEY,))

    def commit(self) -> None:
        self._run("COMMIT", ())

    def rollback(self) -> None:
        if self._conn is not None and not self._conn.closed:
            try:
                self._conn.execute("ROLLBACK")
            except self._psycopg.Error:
                self._drop()

    def close(self) -> None:
        self._drop()


def is_postgres_uri(location: str) -> bool:
    return location.startswith(POSTGRES_SCHEMES)
