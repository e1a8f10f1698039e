"""A local SparkSession that works offline and on loopback only."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"
#: Shuffle partitions of a local session: Spark's default of 200 makes tiny jobs slow.
LOCAL_SHUFFLE_PARTITIONS = 4


def local_session(master: str = "local[*]", app_name: str = "stratalog",
                  extra_conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession on this machine, with the stratalog data source registered.

    Binds the driver to 127.0.0.1, turns the UI off, runs Python workers on this interpreter (so they
    import this stratalog), fetches no packages, and keeps shuffles small. ``master`` may also name a
    cluster (``spark://host:7077``); the loopback settings then suit only a driver on a cluster node.
    """
    from stratalog.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    conf = {
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(LOCAL_SHUFFLE_PARTITIONS),
        "spark.sql.session.timeZone": "UTC",
        "spark.pyspark.python": sys.executable,
        **(extra_conf or {}),
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
