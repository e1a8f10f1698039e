"""The databases the stream store's metadata lives in: SQLite in the data directory (one node), or
PostgreSQL (several brokers sharing one source of truth).

:class:`~stratalog.engine.metadata.Metadata` writes its SQL once, with ``?`` placeholders; a backend runs
it on its database, turns transactions into that database's way of serialising writers, and maps its
errors onto one set. Both give the same guarantee: a transaction is durable when ``commit`` returns (SQLite
in WAL mode with ``synchronous=FULL``; PostgreSQL with ``synchronous_commit`` on, its default), and
writers run one at a time (SQLite's ``BEGIN IMMEDIATE``; in PostgreSQL a transaction-scoped advisory
lock, so ids taken as "largest + 1" never collide between brokers).

The broker's own tables (broker/metadata_db.py) run on the same backends. SQL meant for both uses what
both accept: ``INSERT ... ON CONFLICT (...) DO UPDATE SET c = excluded.c`` or ``DO NOTHING`` rather than
SQLite's ``INSERT OR REPLACE`` / ``OR IGNORE``, a column named with its table in an upsert's ``SET``
(``counters.value + 1``), ``RETURNING`` rather than a second query, double quotes around a column name
that PostgreSQL reserves (``"user"``), and :func:`postgres_schema` for the types.
"""

from __future__ import annotations

import contextlib
import re
import select
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from stratalog.errors import OutOfSpaceError, StratalogError

#: The URI schemes that name a PostgreSQL database (libpq's).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
#: The advisory lock every metadata writer holds for its transaction (any fixed number: it only has to
#: be the same for every writer of one database).
WRITER_LOCK_KEY = 0x5354524C   # "STRL"
#: How long a PostgreSQL connection attempt may take before the call fails (a database that is down
#: must fail the commit, so the store stops acknowledging, rather than hang it).
CONNECT_TIMEOUT_S = 10

#: How long data sent to PostgreSQL may go unacknowledged before the connection fails (libpq's
#: tcp_user_timeout): a database cut off by the network fails the statement within seconds, not after
#: TCP's retries of about 15 minutes, so a commit fails rather than hangs and a broker can fence itself.
TCP_USER_TIMEOUT_MS = 5000
#: TCP keepalives on an idle connection (idle seconds, between probes, probes): a silent peer is found
#: within about 8 s.
KEEPALIVES_IDLE_S, KEEPALIVES_INTERVAL_S, KEEPALIVES_COUNT = 5, 1, 3
#: The server ends a session that sits inside a transaction this long without a statement
#: (idle_in_transaction_session_timeout): a client cut off mid-transaction holds the writer lock, which
#: every other writer (every broker's commits) waits for. Our transactions send their statements back
#: to back; 2 s is far above that, and below a cluster's 3 s lease.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 2000

#: SQLite's default wait for another connection's write lock (Python's ``sqlite3.connect`` timeout).
SQLITE_BUSY_TIMEOUT_S = 5.0
#: Schema versions in PostgreSQL, one row per versioned schema (SQLite keeps its file's ``user_version``:
#: each versioned schema there has a file of its own).
SCHEMA_VERSIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_versions (name TEXT PRIMARY KEY, version INTEGER NOT NULL);
"""

#: SQLSTATEs of a session the server ended before a statement ran: admin_shutdown, crash_shutdown,
#: idle_session_timeout.
_SESSION_ENDED_SQLSTATES = frozenset({"57P01", "57P02", "57P05"})
#: SQLite's types and PostgreSQL's: 64-bit integers, bytes, 8-byte floats (PostgreSQL's REAL has 4).
_TYPES = {"INTEGER": "BIGINT", "BLOB": "BYTEA", "REAL": "DOUBLE PRECISION"}
_TYPE_NAMES = re.compile(r"\b(INTEGER|BLOB|REAL)\b")
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

    def schema_version(self, name: str) -> int:
        """The version of the schema ``name`` (0: never written)."""

    def set_schema_version(self, name: str, version: int) -> None:
        """Record the version of schema ``name``, inside the writer's transaction."""


@contextlib.contextmanager
def writing(db: Backend) -> Iterator[None]:
    """One write transaction on ``db``: committed when the body returns, rolled back when it raises."""
    db.begin_writer()
    try:
        yield
    except BaseException:
        db.rollback()
        raise
    db.commit()


class MetadataFullError(OutOfSpaceError):
    """The metadata database could not write: its disk is full. Nothing of the change was kept."""


def _full_or(error: sqlite3.OperationalError) -> Exception:
    """MetadataFullError for SQLite's "database or disk is full", else the error itself."""
    if error.sqlite_errorcode == sqlite3.SQLITE_FULL:
        return MetadataFullError(f"the metadata database could not write: {error}; free space on its disk")
    return error


