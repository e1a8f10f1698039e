"""The stream store's metadata: streams, objects, the ranges of each stream in each object, and a commit
sequence, in SQLite (the data directory's ``meta.sqlite``) or PostgreSQL (engine/metadata_backends.py).

Every change that readers can see (an upload's commit, a trim, an object replacement) is one transaction
and bumps ``commit_seq``; a commit is durable when the call returns. The SQL is written once, for both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from stratalog.engine.metadata_backends import (
    Backend,
    DuplicateError,
    PostgresBackend,
    SqliteBackend,
    is_postgres_uri,
    writing,
)
from stratalog.engine.objformat import BlockEntry
from stratalog.engine.sink_markers import marker_partition, partition_markers_like
from stratalog.errors import StratalogError

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS streams (
    stream_id INTEGER PRIMARY KEY,
    name TEXT UNIQUE,
    start_offset INTEGER NOT NULL DEFAULT 0,
    committed_end_offset INTEGER NOT NULL DEFAULT 0,
    committed_bytes INTEGER NOT NULL DEFAULT 0,
    created_ms INTEGER NOT NULL,
    retention_ms INTEGER,
    retention_bytes INTEGER
);
CREATE TABLE IF NOT EXISTS objects (
    object_id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    unreferenced_ms INTEGER        -- set once no range needs it; deleted after a grace period
);
CREATE TABLE IF NOT EXISTS ranges (
    stream_id INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    object_id INTEGER NOT NULL,
    position INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL,
    record_count INTEGER NOT NULL,
    max_timestamp_ms INTEGER NOT NULL,
    crc INTEGER NOT NULL,
    PRIMARY KEY (stream_id, start_offset)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ranges_by_object ON ranges (object_id);
"""


#: A check run inside a metadata transaction for the streams it changes (see Metadata).
Fence = Callable[[Backend, Sequence[int]], None]


class UnknownStreamError(StratalogError, KeyError):
    """No stream with that id or name."""


class StaleBlocksError(StratalogError):
    """A replacement of a stream's blocks was refused: they changed since they were read (a trim, a
    deletion, another replacement). Read them again."""


@dataclass(frozen=True, slots=True)
class StreamMeta:
    stream_id: int
    name: str | None
    start_offset: int
    committed_end_offset: int
    committed_bytes: int
    created_ms: int
    retention_ms: int | None
    retention_bytes: int | None


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    object_id: int
    key: str
    size_bytes: int
    created_ms: int
    unreferenced_ms: int | None


@dataclass(frozen=True, slots=True)
class RangeRow:
    """One data block of one stream in one object."""

    stream_id: int
    start_offset: int
    end_offset: int
    object_id: int
    key: str
    position: int
    size_bytes: int
    record_count: int
    max_timestamp_ms: int
    crc: int

    def entry(self) -> BlockEntry:
        return BlockEntry(self.stream_id, self.start_offset, self.end_offset, self.position,
                          self.size_bytes, self.record_count, self.max_timestamp_ms, self.crc)


@dataclass(frozen=True, slots=True)
class NewObject:
    """An object written to the store, with the blocks it holds."""

    object_id: int
    key: str
    size_bytes: int
    blocks: Sequence[BlockEntry]


#: Values bound in one ``IN (...)`` list (SQLite's default limit on bound parameters is far above).
_IN_LIST_MAX = 500
_STREAM_COLUMNS = ("stream_id, name, start_offset, committed_end_offset, committed_bytes, created_ms, "
                   "retention_ms, retention_bytes")
_RANGE_COLUMNS = ("r.stream_id, r.start_offset, r.end_offset, r.object_id, o.key, r.position, r.size_bytes, "
                  "r.record_count, r.max_timestamp_ms, r.crc")


