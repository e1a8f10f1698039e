"""Where the data source finds a store: one string, in whichever form the user has at hand.

``path`` (or ``bootstrap``) may name:

- a running broker: ``kafka://HOST:PORT[,HOST:PORT...]`` (or option ``bootstrap=HOST:PORT``). The
  driver asks it for topics, partitions and their ends, and for its object storage (broker config
  ``stratalog.object.store.uri``); executors read uploaded data straight from the objects and the rest
  from the broker (Kafka Fetch). Options ``kafka.<setting>`` go to the Kafka client (TLS, SASL);
- object storage: ``s3://bucket/prefix?endpoint=URL&region=NAME`` or ``file:///absolute/path``;
- a directory: a store's object directory (it holds ``manifest/``), or a store's data directory (it
  holds ``objects/``), whose objects are then read.

``path`` and ``bootstrap`` together: the broker for its tail, ``path`` for its objects (where the
broker's own answer is not reachable from the Spark job, or names a directory on another machine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.engine.manifest import MANIFEST_PREFIX
from stratalog.objects.uri import LOCAL_DIR_NAME, redact
from stratalog.queues.manifest import QUEUE_MANIFEST_KEY
from stratalog.spark.options import kafka_options, option

KAFKA_SCHEME = "kafka://"
#: Files that mark a store's data directory (the engine's metadata, the broker's).
_DATA_DIR_MARKERS = ("meta.sqlite", "broker.sqlite", "wal")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}$")
EXPECTED = ("a broker address (kafka://127.0.0.1:9092, or option 'bootstrap'), an object store URI "
            "(s3://bucket/prefix?endpoint=URL, file:///absolute/path) or a store's data or object directory")


class StoreLocationError(ValueError):
    """The options do not name a store the data source can read."""


@dataclass(frozen=True, slots=True)
class Location:
    """A store as the options name it. At least one of the two is set."""

    #: The object storage to read uploaded data from (a URI or a local directory path).
    objects: str | None = None
    #: The broker's bootstrap servers (``host:port,host:port``).
    bootstrap: str | None = None
    #: Kafka client settings (from ``kafka.*`` options).
    kafka: dict[str, str] = field(default_factory=dict)
    #: The store's data directory, when ``path`` named one (writes at rest need it).
    data_dir: str | None = None

    @property
    def broker(self) -> bool:
        return self.bootstrap is not None


def locate(options: dict[str, str]) -> Location:
    """The store named by ``path`` and ``bootstrap``; StoreLocationError saying what was expected."""
    path = option(options, "path")
    bootstrap = option(options, "bootstrap") or option(options, "kafka.bootstrap.servers")
    if path is not None and path.startswith(KAFKA_SCHEME):
        if bootstrap is not None:
            raise StoreLocationError("give the broker once: as path kafka://HOST:PORT or as option 'bootstrap'")
        bootstrap, path = path[len(KAFKA_SCHEME):].rstrip("/"), None
    if bootstrap is not None:
        bootstrap = _check_bootstrap(bootstrap)
    objects = _objects(path) if path else None
    if objects is None and bootstrap is None:
        raise StoreLocationError(f"the stratalog data source needs option 'path': {EXPECTED}")
    settings = {k: v for k, v in kafka_options(options).items() if k != "bootstrap.servers"}
    data_dir = path if path and objects == str(Path(path) / LOCAL_DIR_NAME) else None
    return Location(objects, bootstrap, settings, data_dir)


def _check_bootstrap(bootstrap: str) -> str:
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    bad = [s for s in servers if not _HOST_PORT.match(s)]
    if not servers or bad:
        raise StoreLocationError(f"broker address {bootstrap!r}: expected HOST:PORT[,HOST:PORT...], as in "
                                 "kafka://127.0.0.1:9092")
    return ",".join(servers)


def _holds_objects(directory: Path) -> bool:
    """A stream store's object directory (its manifests) or a queue store's (its queue manifest)."""
    return (directory / MANIFEST_PREFIX).is_dir() or (directory / QUEUE_MANIFEST_KEY).is_file()


def _objects(path: str) -> str:
    if "://" in path:
        scheme = path.split("://", 1)[0].lower()
        if scheme not in ("s3", "file"):
            raise StoreLocationError(f"path {redact(path)!r} has scheme {scheme!r}: expected {EXPECTED}")
        return path
    directory = Path(path)
    if _holds_objects(directory):
        return str(directory)
    if _holds_objects(directory / LOCAL_DIR_NAME):
        return str(directory / LOCAL_DIR_NAME)
    if any((directory / marker).exists() for marker in _DATA_DIR_MARKERS):
        raise StoreLocationError(
            f"{path} is a store's data directory whose objects are not under {LOCAL_DIR_NAME}/ (it was opened "
            "with another object store): give that object store's URI as 'path', or the broker's address")
    if not directory.exists():
        raise StoreLocationError(f"path {path!r} does not exist: expected {EXPECTED}")
    raise StoreLocationError(f"{path} holds no store (no {MANIFEST_PREFIX} and no {LOCAL_DIR_NAME}/{MANIFEST_PREFIX}): "
                             f"expected {EXPECTED}")


def object_store(options: dict[str, str]) -> str:
    """The object storage named by ``path`` (a read or write of a store at rest, not of a broker)."""
    location = locate(options)
    if location.objects is None:
        raise StoreLocationError("this needs the store's object storage as option 'path' (a broker address "
                                 f"alone does not do here): {EXPECTED}")
    return location.objects
