"""Leader epochs as clients use them (KIP-320): fencing by the client's current leader epoch, where each
epoch of a partition's log ends, and the epoch written into every batch a leader appends.

A partition's leader epoch goes up at every change of leader. Clients learn it from Metadata and send it
back as ``current_leader_epoch`` (Fetch v9+, ListOffsets v4+, OffsetForLeaderEpoch v2+): an older one is
answered FENCED_LEADER_EPOCH (the client's metadata is stale: it refreshes it), a newer one
UNKNOWN_LEADER_EPOCH (this broker has not caught up yet: the client retries), as Kafka's Partition does,
before it checks that this broker leads the partition. A consumer also keeps the epoch of the last batch
it read, which the leader wrote into the batch's ``partitionLeaderEpoch`` when it appended it; after a
change of leader it asks OffsetForLeaderEpoch where that epoch ended, and truncates its position if the
log ends before it (Kafka's lost unclean-leader-election data). Here no log is ever truncated (the WAL and
object storage keep every acknowledged record), so the answers only have to be Kafka's and never below
what a consumer read.

A partition's epoch *history* is its epochs and the offset each began at, oldest first. Alone, a broker has
led every partition from the start: one epoch, 0, from offset 0. In a cluster, each gain of a partition
records its epoch's start in PostgreSQL (cluster/leader_epochs.py) and the leader keeps the history.
Pure functions, but :func:`leader_stream`, which asks the broker.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from stratalog.kafka.records import PARTITION_LEADER_EPOCH_POSITION

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker
    from stratalog.engine import Stream

#: A partition's epochs and the offset each began at, oldest first.
History = Sequence[tuple[int, int]]
#: Alone, a broker has led every partition since offset 0, at epoch 0.
STANDALONE_HISTORY: History = ((0, 0),)
#: Kafka's "no epoch" and "no offset" (an answer for an epoch past any known).
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
_EPOCH = struct.Struct(">i")


def epoch_error(current_leader_epoch: int, leader_epoch: int) -> ErrorCode:
    """Kafka's check of a client's current leader epoch against the partition's (a negative one, or a
    partition without a leader, is not checked)."""
    if current_leader_epoch < 0 or leader_epoch < 0 or current_leader_epoch == leader_epoch:
        return ErrorCode.none
    return ErrorCode.fenced_leader_epoch if current_leader_epoch < leader_epoch else ErrorCode.unknown_leader_epoch


def end_offset_for(history: History, requested: int, log_end: int) -> tuple[int, int]:
    """(epoch, end offset) that OffsetForLeaderEpoch answers for ``requested``, as Kafka's
    LeaderEpochFileCache: the current epoch ends at the log's end; an older one at the start of the first
    epoch after it, answered as the largest known epoch at or below it (or as itself when it is older than
    every epoch kept); one past every epoch known, and -1, have no end."""
    epochs = [epoch for epoch, _ in history]
    if requested == UNDEFINED_EPOCH or not epochs or requested > epochs[-1]:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if requested == epochs[-1]:
        return requested, log_end
    after = bisect_right(epochs, requested)   # the first epoch past the one asked: its start ends it
    next_start = history[after][1]
    return (requested if after == 0 else epochs[after - 1]), next_start


def stamped(batch: memoryview, epoch: int) -> memoryview:
    """The batch with ``partitionLeaderEpoch`` set to ``epoch``, as a leader writes it on append (outside
    the batch's CRC, which stays right); the same view when it already says so (producers send -1 or 0)."""
    if _EPOCH.unpack_from(batch, PARTITION_LEADER_EPOCH_POSITION)[0] == epoch:
        return batch
    copy = bytearray(batch)
    _EPOCH.pack_into(copy, PARTITION_LEADER_EPOCH_POSITION, epoch)
    return memoryview(copy)


def current_epoch(history: History) -> int:
    return history[-1][0]


def leader_stream(broker: Broker, topic: str, partition: int,
                  current_leader_epoch: int) -> tuple[Stream | None, History, ErrorCode]:
    """The stream of a partition this broker leads and its epoch history, checked against the client's
    current leader epoch; or no stream and the error to answer, in Kafka's order: the partition does not
    exist, the client's epoch is fenced or unknown, another broker leads it."""
    stream = broker.partition(topic, partition)
    history = broker.ownership.epochs(topic, partition) if stream is not None else None
    if stream is None or history is None:
        error = ErrorCode(broker.partition_error(topic, partition))
        if error == ErrorCode.unknown_topic_or_partition:
            return None, (), error
        return None, (), epoch_error(current_leader_epoch, broker.leader_epoch(topic, partition)) or error
    error = epoch_error(current_leader_epoch, current_epoch(history))
    return (None, (), error) if error else (stream, history, error)
