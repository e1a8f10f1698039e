"""Taking over from a dead broker: replay its write-ahead log, commit what only the log held, then let its
partitions be taken over (leases.py says when a log needs it and who may do it).

Each broker incarnation writes its log in object storage under its own owner name
(:func:`log_owner`), so the log outlives the machine. The replay is the stream store's own recovery run
on that log: a store opened on the dead incarnation's log (and a scratch directory of the claimant's)
replays the records after the log's trim point, skips what metadata says is already in objects, uploads
the rest and commits it under the recovery fence, then trims the log. Records the dead broker
acknowledged are therefore in objects before anyone serves its partitions again, exactly once.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stratalog.cluster.assignment import Holder
from stratalog.cluster.leases import Cluster
from stratalog.engine.config import StoreConfig
from stratalog.engine.store import RecoveryReport, StreamStore
from stratalog.objects.store import ObjectInfo, ObjectStore
from stratalog.wal.config import ObjectWALConfig
from stratalog.wal.object_wal import ObjectWAL

log = logging.getLogger("stratalog.cluster")


class _Borrowed:
    """The caller's object store, lent to the replaying store: its close leaves the store open."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self._store.put(key, data)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._store.get(key, start, end)

    def size(self, key: str) -> int:
        return self._store.size(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self._store.list(prefix)

    def delete(self, key: str) -> None:
        self._store.delete(key)

    def rename(self, src: str, dst: str) -> None:
        self._store.rename(src, dst)

    def close(self) -> None:
        pass


def log_owner(broker_id: int, epoch: int) -> str:
    """The owner name of an incarnation's object log (its objects lie under ``wal/<owner>/``)."""
    return f"broker-{broker_id}-{epoch}"


@dataclass(frozen=True, slots=True)
class Replayed:
    """What one replay did."""

    dead: Holder
    report: RecoveryReport
    seconds: float


def replay_dead_log(cluster: Cluster, objects: ObjectStore, metadata_uri: str, scratch_dir: Path,
                    config: StoreConfig | None = None, wal_config: ObjectWALConfig | None = None) -> Replayed | None:
    """Claim one dead incarnation's log, replay it and mark it recovered; None when no log needs it.

    ``scratch_dir`` holds the replaying store's lock and local files, and is removed afterwards. If the
    replay fails (the claim is lost, the object store or the database is out of reach), the error
    propagates and the log stays open: this broker claims it again at its next try, or, if it dies, the
    claim goes with its lease and the next claimant replays it (what was committed is skipped).
    """
    dead = cluster.claim_dead_log()
    if dead is None:
        return None
    started = time.monotonic()
    owner = log_owner(dead.broker_id, dead.broker_epoch)
    work = scratch_dir / f"replay-{owner}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        wal = ObjectWAL.open(objects, owner, wal_config)
        store = StreamStore.open(work, _Borrowed(objects), config, metadata=metadata_uri,
                                 fence=cluster.recovery_fence(dead), wal=wal)
        report = store.recovery
        store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cluster.finish_recovery(dead)
    replayed = Replayed(dead, report, time.monotonic() - started)
    log.info("replayed the log of broker %d (epoch %d): %d batches in %.2f s", dead.broker_id, dead.broker_epoch,
             report.batches_replayed, replayed.seconds)
    return replayed
