"""Consumer groups' committed offsets, durable in one SQLite file (``offsets.sqlite``) or a PostgreSQL
database (metadata_db.py).

A commit is one transaction, durable before ``commit`` returns: in SQLite, WAL mode with
``synchronous=FULL`` (the WAL is fsynced at the commit); in PostgreSQL, a synchronous commit. An
acknowledged commit survives kill -9 and power loss. When PostgreSQL cannot be reached (a restart, a lost
connection) a call fails with :class:`OffsetsUnavailableError` and stores nothing, so OffsetCommit answers
a retriable error, never success; the next call reconnects. Every method takes one lock (the connection
is shared by the broker's event loop and the threads it hands blocking calls to).

Retention follows Kafka's ``offsets.retention.minutes`` with one difference, written down in
:meth:`CommittedOffsets.expire`: an offset goes once its group has been empty *and* the offset itself has
not been committed for the retention time (Kafka drops all of an empty group's offsets once the group has
been empty that long, even one an admin tool committed a minute ago).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from stratalog.broker.metadata_db import BROKER_WRITER_LOCK_KEY
from stratalog.engine.metadata_backends import (
    Backend,
    MetadataUnavailableError,
    PostgresBackend,
    SqliteBackend,
    is_postgres_uri,
    postgres_schema,
    without_password,
    writing,
)
from stratalog.errors import StratalogError

#: Kafka's OFFSET_METADATA_TOO_LARGE error code: what OffsetCommit answers for a partition whose
#: metadata string is over the bound.
OFFSET_METADATA_TOO_LARGE = 12

#: The version of the table layout below: SQLite's ``user_version`` of the file; in PostgreSQL the row
#: ``SCHEMA_NAME`` of ``schema_versions``.
SCHEMA_VERSION = 1
SCHEMA_NAME = "committed_offsets"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS committed_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    leader_epoch INTEGER NOT NULL,
    metadata TEXT,
    commit_time_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS committed_offsets_by_topic ON committed_offsets (topic);
"""

_COLUMNS = "topic, partition, committed_offset, leader_epoch, metadata, commit_time_ms"


@dataclass(frozen=True, slots=True)
class OffsetsConfig:
    #: Longest metadata string of one committed offset, in UTF-8 bytes. 4096 is Kafka's
    #: ``offset.metadata.max.bytes``: clients keep small notes there, and every byte is stored per
    #: partition per group for the retention time. (Kafka counts UTF-16 units; bytes are stricter only
    #: for text beyond ASCII.)
    offset_metadata_bytes_max: int = 4096


@dataclass(frozen=True, slots=True)
class OffsetEntry:
    """One committed offset of one partition. ``leader_epoch`` is -1 when the client sent none."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_time_ms: int


class OffsetsStoreError(StratalogError):
    """The committed-offsets file cannot be used."""


class OffsetsSchemaError(OffsetsStoreError):
    """The file was written by a newer stratalog (an unknown schema version): upgrade, or point the broker
    at another file."""


class OffsetsUnavailableError(OffsetsStoreError, MetadataUnavailableError):
    """The database holding the offsets cannot be reached now (PostgreSQL restarting, the connection
    lost): the call stored nothing, or stored what a retry stores again. Retry; OffsetCommit answers
    COORDINATOR_NOT_AVAILABLE, which clients retry."""


class OffsetMetadataTooLargeError(OffsetsStoreError, ValueError):
    """A commit carried metadata over ``offset_metadata_bytes_max``. Request handlers check each partition
    with :meth:`CommittedOffsets.metadata_error` first and answer OFFSET_METADATA_TOO_LARGE for it."""


class OffsetsClosedError(OffsetsStoreError):
    """The store was closed."""


def metadata_error(metadata: str | None, offset_metadata_bytes_max: int) -> int:
    """The error code OffsetCommit answers for this partition's metadata: 0, or OFFSET_METADATA_TOO_LARGE."""
    if metadata is None or len(metadata) * 4 <= offset_metadata_bytes_max:  # no UTF-8 character is over 4 bytes
        return 0
    if len(metadata.encode("utf-8", "surrogatepass")) <= offset_metadata_bytes_max:
        return 0
    return OFFSET_METADATA_TOO_LARGE


