"""Batch and streaming reads of a running broker (``path`` ``kafka://HOST:PORT`` or option ``bootstrap``).

Options, besides ``path`` / ``bootstrap`` and ``kafka.<setting>`` (location.py):

``topics``
    Comma list of topics to read; every topic when absent. ``streams`` (``topic/partition`` names) and
    pushed-down filters on ``stream`` narrow it further.
``coldReads``
    ``auto`` (default): uploaded records from the object storage the broker names, when this machine can
    read it (tried once, on the driver), else everything from the broker, saying why once; ``objects``:
    the same, but a store that cannot be read is an error; ``broker``: everything through Kafka Fetch.
``s3.accessKey``, ``s3.secretKey`` (and ``s3.endpoint``, ``s3.region``)
    Credentials (and a route) for the broker's S3 store, beside AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
    in the environment (object_access.py).
``failOnDataLoss``
    ``true`` (default): a read that finds records it was to return trimmed fails, as Spark's Kafka source
    does; ``false`` goes on without them.
``startingOffsets``
    ``earliest`` (default), ``latest``, or JSON as in Spark's Kafka source:
    ``{"clicks": {"0": 42, "1": -2}}`` (-2: earliest, -1: latest; partitions it does not name: earliest).
    A batch read starts there; a streaming query where it first starts (partitions that appear later are
    read from their start).
``maxRowsPerTrigger`` (streaming)
    Records per micro-batch at most, shared among partitions in proportion to what each has waiting.
``isolationLevel``
    ``read_committed`` (default, as librdkafka's): each partition is read up to its last stable offset,
    without the records of aborted transactions (the tail: librdkafka drops them; uploaded records: the
    tasks drop the batches the partition's leader lists as aborted, spark/txn_ranges.py);
    ``read_uncommitted``: up to the high watermark, every record. Markers are never rows.
    ``kafka.isolation.level`` is taken as the same option.

A streaming offset is ``{"<topic>": {"<partition>": <next offset>}}``, as in Spark's Kafka source: it
lives in the query's checkpoint, so a driver killed and restarted reads on exactly where the last
committed micro-batch ended.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, Filter, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from stratalog.broker.topics import parse_stream_name
from stratalog.engine.manifest import Manifest, ManifestError, read_manifest
from stratalog.invariant import InvariantError
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.objects.uri import redact
from stratalog.spark.aborted import StreamTxns, ranges_for
from stratalog.spark.broker_plan import TailPartition, label, plan_broker_read, read_ranges
from stratalog.spark.filters import PushedFilters
from stratalog.spark.kafka_client import (
    ISOLATION_LEVELS,
    READ_COMMITTED,
    BrokerReadError,
    BrokerView,
    PartitionEnds,
    TopicPartition,
    read_tail,
)
from stratalog.spark.location import Location
from stratalog.spark.object_access import NEEDS, unreadable, with_s3_options
from stratalog.spark.options import bool_option, include_headers, int_option, option
from stratalog.spark.plan import BYTES_PER_PARTITION, ROWS_PER_PARTITION, ReadPartition
from stratalog.spark.reader import read_partition, shared_store
from stratalog.spark.txn_ranges import aborted_ranges

log = logging.getLogger("stratalog.spark")

COLD_READS = ("auto", "objects", "broker")
#: Records per micro-batch when the query sets no limit.
MAX_ROWS_PER_TRIGGER = 1_000_000
#: How long the driver waits for a partition's leader to answer while planning (a cluster's broker killed:
#: its partitions have a new leader 3.9 to 12.6 s later under load, docs/cluster.md), before the read fails.
LEADER_WAIT_S_MAX = 60.0
EARLIEST, LATEST = -2, -1

Offsets = dict[str, dict[str, int]]


class BrokerRead:
    """What a read of a broker needs on the driver and in tasks (picklable: settings only)."""

    def __init__(self, location: Location, options: dict[str, str]) -> None:
        assert location.bootstrap is not None
        self.bootstrap = location.bootstrap
        self.isolation = isolation_level(options, location.kafka)
        # The consumer is given the isolation level by read_tail; the admin client takes none.
        self.kafka = {k: v for k, v in location.kafka.items() if k != "isolation.level"}
        self.objects = location.objects
        raw_topics = option(options, "topics")
        self.topics = None if raw_topics is None else [t.strip() for t in raw_topics.split(",") if t.strip()]
        raw_streams = option(options, "streams")
        self.streams = None if raw_streams is None else frozenset(
            s.strip() for s in raw_streams.split(",") if s.strip())
        self.options = options
        self.cold_reads = (option(options, "coldReads") or "auto").lower()
        if self.cold_reads not in COLD_READS:
            raise ValueError(f"option 'coldReads' must be one of {', '.join(COLD_READS)}, not {self.cold_reads!r}")
        self.fail_on_data_loss = bool_option(options, "failOnDataLoss", True)
        self.headers = include_headers(options)
        self.rows_max = int_option(options, "rowsPerPartition", ROWS_PER_PARTITION)
        self.bytes_max = int_option(options, "bytesPerPartition", BYTES_PER_PARTITION)
        if option(options, "queues") is not None:
            raise ValueError("option 'queues' reads a queue store's objects, not a broker")

    # Driver side ---------------------------------------------------------------------------------

    def view(self) -> BrokerView:
        return BrokerView(self.bootstrap, self.kafka)

    @property
    def committed(self) -> bool:
        return self.isolation == READ_COMMITTED

    def ends(self, view: BrokerView) -> dict[TopicPartition, PartitionEnds]:
        """Each partition's start and end (read_committed: its last stable offset)."""
        return view.ends(self.partitions_of(view), committed=self.committed)

    def partitions_of(self, view: BrokerView) -> list[TopicPartition]:
        counts = view.topics(self.topics)
        tps = [(topic, p) for topic, count in counts.items() for p in range(count)]
        return [tp for tp in tps if self.streams is None or label(tp) in self.streams]

    def resolve_objects(self, view: BrokerView) -> None:
        """Settle where uploaded records are read from (driver, once per query): ``self.objects``."""
        if self.cold_reads == "broker":
            self.objects = None
            return
        given = self.objects
        refused = ""
        if given is None:
            try:
                given = view.object_store_uri()
            except BrokerReadError as e:  # not authorized to describe the broker's configs, say
                refused = f" ({e})"
        if given is not None:
            uri = with_s3_options(given, self.options)
            reason = unreadable(uri)
            if reason is None:
                self.objects = uri
                return
            why = f"the object store {redact(given)} cannot be read from here: {reason}"
        else:
            why = f"broker {self.bootstrap} does not say where its objects are{refused}"
        self.objects = None
        if self.cold_reads == "objects":
            raise ValueError(f"{why}; {NEEDS}, give the object store as option 'path', or set coldReads=broker")
        log.warning("%s: every record is read through the broker with Kafka Fetch (to read uploaded records from "
                    "objects, %s)", why, NEEDS)

    def manifest(self) -> Manifest | None:
        """The broker's published view of its objects, read again at each plan (a streaming read plans every
        micro-batch) through the process's one client of the store."""
        if self.objects is None:
            return None
        try:
            return read_manifest(shared_store(self.objects))
        except ManifestError:
            return None  # nothing uploaded yet

    def plan(self, view: BrokerView, ranges: dict[TopicPartition, tuple[int, int]],
             time_from_ms: int | None = None) -> list[ObjectsPartition | TailPartition]:
        """The tasks; each names where it reads (Spark pickles the reader for tasks before planning).
        read_committed: each object read carries its streams' aborted transactions, asked of the
        partitions' leaders over the offsets the plan reads from objects."""
        plan = plan_broker_read(self.manifest(), ranges, rows_max=self.rows_max, bytes_max=self.bytes_max,
                                fail_on_data_loss=self.fail_on_data_loss, time_from_ms=time_from_ms)
        cold = [p for p in plan if isinstance(p, ReadPartition)]
        aborted = self.aborted(view, cold) if self.committed else {}
        objects = self.objects or ""
        return [ObjectsPartition(objects, p, ranges_for(p, aborted)) if isinstance(p, ReadPartition) else p
                for p in plan]

    def aborted(self, view: BrokerView, cold: Sequence[ReadPartition]) -> dict[int, list[AbortedTxn]]:
        """The aborted transactions of each partition (by stream id) over the offsets ``cold`` reads from
        objects (slices named ``topic/partition``), asked of the partitions' leaders. Ask after the
        partitions' last stable offsets: every transaction ended below them has its range by then."""
        spans: dict[TopicPartition, tuple[int, int]] = {}
        streams: dict[TopicPartition, int] = {}
        for part in cold:
            for piece in part.slices:
                tp = _topic_partition(piece.name)
                streams[tp] = piece.stream_id
                first, last = spans.get(tp, (piece.start_offset, piece.end_offset))
                spans[tp] = (min(first, piece.start_offset), max(last, piece.end_offset))
        found = aborted_ranges(view.leaders, self.kafka, spans, unreachable_s_max=LEADER_WAIT_S_MAX)
        return {streams[tp]: txns for tp, txns in found.items() if txns}

    # Executor side -------------------------------------------------------------------------------

    def read(self, value: object) -> Iterator[pa.RecordBatch]:
        if value is None:
            return  # an empty plan: Spark still runs one task, with no partition value
        if isinstance(value, TailPartition):
            yield from read_tail(self.bootstrap, self.kafka, value.topic, value.partition, value.start, value.end,
                                 headers=self.headers, fail_on_data_loss=self.fail_on_data_loss,
                                 isolation=self.isolation)
            return
        assert isinstance(value, ObjectsPartition)
        yield from read_partition(shared_store(value.objects), value.part, headers=self.headers,
                                  aborted=dict(value.aborted))


