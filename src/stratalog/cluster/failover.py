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
import re
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
from stratalog.wal.object_format import ROOT_PREFIX
from stratalog.wal.object_wal import ObjectWAL

log = logging.getLogger("stratalog.cluster")
#: A key of an incarnation's object log: ``wal/broker-<id>-<epoch>/...`` (log_owner).
_LOG_KEY = re.compile(re.escape(ROOT_PREFIX) + r"broker-(\d+)-(\d+)/")


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


def incarnation_of(key: str) -> tuple[int, int] | None:
    """(broker id, epoch) of the incarnation whose object log holds ``key``, or None for another key."""
    match = _LOG_KEY.match(key)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def sweep_finished_logs(cluster: Cluster, objects: ObjectStore) -> int:
    """Delete the objects left under the logs nobody needs any more (Cluster.finished_logs); return how
    many. A log that left clean or was replayed keeps no records anyone reads; what is still there was
    put after (by a broker cut off from the database, never acknowledged) or was left by a trim's
    background deletes. Any broker may sweep: a delete of a key already gone does nothing."""
    finished = cluster.finished_logs()
    doomed = [info.key for info in objects.list(ROOT_PREFIX) if incarnation_of(info.key) in finished]
    for key in doomed:
        objects.delete(key)
    if doomed:
        log.info("deleted %d objects left under the logs of %d finished broker incarnations", len(doomed),
                 len({incarnation_of(k) for k in doomed}))
    return len(doomed)


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
