"""The broker's metadata file, ``broker.sqlite``: one way to open it for every table kept there (topics,
credentials, ACLs, client quotas), so each opens it alike."""

from __future__ import annotations

import sqlite3
from pathlib import Path

#: How long a writer waits for another connection's transaction: the broker's own tables share the file,
#: and `stratalog users` may write while the broker runs.
BUSY_TIMEOUT_S = 10.0


def open_metadata(path: Path, schema: str) -> sqlite3.Connection:
    """A connection to ``path`` in autocommit mode (callers open their own transactions), write-ahead
    journal, synced at each commit (a change is durable when its call returns), ``schema`` applied."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(schema)
    return db