@dataclass(frozen=True, slots=True)
class ObjectsPartition:
    """A task reading uploaded records from the object store at ``objects``; ``aborted``: its streams'
    aborted transactions, by stream id (read_committed; a stream it does not name has none)."""

    objects: str
    part: ReadPartition
    aborted: StreamTxns = ()


def _topic_partition(name: str) -> TopicPartition:
    parsed = parse_stream_name(name)
    if parsed is None:
        raise InvariantError(f"a broker read's slice is named topic/partition, not {name!r}")
    return parsed


def isolation_level(options: dict[str, str], kafka: dict[str, str]) -> str:
    """Option ``isolationLevel`` (or ``kafka.isolation.level``, as Spark's Kafka source takes it):
    ``read_committed`` unless given; ValueError for another value, or for the two disagreeing."""
    given = option(options, "isolationLevel")
    alias = kafka.get("isolation.level")
    if given is not None and alias is not None and given.strip().lower() != alias.strip().lower():
        raise ValueError(f"option 'isolationLevel' is {given!r} and 'kafka.isolation.level' {alias!r}: give one")
    level = (given or alias or READ_COMMITTED).strip().lower()
    if level not in ISOLATION_LEVELS:
        raise ValueError(f"option 'isolationLevel' must be {' or '.join(ISOLATION_LEVELS)}, not {level!r}")
    return level