def _fsync_parent_dir(path: Path) -> None:
    # A new database file's directory entry is not synced by SQLite (only its journals' are): without
    # this, power lost soon after the first commit could leave a WAL with no database beside it.
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CommittedOffsets:
    """Committed offsets of every consumer group, keyed by (group, topic, partition).

    ``location``: the SQLite file's path, or a PostgreSQL URI (``postgresql://user:password@host/db``).
    Write transactions take the database's writer lock at once (SQLite's ``BEGIN IMMEDIATE``, a
    PostgreSQL advisory lock), so none fails half way for a lock another process holds."""

    def __init__(self, location: str | os.PathLike[str], config: OffsetsConfig | None = None) -> None:
        self._config = config or OffsetsConfig()
        self._lock = threading.Lock()
        self._path: Path | None = None
        if isinstance(location, str) and is_postgres_uri(location):
            self._shown = without_password(location)
            db = self._open_postgres(location)
        else:
            self._path = Path(location)
            self._shown = str(self._path)
            db = self._open_sqlite(self._path)
        self._conn: Backend | None = db
        #: Called inside every commit's transaction with the group's id; raises to refuse the commit (a
        #: broker of a cluster that no longer coordinates the group: Cluster.group_fence).
        self.fence: Callable[[Backend, str], None] | None = None

    def _open_sqlite(self, path: Path) -> Backend:
        created = not path.exists()
        try:
            db = SqliteBackend(path, "")
        except sqlite3.Error as e:
            raise OffsetsStoreError(f"cannot open the committed-offsets file {path}: {e}") from e
        try:
            try:
                mode = db.execute("PRAGMA journal_mode").fetchone()[0]
            except sqlite3.Error as e:
                raise OffsetsStoreError(f"{path} is not a usable SQLite database: {e}") from e
            if str(mode).lower() != "wal":
                raise OffsetsStoreError(f"{path}: SQLite refused WAL journal mode (got {mode!r}); "
                                        "use a local file system")
            self._prepare(db, _SCHEMA)
        except BaseException:
            db.close()
            raise
        if created:
            _fsync_parent_dir(path)
        return db

    def _open_postgres(self, uri: str) -> Backend:
        try:
            db = PostgresBackend(uri, "", writer_lock_key=BROKER_WRITER_LOCK_KEY)
        except MetadataUnavailableError as e:
            raise OffsetsUnavailableError(f"committed offsets in {self._shown}: {e}") from e
        try:
            self._prepare(db, postgres_schema(_SCHEMA))
        except MetadataUnavailableError as e:
            db.close()
            raise OffsetsUnavailableError(f"committed offsets in {self._shown}: {e}") from e
        except BaseException:
            db.close()
            raise
        return db

    def _prepare(self, db: Backend, schema: str) -> None:
        try:
            version = db.schema_version(SCHEMA_NAME)
        except sqlite3.Error as e:
            raise OffsetsStoreError(f"{self._shown} is not a usable SQLite database: {e}") from e
        if version > SCHEMA_VERSION:
            raise OffsetsSchemaError(f"{self._shown} has schema version {version}; this stratalog knows "
                                     f"{SCHEMA_VERSION}")
        if version < SCHEMA_VERSION:
            with writing(db):
                # Statement by statement: SQLite's executescript would commit the transaction first.
                for statement in schema.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.set_schema_version(SCHEMA_NAME, SCHEMA_VERSION)

    @property
    def config(self) -> OffsetsConfig:
        return self._config

    @property
    def path(self) -> Path | None:
        """The SQLite file, or None for PostgreSQL."""
        return self._path

    def metadata_error(self, metadata: str | None) -> int:
        """0, or OFFSET_METADATA_TOO_LARGE when ``metadata`` is over this store's bound."""
        return metadata_error(metadata, self._config.offset_metadata_bytes_max)

    def _connection(self) -> Backend:
        if self._conn is None:
            raise OffsetsClosedError(f"the committed-offsets store {self._shown} is closed")
        return self._conn

    @contextlib.contextmanager
    def _database(self) -> Iterator[Backend]:
        """The connection, under the lock; a database out of reach is OffsetsUnavailableError."""
        with self._lock:
            db = self._connection()
            try:
                yield db
            except OffsetsUnavailableError:
                raise
            except MetadataUnavailableError as e:
                raise OffsetsUnavailableError(f"committed offsets in {self._shown}: {e}") from e

    def commit(self, group_id: str, entries: Sequence[OffsetEntry],
               fence: Callable[[Backend, str], None] | None = None) -> None:
        """Store ``entries`` (replacing what the group had for those partitions) in one durable transaction.
        Nothing is stored when any entry's metadata is over the bound. ``fence``: checked instead of
        :attr:`fence` (a transaction's coordinator commits the offsets of its transaction under its own
        hold: broker/transactions.py)."""
        for entry in entries:
            if self.metadata_error(entry.metadata):
                raise OffsetMetadataTooLargeError(
                    f"group {group_id!r}: metadata of {entry.topic}-{entry.partition} is over "
                    f"{self._config.offset_metadata_bytes_max} bytes")
        rows = [(group_id, e.topic, e.partition, e.offset, e.leader_epoch, e.metadata, e.commit_time_ms)
                for e in entries]
        with self._database() as db, writing(db):
            check = fence or self.fence
            if check is not None:
                check(db, group_id)
            db.executemany(f"INSERT INTO committed_offsets (group_id, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
                           "ON CONFLICT (group_id, topic, partition) DO UPDATE SET "
                           "committed_offset = excluded.committed_offset, leader_epoch = excluded.leader_epoch, "
                           "metadata = excluded.metadata, commit_time_ms = excluded.commit_time_ms", rows)

    def fetch(self, group_id: str,
              partitions: Sequence[tuple[str, int]] | None = None) -> dict[tuple[str, int], OffsetEntry]:
        """The group's committed offsets of ``partitions`` (``None``: all of them). A partition with no
        committed offset is absent from the result."""
        with self._database() as db:
            # The group's every row in one query (one round trip to PostgreSQL), the partitions picked here.
            rows = db.execute(f"SELECT {_COLUMNS} FROM committed_offsets WHERE group_id = ?",
                              (group_id,)).fetchall()
        found = {(row[0], row[1]): OffsetEntry(*row) for row in rows}
        if partitions is None:
            return found
        return {key: found[key] for key in partitions if key in found}

    def groups(self) -> list[str]:
        """Every group with at least one committed offset, sorted."""
        with self._database() as db:
            rows = db.execute("SELECT DISTINCT group_id FROM committed_offsets").fetchall()
        # Sorted here, by code point: a PostgreSQL database's collation may order text otherwise.
        return sorted(row[0] for row in rows)

    def has_group(self, group_id: str) -> bool:
        with self._database() as db:
            row = db.execute("SELECT 1 FROM committed_offsets WHERE group_id = ? LIMIT 1", (group_id,)).fetchone()
        return row is not None

    def _delete(self, where: str, params: Sequence[object]) -> int:
        with self._database() as db, writing(db):
            removed: int = db.execute(f"DELETE FROM committed_offsets WHERE {where}", params).rowcount
        return removed

    def delete_group(self, group_id: str) -> int:
        """Drop every committed offset of the group; returns how many were dropped."""
        return self._delete("group_id = ?", (group_id,))

    def delete_partitions(self, group_id: str, partitions: Sequence[tuple[str, int]]) -> int:
        """Drop the group's offsets of these partitions (OffsetDelete); returns how many were dropped."""
        removed = 0
        with self._database() as db, writing(db):
            for topic, partition in partitions:
                removed += db.execute(
                    "DELETE FROM committed_offsets WHERE group_id = ? AND topic = ? AND partition = ?",
                    (group_id, topic, partition)).rowcount
        return removed

    def delete_topic(self, topic: str) -> int:
        """Drop every group's offsets of a deleted topic; returns how many were dropped."""
        return self._delete("topic = ?", (topic,))

    def expire(self, now_ms: int, retention_ms: int, empty_since_ms: Callable[[str], int | None]) -> int:
        """Drop offsets past retention; returns how many were dropped.

        ``empty_since_ms(group_id)`` says since when the group has had no members: ``None`` for a group with
        members (its offsets are kept), 0 for a group the coordinator does not hold (a standalone
        consumer's, or any group after a broker restart). An offset is dropped when both the group's empty
        time and the offset's commit time are at least ``retention_ms`` before ``now_ms``.
        """
        cutoff_ms = now_ms - retention_ms
        with self._database() as db:
            names = [row[0] for row in db.execute("SELECT DISTINCT group_id FROM committed_offsets").fetchall()]
            expiring = []
            for group_id in names:
                since_ms = empty_since_ms(group_id)
                if since_ms is not None and since_ms <= cutoff_ms:
                    expiring.append((group_id, cutoff_ms))
            removed = 0
            if expiring:
                with writing(db):
                    for params in expiring:
                        removed += db.execute(
                            "DELETE FROM committed_offsets WHERE group_id = ? AND commit_time_ms <= ?",
                            params).rowcount
        return removed

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> CommittedOffsets:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
