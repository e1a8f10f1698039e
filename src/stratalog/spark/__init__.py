"""stratalog on Apache Spark, through PySpark's Python Data Source API (extra ``stratalog[spark]``).

```python
from stratalog.spark import local_session

spark = local_session()                      # registers the "stratalog" format
df = (spark.read.format("stratalog")
      .option("path", "data/objects")        # or s3://bucket/prefix?endpoint=http://127.0.0.1:8333
      .option("streams", "orders,payments")  # names or ids; all streams when absent
      .load())                               # stream, offset, timestamp, key, value
```

Reads need only the object storage (executors read objects using the published manifest). Writes and
the pipeline jobs also need the store's data directory (option ``data_dir``): see
:mod:`stratalog.spark.write` and :mod:`stratalog.spark.jobs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register", "local_session", "FORMAT_NAME"]

FORMAT_NAME = "stratalog"


def register(spark: SparkSession) -> None:
    """Register the ``stratalog`` format on ``spark``, and turn on Python filter pushdown (off by default
    in Spark 4.1+; the reader implements ``pushFilters``, which Spark refuses while it is off)."""
    from stratalog.spark.source import StratalogDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(StratalogDataSource)


def local_session(master: str = "local[*]", app_name: str = "stratalog",
                  extra_conf: dict[str, str] | None = None) -> SparkSession:
    """A local SparkSession that works offline (see :func:`stratalog.spark.session.local_session`)."""
    from stratalog.spark.session import local_session as build

    return build(master, app_name, extra_conf)