def reachable_objects(location: Location, options: dict[str, str]) -> str:
    """The object storage of the store ``location`` names, reachable from this machine (for a broker: the
    one it advertises, or option ``path``); ValueError when it is not."""
    if not location.broker:
        assert location.objects is not None
        return location.objects
    source = BrokerRead(location, {**options, "coldreads": "objects"})
    view = source.view()
    try:
        source.resolve_objects(view)
    finally:
        view.close()
    assert source.objects is not None
    return source.objects


class BrokerBatchReader(DataSourceReader):
    """``spark.read.format("stratalog").option("path", "kafka://...")``: everything acknowledged when the
    read is planned."""

    def __init__(self, location: Location, options: dict[str, str]) -> None:
        self.source = BrokerRead(location, options)
        self.pushed = PushedFilters()
        self.starting = parse_starting(option(options, "startingOffsets"))

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self.pushed.take(f):
                yield f

    def partitions(self) -> Sequence[InputPartition]:
        view = self.source.view()
        try:
            self.source.resolve_objects(view)
            ends = self.source.ends(view)
            ranges = read_ranges(ends, self.pushed.offsets, self.pushed.labels,
                                 resolve_starting(self.starting, ends))
            return [InputPartition(p) for p in self.source.plan(view, ranges, self.pushed.time_from_ms)]
        finally:
            view.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from self.source.read(partition.value)


# Streaming -----------------------------------------------------------------------------------------


