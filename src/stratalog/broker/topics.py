"""Topics: names, ids, partition counts and configs, durable in the broker's metadata (``broker.sqlite``
beside the store, or PostgreSQL: metadata_db.py).

A topic's partition *p* is the engine stream named ``"<topic>/<p>"`` (a topic name cannot hold a
``/``). Creating a topic creates its streams first (or takes the empty ones a create cut short by a
crash left), then its row: the row is what makes a topic exist. Deleting it replaces the row by rows
naming its streams as doomed, in one transaction, then deletes the streams and the doomed rows; a
broker that stops in between deletes them at its next start (``doomed_streams``).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from stratalog.broker.metadata_db import Location, open_metadata
from stratalog.engine.metadata_backends import DuplicateError, writing
from stratalog.errors import StratalogError

SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    topic_id BLOB NOT NULL UNIQUE,
    partitions INTEGER NOT NULL,
    configs TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS doomed_streams (name TEXT PRIMARY KEY);
"""
#: Kafka's rule for topic names: at most 249 of these characters, not "." or "..".
TOPIC_NAME_CHARS_MAX = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


class InvalidTopicError(StratalogError, ValueError):
    """A topic name Kafka would refuse (INVALID_TOPIC_EXCEPTION)."""


class TopicExistsError(StratalogError):
    """TOPIC_ALREADY_EXISTS."""


class UnknownTopicError(StratalogError, KeyError):
    """UNKNOWN_TOPIC_OR_PARTITION."""


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


def check_topic_name(name: str | None) -> str:
    if not name:
        raise InvalidTopicError("a topic name must not be empty")
    if len(name) > TOPIC_NAME_CHARS_MAX:
        raise InvalidTopicError(f"topic name of {len(name)} characters; the limit is {TOPIC_NAME_CHARS_MAX}")
    if name in (".", "..") or not _LEGAL.fullmatch(name):
        raise InvalidTopicError(f"topic name {name!r}: only ASCII letters, digits, '.', '_' and '-' are allowed")
    return name


def stream_name(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def parse_stream_name(name: str) -> tuple[str, int] | None:
    topic, sep, partition = name.rpartition("/")
    if not sep or not partition.isdigit():
        return None
    return topic, int(partition)


def _topic(name: str, topic_id: bytes, partitions: int, configs: str) -> Topic:
    return Topic(name, uuid.UUID(bytes=bytes(topic_id)), partitions, json.loads(configs))


class TopicRegistry:
    """The broker's topics. Thread-safe; every change is durable when the call returns.

    ``location``: ``broker.sqlite``'s path, or a PostgreSQL URI."""

    def __init__(self, location: Location, *, shared: bool = False) -> None:
        self._lock = threading.Lock()
        self._db = open_metadata(location, SCHEMA)
        #: Other brokers change the table too (a cluster): a name not known here is looked up in it.
        self._shared = shared
        self._topics: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}
        self.refresh()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def refresh(self) -> None:
        """Read every topic again (a broker of a cluster does it periodically, for the topics other
        brokers made, changed or deleted). Safe from any thread: the maps are replaced whole."""
        with self._lock:
            rows = self._db.execute("SELECT name, topic_id, partitions, configs FROM topics").fetchall()
            topics = [_topic(*row) for row in rows]
            self._topics = {t.name: t for t in topics}
            self._by_id = {t.topic_id: t for t in topics}

    def _remember(self, topic: Topic) -> None:
        self._topics[topic.name] = topic
        self._by_id[topic.topic_id] = topic

    def cached(self, name: str) -> Topic | None:
        """The topic as this broker last read it, without asking the table."""
        return self._topics.get(name)

    def get(self, name: str) -> Topic | None:
        topic = self._topics.get(name)
        if topic is None and self._shared:
            with self._lock:
                row = self._db.execute("SELECT name, topic_id, partitions, configs FROM topics WHERE name = ?",
                                       (name,)).fetchone()
                if row is not None:
                    topic = _topic(*row)
                    self._remember(topic)
        return topic

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return self._by_id.get(topic_id)

    def all(self) -> list[Topic]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def add(self, name: str, partitions: int, configs: dict[str, str]) -> Topic:
        """Record a new topic (its streams exist already)."""
        topic = Topic(name, uuid.uuid4(), partitions, dict(configs))
        with self._lock:
            if name in self._topics:
                raise TopicExistsError(f"topic {name!r} already exists")
            try:
                self._db.execute("INSERT INTO topics VALUES (?, ?, ?, ?, ?)",
                                 (name, topic.topic_id.bytes, partitions, json.dumps(configs),
                                  int(time.time() * 1000)))
            except DuplicateError:
                # Another broker sharing the metadata database made it meanwhile.
                raise TopicExistsError(f"topic {name!r} already exists") from None
            self._remember(topic)
        return topic

    def remove(self, name: str) -> Topic:
        """Forget a topic; its streams are doomed until ``forget_doomed`` says they are deleted."""
        with self._lock:
            topic = self._topics.get(name)
            if topic is None:
                raise UnknownTopicError(f"no topic {name!r}")
            with writing(self._db):
                self._db.execute("DELETE FROM topics WHERE name = ?", (name,))
                self._db.executemany("INSERT INTO doomed_streams VALUES (?) ON CONFLICT (name) DO NOTHING",
                                     [(stream_name(name, p),) for p in range(topic.partitions)])
            self._topics.pop(name, None)
            self._by_id.pop(topic.topic_id, None)
        return topic

    def doomed_streams(self) -> list[str]:
        with self._lock:
            # Sorted here, by code point: a PostgreSQL database's collation may order text otherwise.
            return sorted(r[0] for r in self._db.execute("SELECT name FROM doomed_streams").fetchall())

    def forget_doomed(self, names: Iterable[str]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM doomed_streams WHERE name = ?", [(n,) for n in names])

    def set_partitions(self, name: str, partitions: int) -> Topic:
        return self._update(name, partitions=partitions)

    def set_configs(self, name: str, configs: dict[str, str]) -> Topic:
        return self._update(name, configs=configs)

    def _update(self, name: str, *, partitions: int | None = None, configs: dict[str, str] | None = None) -> Topic:
        with self._lock:
            old = self._topics.get(name)
            if old is None:
                raise UnknownTopicError(f"no topic {name!r}")
            new = Topic(name, old.topic_id, old.partitions if partitions is None else partitions,
                        old.configs if configs is None else dict(configs))
            self._db.execute("UPDATE topics SET partitions = ?, configs = ? WHERE name = ?",
                             (new.partitions, json.dumps(new.configs), name))
            self._remember(new)
        return new

    def next_counter(self, name: str) -> int:
        """A durable counter (producer ids): each call returns one more than the last, across restarts."""
        with self._lock:
            # One statement: brokers sharing a database never read the same value.
            rows = self._db.execute("INSERT INTO counters VALUES (?, 0) ON CONFLICT (name) DO UPDATE "
                                    "SET value = counters.value + 1 RETURNING value", (name,)).fetchall()
            return int(rows[0][0])
