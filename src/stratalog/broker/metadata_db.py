"""Where the broker's tables live, and one way to open them.

By default each is a SQLite file in the data directory: ``broker.sqlite`` (topics, counters, doomed
streams, SCRAM credentials, ACLs, client quotas), ``offsets.sqlite`` (committed offsets),
``producers.sqlite`` (the idempotent producers' snapshot) and ``transactions.sqlite`` (the transaction
coordinator's state). With ``--metadata postgresql://...`` every
one of them, and the stream store's own metadata, is a table of that one PostgreSQL database, the source
of truth that several brokers over shared object storage will share. The tables' SQL is written once for
both (engine/metadata_backends.py says what both accept).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stratalog.engine.metadata_backends import (
    Backend,
    PostgresBackend,
    SqliteBackend,
    is_postgres_uri,
    without_password,
)

#: How long a writer waits for another connection's transaction: the broker's own tables share the file,
#: and `stratalog users` may write while the broker runs.
BUSY_TIMEOUT_S = 10.0
#: The advisory lock that serialises the broker tables' writers in PostgreSQL: apart from the stream
#: store's (metadata_backends.WRITER_LOCK_KEY), so an offset commit never waits for an upload's commit.
BROKER_WRITER_LOCK_KEY = 0x5354524B   # "STRK"
#: The data directory's files, by default.
BROKER_FILE = "broker.sqlite"
OFFSETS_FILE = "offsets.sqlite"
PRODUCERS_FILE = "producers.sqlite"
TRANSACTIONS_FILE = "transactions.sqlite"

#: A table's place: a SQLite file's path, or a PostgreSQL URI.
Location = Path | str


def open_metadata(location: Location, schema: str, *, synchronous: str = "FULL") -> Backend:
    """The database at ``location`` with ``schema`` applied (SQLite: write-ahead journal, synced at each
    commit unless ``synchronous`` is NORMAL; PostgreSQL: committed synchronously). Callers open their own
    transactions with ``metadata_backends.writing``; a lone statement is its own transaction."""
    if isinstance(location, str) and is_postgres_uri(location):
        return PostgresBackend(location, schema, writer_lock_key=BROKER_WRITER_LOCK_KEY)
    return SqliteBackend(Path(location), schema, synchronous=synchronous, busy_timeout_s=BUSY_TIMEOUT_S)


@dataclass(frozen=True, slots=True)
class BrokerTables:
    """Where each of a broker's tables lives: files in ``data_dir``, or the PostgreSQL database ``uri``."""

    data_dir: Path
    uri: str | None = None

    def __post_init__(self) -> None:
        if self.uri is not None and not is_postgres_uri(self.uri):
            # Not echoed: a mistyped scheme may still hold a password.
            raise ValueError("the metadata database is named by a PostgreSQL URI: "
                             "postgresql://USER:PASSWORD@HOST:PORT/DATABASE")

    def _at(self, file_name: str) -> Location:
        return self.uri if self.uri is not None else self.data_dir / file_name

    @property
    def broker(self) -> Location:
        return self._at(BROKER_FILE)

    @property
    def offsets(self) -> Location:
        return self._at(OFFSETS_FILE)

    @property
    def producers(self) -> Location:
        return self._at(PRODUCERS_FILE)

    @property
    def transactions(self) -> Location:
        return self._at(TRANSACTIONS_FILE)

    @property
    def shown(self) -> str:
        """Where the tables are, for messages and logs: never the password."""
        if self.uri is None:
            return str(self.data_dir)
        return without_password(self.uri)