def parse_starting(raw: str | None) -> int | Offsets:
    """``startingOffsets``: EARLIEST, LATEST, or per-partition offsets."""
    text = (raw or "earliest").strip()
    if text.lower() in ("earliest", "latest"):
        return EARLIEST if text.lower() == "earliest" else LATEST
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        return {str(t): {str(int(p)): int(o) for p, o in parts.items()} for t, parts in doc.items()}
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"startingOffsets must be earliest, latest or JSON such as "
                         f"{{\"clicks\": {{\"0\": 42, \"1\": -2}}}}, not {text!r} ({e})") from None


def resolve_starting(starting: int | Offsets, ends: dict[TopicPartition, PartitionEnds]) -> dict[TopicPartition, int]:
    """Where each partition starts for ``startingOffsets`` (partitions it does not name: earliest)."""
    given = _flat(starting) if isinstance(starting, dict) else {}
    chosen = {}
    for tp, e in ends.items():
        wanted = given.get(tp, starting if isinstance(starting, int) else EARLIEST)
        chosen[tp] = e.start if wanted == EARLIEST else e.end if wanted == LATEST else wanted
    return chosen


def share(budget: int, backlog: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Split ``budget`` records among partitions in proportion to their ``backlog`` (each gets at most
    its backlog; the rounding remainder goes to the largest backlogs first)."""
    total = sum(backlog.values())
    if total <= budget:
        return dict(backlog)
    taken = {tp: budget * n // total for tp, n in backlog.items()}
    left = budget - sum(taken.values())
    for tp in sorted(backlog, key=lambda t: (-backlog[t], t)):
        if left <= 0:
            break
        if taken[tp] < backlog[tp]:
            taken[tp] += 1
            left -= 1
    return taken


def _flat(offsets: Offsets) -> dict[TopicPartition, int]:
    return {(t, int(p)): o for t, parts in offsets.items() for p, o in parts.items()}


def _nested(flat: dict[TopicPartition, int]) -> Offsets:
    out: Offsets = {}
    for (t, p), o in sorted(flat.items()):
        out.setdefault(t, {})[str(p)] = o
    return out


class BrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("stratalog").option("path", "kafka://...")``: micro-batches of what the
    broker acknowledged since the last one."""

    def __init__(self, location: Location, options: dict[str, str]) -> None:
        self.source = BrokerRead(location, options)
        self.starting = parse_starting(option(options, "startingOffsets"))
        self.rows_per_trigger = int_option(options, "maxRowsPerTrigger", MAX_ROWS_PER_TRIGGER)
        self.target: dict[TopicPartition, int] | None = None
        #: The driver's client, kept from trigger to trigger (never pickled: tasks need none).
        self._view: BrokerView | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_view"] = None
        return state

    def _broker(self) -> BrokerView:
        if self._view is None:
            view = self.source.view()
            self.source.resolve_objects(view)
            self._view = view
        return self._view

    def _ends(self) -> dict[TopicPartition, PartitionEnds]:
        return self.source.ends(self._broker())

    def initialOffset(self) -> dict[str, Any]:
        return _nested(resolve_starting(self.starting, self._ends()))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.rows_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {tp: e.end for tp, e in self._ends().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        at = _flat(start)
        ends = self._ends()
        backlog = {}
        for tp, e in ends.items():
            end = e.end if self.target is None else min(e.end, self.target.get(tp, e.start))
            first = at.get(tp, e.start)  # a partition that appeared since: from its start
            backlog[tp] = max(end - first, 0)
            at.setdefault(tp, first)
        rows_max = None if isinstance(limit, ReadAllAvailable) else getattr(limit, "max_rows", None)
        taken = backlog if rows_max is None else share(rows_max, backlog)
        return _nested({tp: at[tp] + taken.get(tp, 0) for tp in at})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, finish = _flat(start), _flat(end)
        ranges = {tp: (begin.get(tp, 0), stop) for tp, stop in finish.items() if stop > begin.get(tp, 0)}
        if not ranges:
            return []
        # (A restarted driver plans the batch it had planned before any latestOffset.)
        return [InputPartition(p) for p in self.source.plan(self._broker(), ranges)]

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the offsets live in the checkpoint; nothing is kept elsewhere

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from self.source.read(partition.value)