class Metadata:
    """The store's metadata. Thread-safe: one connection behind a lock.

    ``location``: a SQLite file's path, or a PostgreSQL URI (``postgresql://user:password@host/db``).
    ``read_only`` (SQLite only): for inspection beside a running store. ``fence``: called inside every
    transaction that changes streams' data (commits of objects, replacements, trims, deletes) with the
    ids of the streams it changes; raising aborts the transaction (a broker that no longer leads a
    stream commits nothing for it: cluster/leases.py).
    """

    def __init__(self, location: Path | str, read_only: bool = False, fence: Fence | None = None) -> None:
        self._lock = threading.RLock()
        self._fence = fence
        self._db: Backend
        if isinstance(location, str) and is_postgres_uri(location):
            if read_only:
                raise ValueError("read_only is for a SQLite file beside a running store")
            self._db = PostgresBackend(location, SCHEMA)
        else:
            self._db = SqliteBackend(Path(location), SCHEMA, read_only)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[Backend]:
        with self._lock, writing(self._db):
            yield self._db

    def _check_fence(self, db: Backend, stream_ids: Sequence[int]) -> None:
        if self._fence is not None and stream_ids:
            self._fence(db, sorted(set(stream_ids)))

    def _bump_seq(self, db: Backend) -> int:
        db.execute("INSERT INTO meta VALUES ('commit_seq', 1) "
                   "ON CONFLICT(key) DO UPDATE SET value = meta.value + 1")
        return int(db.execute("SELECT value FROM meta WHERE key = 'commit_seq'").fetchone()[0])

    def get_meta(self, key: str, default: int = 0) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else int(row[0])

    def set_meta(self, key: str, value: int) -> None:
        """Set one meta value; durable when it returns."""
        with self._tx() as db:
            db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                       (key, value))

    @property
    def commit_seq(self) -> int:
        return self.get_meta("commit_seq")

    # Streams ---------------------------------------------------------------------------------------

    def create_stream(self, name: str | None, retention_ms: int | None = None,
                      retention_bytes: int | None = None) -> StreamMeta:
        with self._tx() as db:
            if name is not None and db.execute("SELECT 1 FROM streams WHERE name = ?", (name,)).fetchone():
                raise ValueError(f"a stream named {name!r} exists already")
            # The id SQLite gave before ids were taken here (largest + 1): the same on either database.
            stream_id = int(db.execute("SELECT COALESCE(MAX(stream_id), 0) + 1 FROM streams").fetchone()[0])
            db.execute("INSERT INTO streams (stream_id, name, created_ms, retention_ms, retention_bytes) "
                       "VALUES (?, ?, ?, ?, ?)", (stream_id, name, int(time.time() * 1000), retention_ms,
                                                  retention_bytes))
            self._bump_seq(db)
        return self.stream(stream_id)

    def create_streams(self, names: Sequence[str]) -> list[StreamMeta]:
        """Create many named streams in one transaction (one commit sequence number for all)."""
        names = list(names)
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ValueError(f"stream name {name!r} is given twice")
            seen.add(name)
        now = int(time.time() * 1000)
        try:
            with self._tx() as db:
                # Ids as SQLite would give them one by one (largest + 1), in one statement: a million
                # streams are created in seconds, not minutes.
                first = int(db.execute("SELECT COALESCE(MAX(stream_id), 0) + 1 FROM streams").fetchone()[0])
                db.executemany("INSERT INTO streams (stream_id, name, created_ms) VALUES (?, ?, ?)",
                               ((first + i, name, now) for i, name in enumerate(names)))
                self._bump_seq(db)
        except DuplicateError:
            with self._lock:  # rolled back: the names found now are the ones that existed before
                taken = next(n for n in names
                             if self._db.execute("SELECT 1 FROM streams WHERE name = ?", (n,)).fetchone())
            raise ValueError(f"a stream named {taken!r} exists already") from None
        return [StreamMeta(first + i, name, 0, 0, 0, now, None, None) for i, name in enumerate(names)]

    def stream(self, id_or_name: int | str) -> StreamMeta:
        column = "name" if isinstance(id_or_name, str) else "stream_id"
        with self._lock:
            row = self._db.execute(f"SELECT {_STREAM_COLUMNS} FROM streams WHERE {column} = ?",
                                   (id_or_name,)).fetchone()
        if row is None:
            raise UnknownStreamError(f"no stream {id_or_name!r}")
        return StreamMeta(*row)

    def streams_by_id(self, stream_ids: Sequence[int]) -> list[StreamMeta]:
        """The streams of ``stream_ids`` that exist, in id order (a few queries for any number)."""
        ids = sorted(set(stream_ids))
        rows = []
        with self._lock:
            for i in range(0, len(ids), _IN_LIST_MAX):
                chunk = ids[i:i + _IN_LIST_MAX]
                rows += self._db.execute(f"SELECT {_STREAM_COLUMNS} FROM streams WHERE stream_id IN "
                                         f"({','.join('?' * len(chunk))}) ORDER BY stream_id", chunk).fetchall()
        return [StreamMeta(*r) for r in rows]

    def streams(self) -> list[StreamMeta]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_STREAM_COLUMNS} FROM streams ORDER BY stream_id").fetchall()
        return [StreamMeta(*r) for r in rows]

    def set_retention(self, stream_id: int, retention_ms: int | None, retention_bytes: int | None) -> None:
        with self._tx() as db:
            db.execute("UPDATE streams SET retention_ms = ?, retention_bytes = ? WHERE stream_id = ?",
                       (retention_ms, retention_bytes, stream_id))

    # Objects ---------------------------------------------------------------------------------------

    def allocate_object_id(self) -> int:
        """A fresh object id, durable, so no key is ever reused even after a crash."""
        with self._tx() as db:
            db.execute("INSERT INTO meta VALUES ('next_object_id', 2) "
                       "ON CONFLICT(key) DO UPDATE SET value = meta.value + 1")
            return int(db.execute("SELECT value FROM meta WHERE key = 'next_object_id'").fetchone()[0]) - 1

    def commit_objects(self, objects: Sequence[NewObject]) -> int:
        """Register uploaded objects and move each stream's committed end past their blocks."""
        now = int(time.time() * 1000)
        with self._tx() as db:
            if _committed_already(db, objects):
                return int(db.execute("SELECT value FROM meta WHERE key = 'commit_seq'").fetchone()[0])
            self._check_fence(db, [b.stream_id for o in objects for b in o.blocks])
            _append_objects(db, objects, now)
            return self._bump_seq(db)

    def replace_objects(self, old_object_ids: Sequence[int], new_objects: Sequence[NewObject]) -> int:
        """Atomically swap the blocks of ``old_object_ids`` for those of ``new_objects`` (compaction).

        The new blocks must cover exactly the live ranges the old objects held. The old objects are
        marked unreferenced, not deleted: readers that already hold their keys keep working until
        :meth:`collect_unreferenced` passes their grace period.
        """
        now = int(time.time() * 1000)
        with self._tx() as db:
            marks = ",".join("?" * len(old_object_ids))
            old = db.execute(f"SELECT stream_id, start_offset, end_offset FROM ranges WHERE object_id IN ({marks}) "
                             "ORDER BY stream_id, start_offset", tuple(old_object_ids)).fetchall()
            new = sorted((b.stream_id, b.start_offset, b.end_offset) for o in new_objects for b in o.blocks)
            self._check_fence(db, [row[0] for row in old])
            if _coverage(old) != _coverage(new):
                raise ValueError("the new objects do not cover exactly the ranges of the old ones")
            db.execute(f"DELETE FROM ranges WHERE object_id IN ({marks})", tuple(old_object_ids))
            db.execute(f"UPDATE objects SET unreferenced_ms = ? WHERE object_id IN ({marks})",
                       (now, *old_object_ids))
            for obj in new_objects:
                db.execute("INSERT INTO objects (object_id, key, size_bytes, created_ms) VALUES (?, ?, ?, ?)",
                           (obj.object_id, obj.key, obj.size_bytes, now))
                for b in obj.blocks:
                    db.execute("INSERT INTO ranges VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               (b.stream_id, b.start_offset, b.end_offset, obj.object_id, b.position,
                                b.size_bytes, b.record_count, b.max_timestamp_ms, b.crc))
            return self._bump_seq(db)

    def reserve_object(self, object_id: int, key: str, until_ms: int) -> None:
        """Register an object before it is written, as unreferenced until ``until_ms``: a commit that names
        it (``replace_stream_blocks(..., reserved_until_ms=until_ms)``) takes it; if none does (its writer
        died), it is collected after ``until_ms`` as any object nothing refers to. So a crash between the
        write and the commit leaves no orphan, even where the object store is shared (a cluster)."""
        with self._tx() as db:
            db.execute("INSERT INTO objects (object_id, key, size_bytes, created_ms, unreferenced_ms) "
                       "VALUES (?, ?, 0, ?, ?)", (object_id, key, int(time.time() * 1000), until_ms))

    def replace_stream_blocks(self, stream_id: int, old_blocks: Sequence[RangeRow], new_object: NewObject,
                              clean_end_offset: int, *, reserved_until_ms: int | None = None) -> int:
        """Atomically put ``new_object``'s blocks (a cleaned copy) in place of ``old_blocks`` of one stream,
        and record that the stream is cleaned up to ``clean_end_offset`` (log compaction: engine/cleaner.py).

        The old blocks must still be the stream's blocks over the span they tile (a trim, a deletion or
        another replacement since they were read makes this raise StaleBlocksError, and nothing changes);
        the new blocks must tile the same span. Objects left without blocks are marked unreferenced, as a
        trim marks them: readers holding them finish within the grace period.
        """
        now = int(time.time() * 1000)
        span = (old_blocks[0].start_offset, old_blocks[-1].end_offset) if old_blocks else (0, 0)
        new = [(b.start_offset, b.end_offset) for b in new_object.blocks]
        if not old_blocks or _coverage([(stream_id, a, b) for a, b in new]) != [(stream_id, *span)] \
                or any(b.stream_id != stream_id for b in new_object.blocks):
            raise ValueError(f"the new blocks do not tile the span {span} of stream {stream_id}")
        with self._tx() as db:
            self._check_fence(db, [stream_id])
            held = db.execute("SELECT start_offset, end_offset, object_id FROM ranges WHERE stream_id = ? AND "
                              "end_offset > ? AND start_offset < ? ORDER BY start_offset",
                              (stream_id, *span)).fetchall()
            if [tuple(r) for r in held] != [(b.start_offset, b.end_offset, b.object_id) for b in old_blocks]:
                raise StaleBlocksError(f"stream {stream_id}'s blocks over {span} changed since they were read")
            db.execute("DELETE FROM ranges WHERE stream_id = ? AND start_offset >= ? AND end_offset <= ?",
                       (stream_id, *span))
            if reserved_until_ms is None:
                db.execute("INSERT INTO objects (object_id, key, size_bytes, created_ms) VALUES (?, ?, ?, ?)",
                           (new_object.object_id, new_object.key, new_object.size_bytes, now))
            elif db.execute("UPDATE objects SET size_bytes = ?, unreferenced_ms = NULL WHERE object_id = ? AND "
                            "unreferenced_ms = ?", (new_object.size_bytes, new_object.object_id,
                                                    reserved_until_ms)).rowcount != 1:
                raise StaleBlocksError(f"object {new_object.key} is no longer reserved")
            db.executemany("INSERT INTO ranges VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [(b.stream_id, b.start_offset, b.end_offset, new_object.object_id, b.position,
                             b.size_bytes, b.record_count, b.max_timestamp_ms, b.crc) for b in new_object.blocks])
            shrunk = sum(b.size_bytes for b in old_blocks) - sum(b.size_bytes for b in new_object.blocks)
            db.execute("UPDATE streams SET committed_bytes = committed_bytes - ? WHERE stream_id = ?",
                       (shrunk, stream_id))
            for object_id in sorted({b.object_id for b in old_blocks}):
                if not db.execute("SELECT 1 FROM ranges WHERE object_id = ? LIMIT 1", (object_id,)).fetchone():
                    db.execute("UPDATE objects SET unreferenced_ms = ? WHERE object_id = ?", (now, object_id))
            db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                       (_clean_end_key(stream_id), clean_end_offset))
            return self._bump_seq(db)

    def clean_end_offset(self, stream_id: int) -> int:
        """Where the cleaner stopped in ``stream_id`` (0: never cleaned): offsets below were compacted."""
        return self.get_meta(_clean_end_key(stream_id), 0)

    def commit_external_objects(self, objects: Sequence[NewObject], marker_key: str | None = None,
                                marker_value: int = 0) -> int | None:
        """Register objects written outside the store (Spark writers), like :meth:`commit_objects`.

        With ``marker_key``, the commit happens at most once per ``marker_value``: the meta row
        ``marker_key`` is raised to ``marker_value`` in the same transaction, and a commit whose value is
        not above the stored one does nothing and returns None (a replayed streaming batch).
        """
        now = int(time.time() * 1000)
        with self._tx() as db:
            if marker_key is not None:
                row = db.execute("SELECT value FROM meta WHERE key = ?", (marker_key,)).fetchone()
                if row is not None and int(row[0]) >= marker_value:
                    return None
                db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                           (marker_key, marker_value))
            self._check_fence(db, [b.stream_id for o in objects for b in o.blocks])
            _append_objects(db, objects, now)
            return self._bump_seq(db)

    def objects(self) -> list[ObjectMeta]:
        with self._lock:
            rows = self._db.execute("SELECT object_id, key, size_bytes, created_ms, unreferenced_ms FROM objects "
                                    "ORDER BY object_id").fetchall()
        return [ObjectMeta(*r) for r in rows]

    def collect_unreferenced(self, older_than_ms: int) -> list[ObjectMeta]:
        """Objects unreferenced before ``older_than_ms``: safe to delete from the store now."""
        with self._lock:
            rows = self._db.execute(
                "SELECT object_id, key, size_bytes, created_ms, unreferenced_ms FROM objects "
                "WHERE unreferenced_ms IS NOT NULL AND unreferenced_ms <= ? ORDER BY object_id",
                (older_than_ms,)).fetchall()
        return [ObjectMeta(*r) for r in rows]

    def forget_object(self, object_id: int) -> None:
        """Drop an unreferenced object's row once it is deleted from the store."""
        with self._tx() as db:
            db.execute("DELETE FROM objects WHERE object_id = ? AND unreferenced_ms IS NOT NULL", (object_id,))

    # Ranges and trim -------------------------------------------------------------------------------

    def ranges(self, stream_id: int, start_offset: int, end_offset: int | None = None,
               limit: int = 64) -> list[RangeRow]:
        """Blocks of ``stream_id`` overlapping ``[start_offset, end_offset)``, in offset order."""
        end = end_offset if end_offset is not None else 1 << 62
        with self._lock:
            # A stream's blocks tile its offsets without overlap, so the one holding start_offset has the
            # largest start at or below it: seek there on the primary key instead of scanning from 0.
            rows = self._db.execute(
                f"SELECT {_RANGE_COLUMNS} FROM ranges r JOIN objects o USING (object_id) "
                "WHERE r.stream_id = ? AND r.start_offset >= COALESCE((SELECT MAX(start_offset) FROM ranges "
                "WHERE stream_id = ? AND start_offset <= ?), 0) AND r.end_offset > ? AND r.start_offset < ? "
                "ORDER BY r.start_offset LIMIT ?",
                (stream_id, stream_id, start_offset, start_offset, end, limit)).fetchall()
        return [RangeRow(*r) for r in rows]

    def latest_range(self, stream_id: int, start_offset: int) -> RangeRow | None:
        """The first block (in offset order) holding the largest timestamp among blocks past ``start_offset``."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {_RANGE_COLUMNS} FROM ranges r JOIN objects o USING (object_id) "
                "WHERE r.stream_id = ? AND r.end_offset > ? ORDER BY r.max_timestamp_ms DESC, r.start_offset "
                "LIMIT 1", (stream_id, start_offset)).fetchone()
        return RangeRow(*row) if row else None

    def ranges_of_object(self, key: str) -> list[RangeRow]:
        """The blocks metadata places in the object at ``key``, by position (for inspection)."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_RANGE_COLUMNS} FROM ranges r JOIN objects o USING (object_id) WHERE o.key = ? "
                "ORDER BY r.position", (key,)).fetchall()
        return [RangeRow(*r) for r in rows]

    def first_range_at_or_after_time(self, stream_id: int, timestamp_ms: int) -> RangeRow | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_RANGE_COLUMNS} FROM ranges r JOIN objects o USING (object_id) "
                "WHERE r.stream_id = ? AND r.max_timestamp_ms >= ? ORDER BY r.start_offset LIMIT 1",
                (stream_id, timestamp_ms)).fetchone()
        return None if row is None else RangeRow(*row)

    def trim_stream(self, stream_id: int, new_start_offset: int) -> int:
        """Move a stream's start forward; drop blocks wholly below it; mark objects nothing needs."""
        now = int(time.time() * 1000)
        with self._tx() as db:
            self._check_fence(db, [stream_id])
            row = db.execute("SELECT start_offset FROM streams WHERE stream_id = ?", (stream_id,)).fetchone()
            if row is None:
                raise UnknownStreamError(f"no stream {stream_id}")
            if new_start_offset <= row[0]:
                return self._bump_seq(db)
            gone = db.execute("SELECT object_id, size_bytes FROM ranges WHERE stream_id = ? AND end_offset <= ?",
                              (stream_id, new_start_offset)).fetchall()
            db.execute("DELETE FROM ranges WHERE stream_id = ? AND end_offset <= ?", (stream_id, new_start_offset))
            db.execute("UPDATE streams SET start_offset = ?, committed_bytes = committed_bytes - ? "
                       "WHERE stream_id = ?", (new_start_offset, sum(g[1] for g in gone), stream_id))
            for object_id in {g[0] for g in gone}:
                if not db.execute("SELECT 1 FROM ranges WHERE object_id = ? LIMIT 1", (object_id,)).fetchone():
                    db.execute("UPDATE objects SET unreferenced_ms = ? WHERE object_id = ?", (now, object_id))
            return self._bump_seq(db)

    def delete_stream(self, stream_id: int) -> int:
        """Forget a stream, its blocks and the sinks' markers of its partition (sink_markers.py); mark
        objects nothing needs any more."""
        now = int(time.time() * 1000)
        with self._tx() as db:
            self._check_fence(db, [stream_id])
            objects = [r[0] for r in db.execute("SELECT DISTINCT object_id FROM ranges WHERE stream_id = ?",
                                                (stream_id,)).fetchall()]
            row = db.execute("SELECT name FROM streams WHERE stream_id = ?", (stream_id,)).fetchone()
            if row is None:
                raise UnknownStreamError(f"no stream {stream_id}")
            db.execute("DELETE FROM ranges WHERE stream_id = ?", (stream_id,))
            db.execute("DELETE FROM streams WHERE stream_id = ?", (stream_id,))
            db.execute("DELETE FROM meta WHERE key = ?", (_clean_end_key(stream_id),))
            if row[0] is not None:
                _delete_partition_markers(db, row[0])
            for object_id in objects:
                if not db.execute("SELECT 1 FROM ranges WHERE object_id = ? LIMIT 1", (object_id,)).fetchone():
                    db.execute("UPDATE objects SET unreferenced_ms = ? WHERE object_id = ?", (now, object_id))
            return self._bump_seq(db)

    def ranges_by_time(self, stream_id: int) -> list[tuple[int, int, int]]:
        """``(end_offset, max_timestamp_ms, size_bytes)`` of a stream's blocks, oldest first (retention)."""
        with self._lock:
            rows = self._db.execute("SELECT end_offset, max_timestamp_ms, size_bytes FROM ranges "
                                    "WHERE stream_id = ? ORDER BY start_offset", (stream_id,)).fetchall()
        return [(int(a), int(b), int(c)) for a, b, c in rows]


