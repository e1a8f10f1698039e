"""Transactions of a store at rest: which records a read_committed read of a data directory returns, with
no broker to ask.

A live broker's partition leader knows each partition's open transactions and aborted ranges
(spark/txn_ranges.py asks it). A stopped one left them in its data directory's ``producers.sqlite``
(broker/producer_recovery.py): every aborted range (made durable as its abort marker is written), and a
snapshot of the transactions open in each partition up to an end offset (at every snapshot interval, and
at a clean stop). What lies after the snapshot the broker learns at its next start by reading the log
(its replay); a read at rest does the same over the uploaded objects: the snapshot loaded read-only, then
the broker's own ``replay`` over each stream's batches in objects, from the snapshot's end to the
manifest's. What comes out, per stream: where read_committed ends (where the oldest transaction still
open at the manifest's end began, or that end) and the aborted ranges, which the tasks filter by
(spark/aborted.py).

Decision table (``E_s``: a stream's end in the snapshot; ``E_m``: its end in the manifest):

- no ``producers.sqlite`` (the objects named alone; a broker that kept its tables in PostgreSQL): every
  record up to ``E_m``, but a transactional batch fails the read (TransactionsUnknownError, which says how
  to read it);
- ``E_s >= E_m`` (a clean stop; after a crash, objects behind the snapshot): exact. A transaction begun
  below ``E_m`` ended before ``E_s`` (if aborted, its range is in the file: ranges are made durable before
  a snapshot may end past their marker) or is open in the snapshot, and stops the read at its first offset;
- ``E_s < E_m`` (a crash after an upload; writes at rest after the stop): exact, the replay of
  ``[E_s, E_m)`` finding the transactions begun and ended there;
- a stream that is not a topic's partition (not named ``topic/partition``): no broker served it, so no
  transaction wrote it; read whole, without a replay;
- a replay that would read more than ``REPLAY_BYTES_MAX``: exact up to the block where it stopped; the read
  ends there (or at an open transaction before it), with a warning that says how to read the rest.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pyarrow as pa

from stratalog.broker.metadata_db import PRODUCERS_FILE
from stratalog.broker.producer_recovery import ProducerSnapshots, replay
from stratalog.broker.producers import ProducerStates
from stratalog.broker.topics import parse_stream_name
from stratalog.broker.txn_partitions import PartitionTxns
from stratalog.engine.batch import StoredBatch, stored_batch
from stratalog.engine.manifest import Manifest
from stratalog.engine.objformat import check_block, placed_batches
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.objects.store import ObjectStore
from stratalog.spark.aborted import StreamTxns, ranges_for
from stratalog.spark.plan import ReadPartition
from stratalog.spark.reader import read_partition

if TYPE_CHECKING:
    from stratalog.engine import Stream

log = logging.getLogger("stratalog.spark")

#: Bytes of blocks a read at rest replays past the producers' snapshot, over all its streams, at most: it
#: runs on the driver before any task, at about 100 MiB/s (16 KiB transactional batches, a commit marker
#: every four, from a local directory, 2 vCPUs under load), so 512 MiB holds a read's planning to about 5 s.
#: A crash leaves one snapshot interval (2 s) of writes after it: 512 MiB covers 256 MiB/s of them.
REPLAY_BYTES_MAX = 512 << 20
#: Idempotent producers' sequence states kept while replaying: a read needs only their transactions, so
#: one entry keeps the broker's bookkeeping of them (recorded by the replay) from growing.
PRODUCER_STATES_MAX = 1

#: Why a read of a store's objects alone cannot tell aborted records, and what to do instead.
OBJECTS_ALONE = ("a read of a store's objects alone cannot tell whether it was aborted (a broker's partition "
                 "leaders know, and a stopped broker's data directory keeps it in producers.sqlite): give the "
                 "data directory as 'path', read through the broker (kafka://HOST:PORT), or read every record "
                 "with isolationLevel=read_uncommitted")


@dataclass(frozen=True, slots=True)
class RestTxns:
    """What a read_committed read of a store at rest returns of each stream it reads (by stream id)."""

    #: Where the read ends in each stream: the manifest's end, or where an open transaction began.
    stable_ends: dict[int, int]
    #: The aborted transactions of each stream (a stream with none is left out).
    aborted: dict[int, list[AbortedTxn]] = field(default_factory=dict)
    #: None when the transactions are known; else why not (tasks then fail at a transactional batch).
    unknown: str | None = None


def rest_transactions(data_dir: str | None, store: ObjectStore, manifest: Manifest, stream_ids: Iterable[int],
                      *, replay_bytes_max: int = REPLAY_BYTES_MAX) -> RestTxns:
    """The transactions of ``stream_ids`` as of ``manifest``, from the data directory ``data_dir`` (None:
    the store's objects were named alone) and the objects in ``store``."""
    ids = sorted(stream_ids)
    ends = {i: manifest.streams[i].end_offset for i in ids}
    path = None if data_dir is None else Path(data_dir) / PRODUCERS_FILE
    if path is None:
        return RestTxns(ends, unknown=OBJECTS_ALONE)
    if not path.is_file():
        return RestTxns(ends, unknown=f"{data_dir} has no {PRODUCERS_FILE} to tell whether it was aborted (a "
                                      f"broker run with --metadata postgresql:// keeps it in PostgreSQL): read "
                                      f"through the broker (kafka://HOST:PORT), or read every record with "
                                      f"isolationLevel=read_uncommitted")
    states, txns = ProducerStates(PRODUCER_STATES_MAX), PartitionTxns()
    snapshots = ProducerSnapshots.read_only(path)
    try:
        snapshot_ends = snapshots.load(states, txns)
    finally:
        snapshots.close()
    budget = _Budget(replay_bytes_max)
    stable: dict[int, int] = {}
    aborted: dict[int, list[AbortedTxn]] = {}
    for i in ids:
        info = manifest.streams[i]
        if parse_stream_name(info.name or "") is None:
            stable[i] = info.end_offset  # not a topic's partition: no broker served it, no transaction wrote it
            continue
        source = _ObjectsStream(store, manifest, i, budget)
        # The broker's own replay, over a stream of objects: it reads start_offset, end_offset, stream_id
        # and fetch_batches, which _ObjectsStream gives as the engine's Stream does.
        replay(states, txns, cast("Stream", source), snapshot_ends.get(i, 0))
        end = info.end_offset if source.stopped_at is None else source.stopped_at
        if end < info.end_offset:
            log.warning("%s: read_committed at rest reads up to offset %d of %d: a read replays at most %d bytes "
                        "past the broker's last snapshot of its transactions (start the broker once, which takes "
                        "one, or read through it)", info.name or i, end, info.end_offset, replay_bytes_max)
        stable[i] = txns.last_stable_offset(i, end)
        ranges = txns.aborted_ranges(i, info.start_offset, stable[i])
        if ranges:
            aborted[i] = [AbortedTxn(r.last_offset, r.producer_id, r.first_offset) for r in ranges]
    return RestTxns(stable, aborted)


@dataclass(frozen=True, slots=True)
class CommittedPartition:
    """A task of a read_committed read at rest: ``part``, without its streams' ``aborted`` transactions (by
    stream id); ``unknown``: why they cannot be known (a transactional batch then fails the task)."""

    part: ReadPartition
    aborted: StreamTxns = ()
    unknown: str | None = None

    @property
    def rows(self) -> int:
        return self.part.rows

    def read(self, store: ObjectStore, headers: bool) -> Iterator[pa.RecordBatch]:
        yield from read_partition(store, self.part, headers=headers, aborted=dict(self.aborted), unknown=self.unknown)


def committed_partitions(parts: Iterable[ReadPartition], txns: RestTxns) -> list[CommittedPartition]:
    """The tasks of ``parts``, each with the aborted transactions it needs of ``txns``."""
    return [CommittedPartition(p, ranges_for(p, txns.aborted), txns.unknown) for p in parts]


@dataclass(slots=True)
class _Budget:
    bytes_left: int


class _ObjectsStream:
    """One stream's uploaded batches as the broker's replay reads a Stream's: ``fetch_batches`` gives the
    next block's, fetched and checked, while the read's byte budget lasts (then none: the replay stops, and
    ``stopped_at`` says where)."""

    def __init__(self, store: ObjectStore, manifest: Manifest, stream_id: int, budget: _Budget) -> None:
        info = manifest.streams[stream_id]
        self.stream_id = stream_id
        self.start_offset = info.start_offset
        self.end_offset = info.end_offset
        self._store = store
        self._blocks = manifest.blocks.get(stream_id, [])
        #: Each block's end, for bisection (made at the first fetch: most streams need no replay).
        self._block_ends: list[int] | None = None
        self._budget = budget
        #: The offset the replay asked for when the budget ran out (None: it never did).
        self.stopped_at: int | None = None

    def fetch_batches(self, start_offset: int, max_bytes: int) -> list[StoredBatch]:
        """The batches of the block holding ``start_offset`` (or the next block), whole, whatever
        ``max_bytes`` says: a block is the least an object read gives, as the engine's first batch is."""
        if self._block_ends is None:
            self._block_ends = [ref.entry.end_offset for ref in self._blocks]
        at = bisect.bisect_right(self._block_ends, start_offset)
        if at == len(self._blocks):
            return []
        ref = self._blocks[at]
        if ref.entry.size_bytes > self._budget.bytes_left:
            self.stopped_at = start_offset
            return []
        self._budget.bytes_left -= ref.entry.size_bytes
        data = check_block(self._store.get(ref.key, ref.entry.position, ref.entry.position + ref.entry.size_bytes),
                           ref.entry)
        return [stored_batch(data, pos, info) for pos, info in placed_batches(data, ref.entry)]
