"""Writing a transaction marker into a partition this broker leads: the leader's half of ending a
transaction (the coordinator decides; broker/transactions.py). The marker is appended as any batch, at
the partition's leader epoch; then, for an abort, the range it closes is made durable
(producer_recovery.py's ``aborted_ranges``) before the partition's state forgets the transaction
(broker/txn_partitions.py), so read_committed consumers never see the transaction ended without its range.

Until both are done, a snapshot of the partition's producers ends below where the marker can land, so a
restart reads the marker again and records its range (a marker's range made durable twice is kept once).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stratalog.broker.leader_epochs import current_epoch, stamped
from stratalog.errors import StratalogError
from stratalog.kafka.control_batch import MarkerType, marker_batch

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker


class MarkerWriteError(StratalogError):
    """A marker could not be written: the transaction stays prepared, and is completed later."""


@dataclass(frozen=True, slots=True)
class MarkerRequest:
    """A marker to write: the end of ``transactional_id``'s transaction in one partition."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    kind: MarkerType
    coordinator_epoch: int
    transactional_id: str


async def write_marker(broker: Broker, topic: str, partition: int, producer_id: int, producer_epoch: int,
                       kind: MarkerType, coordinator_epoch: int) -> int:
    """Append the marker to a partition led here; its offset (-1: the partition's topic is deleted, with
    what the transaction wrote in it). Raises MarkerWriteError if the partition is not led here or the
    write failed."""
    stream = broker.partition(topic, partition)
    if stream is None:
        if broker.topics.get(topic) is None:
            return -1
        raise MarkerWriteError(f"partition {topic}-{partition} is not served here now")
    now_ms = int(time.time() * 1000)
    batch = memoryview(marker_batch(producer_id, producer_epoch, kind, coordinator_epoch=coordinator_epoch,
                                    timestamp_ms=now_ms))
    history = broker.ownership.epochs(topic, partition)
    if history:
        batch = stamped(batch, current_epoch(history))
    stream_id = stream.stream_id
    txns = broker.partition_txns
    lowest = stream.end_offset
    txns.marking(stream_id, lowest)
    broker.settled_ends.setdefault(stream_id, lowest)
    try:
        offset = await broker.appender.append(stream, batch, 1, now_ms)
        broker.producers.marked(producer_id, producer_epoch, stream_id)
        aborted = txns.aborts(stream_id, producer_id, kind, offset)
        if aborted is not None:
            await asyncio.to_thread(broker.producer_snapshots.add_aborted, stream_id, [aborted])
        txns.ended(stream_id, producer_id, aborted)
    except Exception as e:   # the store's errors, or the database's: the coordinator tries again later
        raise MarkerWriteError(f"the marker of {topic}-{partition}: {e}") from e
    finally:
        txns.marked(stream_id, lowest)
    broker.settled_ends[stream_id] = max(broker.settled_ends.get(stream_id, 0), offset + 1)
    broker.data_arrived(stream_id)
    return offset