def _delete_partition_markers(db: Backend, name: str) -> None:
    keys = [r[0] for r in db.execute("SELECT key FROM meta WHERE key LIKE ? ESCAPE '\\'",
                                     (partition_markers_like(name),)).fetchall()]
    for key in keys:
        if marker_partition(key) == name:
            db.execute("DELETE FROM meta WHERE key = ?", (key,))


def _clean_end_key(stream_id: int) -> str:
    return f"clean_end:{stream_id}"


def _append_objects(db: Backend, objects: Sequence[NewObject], now_ms: int) -> None:
    """Register objects whose blocks extend their streams, each block starting at its stream's committed end
    (or at the end of the block before it in ``objects``). A few statements for any number of blocks."""
    blocks = [(obj.object_id, b) for obj in objects for b in obj.blocks]
    touched = sorted({b.stream_id for _, b in blocks})
    ends: dict[int, int] = {}
    for i in range(0, len(touched), _IN_LIST_MAX):
        chunk = touched[i:i + _IN_LIST_MAX]
        ends.update(db.execute("SELECT stream_id, committed_end_offset FROM streams WHERE stream_id IN "
                               f"({','.join('?' * len(chunk))})", chunk).fetchall())
    added: dict[int, int] = {}
    for _, b in blocks:
        end = ends.get(b.stream_id)
        if end != b.start_offset:
            raise ValueError(f"stream {b.stream_id}: block at {b.start_offset} does not follow the committed "
                             f"end {end}")
        ends[b.stream_id] = b.end_offset
        added[b.stream_id] = added.get(b.stream_id, 0) + b.size_bytes
    db.executemany("INSERT INTO objects (object_id, key, size_bytes, created_ms) VALUES (?, ?, ?, ?)",
                   [(obj.object_id, obj.key, obj.size_bytes, now_ms) for obj in objects])
    db.executemany("INSERT INTO ranges VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [(b.stream_id, b.start_offset, b.end_offset, object_id, b.position, b.size_bytes,
                     b.record_count, b.max_timestamp_ms, b.crc) for object_id, b in blocks])
    db.executemany("UPDATE streams SET committed_end_offset = ?, committed_bytes = committed_bytes + ? "
                   "WHERE stream_id = ?", [(ends[sid], size, sid) for sid, size in added.items()])


def _committed_already(db: Backend, objects: Sequence[NewObject]) -> bool:
    """Whether a commit of ``objects`` is already in: a retry after a commit whose answer was lost (the
    connection to PostgreSQL broke after the server committed) must not append the blocks twice. Object
    ids are never reused, so finding them all means this very commit went through."""
    ids = sorted({o.object_id for o in objects})
    if not ids:
        return False
    found = 0
    for i in range(0, len(ids), _IN_LIST_MAX):
        chunk = ids[i:i + _IN_LIST_MAX]
        found += int(db.execute(f"SELECT COUNT(*) FROM objects WHERE object_id IN ({','.join('?' * len(chunk))})",
                                chunk).fetchone()[0])
    if found not in (0, len(ids)):
        raise ValueError(f"{found} of the {len(ids)} objects of this commit are registered already")
    return found == len(ids)


def _coverage(rows: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Merge adjacent ``(stream, start, end)`` ranges so two tilings of the same span compare equal."""
    merged: list[tuple[int, int, int]] = []
    for stream_id, start, end in sorted(rows):
        if merged and merged[-1][0] == stream_id and merged[-1][2] == start:
            merged[-1] = (stream_id, merged[-1][1], end)
        else:
            merged.append((stream_id, start, end))
    return merged
