"""Spark writes into a running broker: tasks stage objects in its object storage, the broker commits them.

Tasks stage exactly as a write to a store at rest does (spark/write.py), in the object storage the
broker names (or option ``path``). The driver's commit is one StratalogCommitStaged request
(kafka/staged_commit.py) over a Kafka connection with the ``kafka.*`` settings: the broker checks the
writer may write each topic, places the objects at the partitions' ends after whatever producers
appended, and commits them in one metadata transaction. A streaming write's request names its sink and
micro-batch, and the broker commits each micro-batch once, so a replayed one writes nothing.

Where each row goes, in this order:

- a ``stream`` column: ``topic/partition``;
- else the topic from a ``topic`` column or option ``topic``, and the partition from a ``partition``
  column, or for keyed rows Kafka's default partitioner (murmur2 of the key: the partition a Kafka
  producer would choose), or for rows without a key the Spark task's number modulo the partition count.
  The topic must exist then (its partition count decides); with a ``stream`` or ``partition`` column
  a missing topic is created if the broker creates topics on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from stratalog.engine.staging import CommitResult, StagedObject
from stratalog.errors import StratalogError
from stratalog.kafka import staged_commit
from stratalog.kafka.client import KafkaConnection
from stratalog.kafka.partitioner import partition_for_key


class BrokerWriteError(StratalogError):
    """The broker refused the commit of a write (its error code and message are in the text)."""


class Destinations:
    """How a task's rows get their ``topic/partition`` stream (picklable: settings and counts only)."""

    def __init__(self, columns: Sequence[str], topic: str | None, partition_counts: dict[str, int]) -> None:
        self.has_stream = "stream" in columns
        self.has_topic = "topic" in columns
        self.has_partition = "partition" in columns
        self.topic = topic
        self.partition_counts = partition_counts
        if not self.has_stream and not self.has_topic and topic is None:
            raise ValueError("writing to a broker needs a 'stream' column (topic/partition), a 'topic' column, or "
                             "option 'topic'")
        if topic is not None and not self.has_topic and not self.has_partition and not self.has_stream \
                and topic not in partition_counts:
            raise ValueError(f"topic {topic!r} does not exist: create it first (its partition count decides where "
                             "keyed rows go), or give a 'partition' column")

    def streams(self, batch: pa.RecordBatch, task: int) -> pa.RecordBatch:
        """``batch`` with its ``stream`` column (added, or as given)."""
        if self.has_stream:
            return batch
        topics = batch.column("topic") if self.has_topic else pa.array([self.topic] * batch.num_rows, pa.string())
        if topics.null_count:
            raise ValueError("a row has no topic: the topic column must not be null")
        if self.has_partition:
            partitions = pc.cast(batch.column("partition"), pa.int64())
            if partitions.null_count:
                raise ValueError("a row has no partition: the partition column must not be null")
        else:
            partitions = pa.array(self._choose(topics.to_pylist(), batch, task), pa.int64())
        stream = pc.binary_join_element_wise(topics, pc.cast(partitions, pa.string()), "/")
        return batch.append_column("stream", stream)

    def _choose(self, topics: list[str], batch: pa.RecordBatch, task: int) -> list[int]:
        keyed = "key" in batch.schema.names
        keys = batch.column("key").cast(pa.binary()).to_pylist() if keyed else [None] * len(topics)
        out = []
        for topic, key in zip(topics, keys, strict=True):
            count = self.partition_counts.get(topic)
            if count is None:
                raise ValueError(f"topic {topic!r} does not exist: create it first, or give a 'partition' column")
            out.append(task % count if key is None else partition_for_key(key, count))
        return out


def choose_partitions(destinations: Destinations, batches: Iterator[pa.RecordBatch],
                      task: int) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield destinations.streams(batch, task)


def commit_through_broker(bootstrap: str, settings: dict[str, str],
                          messages: Sequence[tuple[int, Sequence[StagedObject]]],
                          sink: tuple[str, int] | None) -> CommitResult:
    """Ask the broker to commit the staged objects of ``messages`` ((task, objects) pairs); ``sink`` (sink id,
    batch id) for a micro-batch. BrokerWriteError when the broker refuses."""
    request = staged_commit.CommitStagedRequest(
        None if sink is None else sink[0], -1 if sink is None else sink[1],
        tuple(staged_commit.StagedObjectEntry(task, o.key, o.size_bytes, tuple(
            staged_commit.StagedStreamEntry(s.name, s.start, s.count) for s in o.streams))
            for task, objects in messages for o in objects))
    return _ask(bootstrap, settings, lambda cid, client: staged_commit.encode_request(cid, client, request))


def replace_through_broker(bootstrap: str, settings: dict[str, str], replaced: Sequence[str],
                           staged: Sequence[tuple[str, int]]) -> CommitResult:
    """Ask the broker to swap the objects at ``replaced`` for the staged ``(key, size)`` objects (a
    compaction). BrokerWriteError when the broker refuses (not authorized, or the objects changed since)."""
    request = staged_commit.ReplaceObjectsRequest(tuple(replaced), tuple(staged))
    return _ask(bootstrap, settings, lambda cid, client: staged_commit.encode_replace_request(cid, client, request))


def _ask(bootstrap: str, settings: dict[str, str], frame: Callable[[int, str | None], bytes]) -> CommitResult:
    with KafkaConnection(bootstrap, settings) as connection:
        correlation_id = connection.next_correlation_id()
        answer = connection.exchange(frame(correlation_id, connection.client_id))
    answered, response = staged_commit.decode_response(answer)
    if answered != correlation_id:
        raise BrokerWriteError(f"the broker answered request {answered}, not {correlation_id}")
    if response.error_code != 0:
        raise BrokerWriteError(f"the broker refused (error {response.error_code}): {response.error_message}")
    return CommitResult(response.committed, response.records, response.objects)
