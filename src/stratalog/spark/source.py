"""The ``stratalog`` data source: PySpark's Python Data Source API over a store's object storage.

Options (all strings, as Spark passes them):

``path``
    The store's object storage: a local directory path (``<data_dir>/objects`` for the embedded store),
    ``file:///abs/path``, or ``s3://bucket/prefix?endpoint=URL&region=NAME``. Required.
``streams``
    Comma list of stream names or ids to read; every stream when absent.
``queues``
    Batch reads of a queue store instead (``path`` is then the queue store's object storage,
    ``<data_dir>/objects`` for an embedded ``QueueStore``): ``*`` for every queue, or a comma list of
    queue names. The columns are the same: ``stream`` is the queue's name, ``offset`` its offset;
    ``timestamp`` and ``key`` are null (queue messages have neither). Planning reads the queue manifest and
    each run object's index, and makes tasks of object slices (:mod:`stratalog.spark.queues`). Not with
    ``streams`` or ``includeHeaders``, nor for streaming reads or writes.
``rowsPerPartition`` / ``bytesPerPartition``
    Planning bounds of one read task (defaults: 500,000 rows, 128 MiB).
``data_dir``, ``sinkId``, ``objectBytes``
    Writes only: see :mod:`stratalog.spark.write`.
``includeHeaders``
    ``true`` adds a column ``headers array<struct<key: string, value: binary>>`` (each record's headers,
    in order; empty when it has none). Off by default, as in Spark's Kafka source.
``maxRowsPerTrigger``
    Streaming reads only: see :mod:`stratalog.spark.stream`.
``startingOffsets``
    Batch reads of streams named ``topic/partition``: JSON ``{"topic": {"partition": offset}}``, where each
    named stream starts (as in Spark's Kafka source).
``tableFiles``
    A JSON list of materialized table files (object keys) to read instead, a task each, with pyarrow from
    the object store: how ``materialize.load`` reads tables where Spark has no S3A connector.
``isolationLevel`` (or ``kafka.isolation.level``)
    ``read_committed`` (default): topics written by Kafka transactions are read as a read_committed
    consumer reads them, from what a stopped broker left in the data directory (spark/rest_txns.py: each
    stream up to its oldest open transaction, without aborted records); a read of a store's objects
    alone cannot know which transactions were aborted, and fails at the first transactional batch,
    saying so. ``read_uncommitted``: every record.

The driver reads the manifest once and plans partitions (:mod:`stratalog.spark.plan`); each task reads
its blocks from the object store directly (:mod:`stratalog.spark.reader`). Filters ``stream = x``,
``stream IN (...)`` and comparisons of ``offset`` with a constant are pushed down and applied exactly.
``timestamp >=`` / ``>`` / ``=`` a constant skips blocks whose newest record is older; Spark still
filters the rows of the blocks read (a stream's timestamps need not grow with its offsets). Queue reads
push down the ``stream`` and ``offset`` filters the same way (a run is read whole and its rows cut).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
)
from pyspark.sql.types import StructType

from stratalog.engine.manifest import Manifest, read_manifest
from stratalog.spark.columns import spark_schema
from stratalog.spark.filters import PushedFilters
from stratalog.spark.location import locate, object_store
from stratalog.spark.options import include_headers, int_option, option
from stratalog.spark.plan import (
    BYTES_PER_PARTITION,
    ROWS_PER_PARTITION,
    ReadPartition,
    filter_by_label,
    plan_partitions,
    resolve_streams,
)
from stratalog.spark.queues import QueuePartition, plan_queue_read, read_queue_partition
from stratalog.spark.reader import open_store, read_partition, shared_store
from stratalog.spark.rest_txns import CommittedPartition, committed_partitions, rest_transactions

FORMAT_NAME = "stratalog"


class StratalogDataSource(DataSource):
    """``spark.read.format("stratalog")``: batch and streaming reads and writes of a store's streams."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return spark_schema(include_headers(self._options()))

    def _options(self) -> dict[str, str]:
        return {str(k).lower(): str(v) for k, v in self.options.items()}

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._options()
        location = locate(options)
        if location.broker:
            from stratalog.spark.broker_source import BrokerBatchReader

            return BrokerBatchReader(location, options)
        return StratalogReader(options)

    def _no_queues(self, what: str) -> None:
        if option(self._options(), "queues") is not None:
            raise ValueError(f"option 'queues' is for batch reads only, not {what}")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from stratalog.spark.stream import StratalogStreamReader

        self._no_queues("streaming reads")
        options = self._options()
        location = locate(options)
        if location.broker:
            from stratalog.spark.broker_source import BrokerStreamReader

            return BrokerStreamReader(location, options)
        return StratalogStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from stratalog.spark.write import StratalogBatchWriter

        self._no_queues("writes")
        return StratalogBatchWriter(self._options(), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from stratalog.spark.write import StratalogStreamWriter

        self._no_queues("writes")
        return StratalogStreamWriter(self._options(), schema, overwrite)


@dataclass(frozen=True)
class TableFilePartition:
    """A task of a read of materialized table files (``tableFiles``): one Parquet file, by object key."""

    key: str


class StratalogReader(DataSourceReader):
    """Batch reader: plans on the driver, reads on executors. Picklable (options and plan only)."""

    def __init__(self, options: dict[str, str]) -> None:
        from stratalog.spark.broker_source import isolation_level
        from stratalog.spark.kafka_client import READ_COMMITTED

        self.uri = object_store(options)
        location = locate(options)
        self.data_dir = location.data_dir
        self.committed = isolation_level(options, location.kafka) == READ_COMMITTED
        self.streams = option(options, "streams")
        self.queues = option(options, "queues")
        self.rows_max = int_option(options, "rowsPerPartition", ROWS_PER_PARTITION)
        self.bytes_max = int_option(options, "bytesPerPartition", BYTES_PER_PARTITION)
        self.headers = include_headers(options)
        self.starting = option(options, "startingOffsets")
        raw_tables = option(options, "tableFiles")
        self.table_files: list[str] | None = None if raw_tables is None else json.loads(raw_tables)
        if self.queues is not None and (self.streams is not None or self.headers):
            raise ValueError("option 'queues' reads a queue store: it does not go with 'streams' or "
                             "'includeHeaders'")
        self.pushed = PushedFilters(queues=self.queues is not None)

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        return [f for f in filters if not self.pushed.take(f)]

    def plan(self) -> list[ReadPartition] | list[QueuePartition] | list[CommittedPartition]:
        """The read plan (driver side). read_committed: each stream up to its stable end at rest, each task
        with the aborted transactions it needs (spark/rest_txns.py)."""
        store = open_store(self.uri)
        try:
            if self.queues is not None:
                return plan_queue_read(store, self.queues, self.pushed.labels, self.pushed.offsets, self.rows_max,
                                       self.bytes_max)
            manifest = read_manifest(store)
            ids = filter_by_label(manifest, resolve_streams(manifest, self.streams), self.pushed.labels)
            txns = rest_transactions(self.data_dir, store, manifest, ids) if self.committed else None
        finally:
            store.close()
        parts = plan_partitions(manifest, ids, self.pushed.offsets, self.rows_max, self.bytes_max,
                                ends=None if txns is None else txns.stable_ends,
                                time_from_ms=self.pushed.time_from_ms, starts=self._starts(manifest))
        return parts if txns is None else committed_partitions(parts, txns)

    def _starts(self, manifest: Manifest) -> dict[int, int] | None:
        """Option ``startingOffsets`` (JSON, ``{"topic": {"partition": offset}}``) for streams named
        ``topic/partition``, by stream id."""
        if self.starting is None:
            return None
        from stratalog.spark.broker_source import parse_starting

        given = parse_starting(self.starting)
        if not isinstance(given, dict):
            raise ValueError("a read of a store's objects takes startingOffsets as JSON only: "
                             '{"topic": {"0": 42}}')
        by_name = {s.name: s.stream_id for s in manifest.streams.values() if s.name is not None}
        return {by_name[f"{t}/{p}"]: offset for t, parts in given.items() for p, offset in parts.items()
                if f"{t}/{p}" in by_name and offset >= 0}

    def partitions(self) -> Sequence[InputPartition]:
        if self.table_files is not None:
            return [InputPartition(TableFilePartition(key)) for key in self.table_files]
        return [InputPartition(p) for p in self.plan()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        value: Any = partition.value
        if value is None:
            return  # an empty plan: Spark still runs one task, with no partition value
        if isinstance(value, QueuePartition):
            yield from read_queue_partition(shared_store(self.uri), value)
            return
        if isinstance(value, TableFilePartition):
            from stratalog.spark.materialize import read_table_file

            yield from read_table_file(shared_store(self.uri), value.key)
            return
        if isinstance(value, CommittedPartition):
            yield from value.read(shared_store(self.uri), self.headers)
            return
        assert isinstance(value, ReadPartition)
        yield from read_partition(shared_store(self.uri), value, headers=self.headers)
