"""What Spark's Python data source API itself allows, measured beside the data source in the same run.

Rows cross between the JVM and a Python worker as Arrow batches, and Spark turns them into its own rows:
that costs the same whatever a source does in Python. So the bench also times two sources that do
nothing: a reader that yields one prebuilt Arrow batch over and over (the source's schema, the bench's
value size) and a writer that drops what it gets. Their rows/s are the ceilings of any Python source on
this machine; the data source's figures are read against them as well as against Parquet.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from stratalog.spark.columns import ARROW_SCHEMA, SCHEMA_DDL

#: Rows in the batch the ceiling reader yields again and again (Spark's own Arrow batches are 10,000).
CEILING_BATCH_ROWS = 65_536


class _Slice(InputPartition):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class _CeilingReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.rows = int(options["rows"])
        self.partitions_count = int(options["partitions"])
        self.value_bytes = int(options["value_bytes"])

    def partitions(self) -> list[InputPartition]:
        share, left = divmod(self.rows, self.partitions_count)
        return [_Slice(share + (1 if n < left else 0)) for n in range(self.partitions_count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Slice)
        rows = min(CEILING_BATCH_ROWS, max(partition.rows, 1))
        values = pa.array([b"%020d" % i + b"x" * max(self.value_bytes - 20, 0) for i in range(rows)], pa.binary())
        batch = pa.RecordBatch.from_arrays([
            pa.array(["s0"] * rows, pa.string()), pa.array(np.arange(rows, dtype=np.int64)),
            pa.array(np.zeros(rows, dtype=np.int64), pa.timestamp("us", tz="UTC")),
            pa.array([b"%d" % i for i in range(rows)], pa.binary()), values], schema=ARROW_SCHEMA)
        left = partition.rows
        while left > 0:
            yield batch if left >= rows else batch.slice(0, left)
            left -= rows


class _DroppingWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()


class CeilingSource(DataSource):
    """``format("stratalog-ceiling")``: options rows, partitions and value_bytes for reads; writes drop."""

    @classmethod
    def name(cls) -> str:
        return "stratalog-ceiling"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return _CeilingReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> _DroppingWriter:
        return _DroppingWriter()


def register(spark: Any) -> None:
    spark.dataSource.register(CeilingSource)