class SqliteBackend:
    """A SQLite file; ``read_only`` opens it beside a running store (WAL mode lets readers in).

    ``synchronous``: FULL syncs the WAL at every commit (a commit is durable when it returns); NORMAL
    only at checkpoints, for what a crash may lose (a snapshot that is rebuilt). ``busy_timeout_s``: how
    long a writer waits for another connection's transaction (other processes may write the same file).
    """

    def __init__(self, path: Path, schema: str, read_only: bool = False, *, synchronous: str = "FULL",
                 busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S) -> None:
        if read_only:
            self._db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                       isolation_level=None)
            return
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous is FULL or NORMAL, not {synchronous!r}")
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=busy_timeout_s)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(schema)
        except BaseException:
            self._db.close()
            raise

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        try:
            return self._db.execute(sql, params)
        except sqlite3.IntegrityError as e:
            raise DuplicateError(str(e)) from e
        except sqlite3.OperationalError as e:
            raise _full_or(e) from e

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            self._db.executemany(sql, rows)
        except sqlite3.IntegrityError as e:
            raise DuplicateError(str(e)) from e
        except sqlite3.OperationalError as e:
            raise _full_or(e) from e

    def begin_writer(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        try:
            self._db.execute("COMMIT")
        except sqlite3.OperationalError as e:
            raise _full_or(e) from e

    def rollback(self) -> None:
        self._db.execute("ROLLBACK")

    def close(self) -> None:
        self._db.close()

    def schema_version(self, name: str) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def set_schema_version(self, name: str, version: int) -> None:
        self._db.execute(f"PRAGMA user_version={int(version)}")


def postgres_schema(sqlite_schema: str) -> str:
    """The SQLite schema in PostgreSQL's words: 64-bit integers, BYTEA for BLOB, 8-byte floats for REAL,
    no ``WITHOUT ROWID``."""
    return _WITHOUT_ROWID.sub(")", _TYPE_NAMES.sub(lambda m: _TYPES[m.group(1)], sqlite_schema))


def without_password(uri: str) -> str:
    """A PostgreSQL URI fit for logs and messages: the password gone from the user part and the query
    (libpq takes it in either)."""
    parts = urlsplit(uri)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = f"{userinfo.split(':', 1)[0]}@{host}"
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


#: Between tries to reach a database at start (wait_until_reachable): the first pause, and the most.
REACH_PAUSE_S = 0.2
REACH_PAUSE_S_MAX = 2.0


def wait_until_reachable(uri: str, wait_s: float, on_retry: Callable[[str], None]) -> None:
    """Return once a connection to the PostgreSQL database ``uri`` opens (and close it); until then try
    again, with a pause that doubles up to REACH_PAUSE_S_MAX, calling ``on_retry`` with why (no password
    in it) after each failure. Raises MetadataUnavailableError once ``wait_s`` has passed."""
    try:
        import psycopg
    except ImportError as e:
        raise MetadataUnavailableError("PostgreSQL metadata needs psycopg: pip install 'stratalog[postgres]'") \
            from e
    secrets = _passwords(uri)
    deadline = time.monotonic() + wait_s
    pause_s = REACH_PAUSE_S
    while True:
        try:
            psycopg.connect(uri, connect_timeout=CONNECT_TIMEOUT_S).close()
            return
        except psycopg.OperationalError as e:
            said = _scrubbed(e, secrets)
            if time.monotonic() + pause_s > deadline:
                raise MetadataUnavailableError(f"cannot reach the metadata database: {said}") from None
            on_retry(said)
        time.sleep(pause_s)
        pause_s = min(2 * pause_s, REACH_PAUSE_S_MAX)


class PostgresBackend:
    """A PostgreSQL database named by a libpq URI. The connection is remade after it is lost (a server
    restart), on the next call: the call that found it lost fails with MetadataUnavailableError.

    ``writer_lock_key``: the advisory lock that serialises this database's writers of one kind (every
    backend with the same key waits for the others' transactions; other keys do not).
    """

    def __init__(self, uri: str, schema: str, *, writer_lock_key: int = WRITER_LOCK_KEY) -> None:
        try:
            import psycopg
        except ImportError as e:
            raise MetadataUnavailableError("PostgreSQL metadata needs psycopg: pip install 'stratalog[postgres]'") \
                from e
        self._psycopg = psycopg
        self._uri = uri
        self._secrets = _passwords(uri)
        self._writer_lock_key = writer_lock_key
        self._conn: Any = None
        self._in_transaction = False
        self.begin_writer()
        try:
            # No parameters: several statements in one go.
            self._connect().execute(postgres_schema(SCHEMA_VERSIONS_TABLE + schema))
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def _connect(self) -> Any:
        if self._conn is not None and not self._conn.closed and not self._in_transaction and self._hung_up():
            self._drop()
        if self._conn is None or self._conn.closed:
            try:
                self._conn = self._psycopg.connect(self._uri, autocommit=True, **self._connection_options())
            except self._psycopg.OperationalError as e:
                raise MetadataUnavailableError(f"cannot reach the metadata database: {self._scrub(e)}") from None
        return self._conn

    def _connection_options(self) -> dict[str, Any]:
        """libpq parameters that bound every wait on a database that went silent (the constants above);
        ``options`` given in the URI are kept, ours added after them."""
        given = self._psycopg.conninfo.conninfo_to_dict(self._uri).get("options") or ""
        return {"connect_timeout": CONNECT_TIMEOUT_S, "tcp_user_timeout": TCP_USER_TIMEOUT_MS, "keepalives": 1,
                "keepalives_idle": KEEPALIVES_IDLE_S, "keepalives_interval": KEEPALIVES_INTERVAL_S,
                "keepalives_count": KEEPALIVES_COUNT,
                "options": f"{given} -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_MS}".strip()}

    def _hung_up(self) -> bool:
        """Whether the server closed this idle connection: it has something to read (a server's goodbye,
        or the end of the stream after it was killed) though no statement is outstanding."""
        try:
            readable, _, _ = select.select([self._conn.fileno()], [], [], 0)
        except (OSError, ValueError, self._psycopg.Error):
            return True
        return bool(readable)

    def _scrub(self, error: BaseException) -> str:
        return _scrubbed(error, self._secrets)

    def _run(self, sql: str, params: Sequence[Any], many: bool = False) -> Any:
        statement = sql.replace("?", "%s")
        for attempt in (1, 2):
            conn = self._connect()
            try:
                if many:
                    with conn.cursor() as cursor:
                        cursor.executemany(statement, params)
                    return None
                return conn.execute(statement, params)
            except self._psycopg.errors.UniqueViolation as e:
                raise DuplicateError(str(e)) from e
            except self._psycopg.errors.DiskFull as e:   # SQLSTATE 53100: nothing of the statement was kept
                raise MetadataFullError(f"the metadata database could not write: {self._scrub(e)}; free space "
                                        "on its server's disk") from e
            except self._psycopg.OperationalError as e:
                in_transaction = self._in_transaction
                self._drop()
                # A connection a server restart closed while it was idle says so at its next use: the
                # statement did not run, so outside a transaction it goes once more on a new connection
                # (else every connection would fail one call after each restart). BEGIN changes nothing.
                if attempt == 1 and not in_transaction and (sql == "BEGIN" or self._session_ended(e)):
                    continue
                raise MetadataUnavailableError(
                    f"the metadata database failed a statement: {self._scrub(e)}") from e
        raise AssertionError("unreachable")

    def _session_ended(self, error: BaseException) -> bool:
        """Whether the server ended the session before the statement ran (SQLSTATE 57P01, 57P02, 57P05:
        a shutdown, a crash of another backend, an idle timeout)."""
        return getattr(getattr(error, "diag", None), "sqlstate", None) in _SESSION_ENDED_SQLSTATES

    def _drop(self) -> None:
        self._in_transaction = False
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
        self._in_transaction = True
        self._run("SELECT pg_advisory_xact_lock(?)", (self._writer_lock_key,))

    def commit(self) -> None:
        self._run("COMMIT", ())
        self._in_transaction = False

    def rollback(self) -> None:
        self._in_transaction = False
        if self._conn is not None and not self._conn.closed:
            try:
                self._conn.execute("ROLLBACK")
            except self._psycopg.Error:
                self._drop()

    def close(self) -> None:
        self._drop()

    def schema_version(self, name: str) -> int:
        row = self.execute("SELECT version FROM schema_versions WHERE name = ?", (name,)).fetchone()
        return 0 if row is None else int(row[0])

    def set_schema_version(self, name: str, version: int) -> None:
        self.execute("INSERT INTO schema_versions VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET "
                     "version = excluded.version", (name, version))


def _scrubbed(error: BaseException, secrets: Sequence[str]) -> str:
    """The error's message without the URI's passwords (libpq may quote the connection string)."""
    message = str(error)
    for secret in secrets:
        message = message.replace(secret, "***")
    return message


def _passwords(uri: str) -> list[str]:
    parts = urlsplit(uri)
    found = [v for k, v in parse_qsl(parts.query) if k == "password" and v]
    if parts.password:
        found.append(parts.password)
    return found


def is_postgres_uri(location: str) -> bool:
    return location.startswith(POSTGRES_SCHEMES)
