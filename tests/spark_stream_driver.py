"""A Spark driver for the kill -9 tests, run as its own process (with its own JVM):

    python spark_stream_driver.py BOOTSTRAP READ_TOPIC SINK_DIR INPUT_DIR WRITE_TOPIC CHECKPOINT_DIR SPARK_LOCAL_DIR \
        [OPTIONS_JSON]

It runs two streaming queries at once, each with a checkpoint under CHECKPOINT_DIR:
    read:  the broker's READ_TOPIC into a Parquet sink at SINK_DIR;
    write: JSON files (id, key) appearing in INPUT_DIR into the broker's WRITE_TOPIC, exactly once (sink
           id "kill9").
OPTIONS_JSON: more options of the stratalog data source for both (S3 credentials), a JSON object.

Prints ``started`` once both run, then runs until killed. One driver for both: a kill -9 stops both
mid-stream, and the test pays for one JVM start a driver, not two.

Spark gives a Python worker a fixed 10 s to connect back once started (PythonWorkerFactory; no setting
moves it), and a loaded machine can take longer: the query then fails. The driver restarts such a query
from its checkpoint, as a supervisor restarts a failed query, in the JVM it already has (warm, so the
next worker starts sooner), and says so on stderr with RESTARTED; any other failure ends the driver.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from sparkconf import TEST_JVM_CONF
from stratalog.spark import local_session

#: Records per micro-batch of the read: several batches a second at the test's produce rate.
ROWS_PER_TRIGGER = 1500
#: What Spark says when a Python worker did not connect back within its 10 s.
WORKER_START_TIMEOUT = "Python worker failed to connect back"
#: What the driver prints on stderr for each query it restarted after that failure.
RESTARTED = "restarted after a slow Python worker start"
#: Restarts for that reason the driver takes before it gives up: each costs a few seconds.
WORKER_START_RESTARTS_MAX = 30
#: How often the driver looks whether a query has planned its first micro-batch.
LOOK_S = 0.2


class Supervisor:
    """Starts each query once the one before it is under way (their first plans need a Python worker each,
    and starting both at once doubles the work a loaded machine must do within the 10 s), and restarts a
    query that failed for a slow worker start."""

    def __init__(self, spark: SparkSession, starts: dict[str, Callable[[], StreamingQuery]]) -> None:
        self.spark = spark
        self.starts = starts
        self.restarts = 0

    def run(self) -> None:
        for name in self.starts:
            self._start_under_way(name)
        print("started", flush=True)
        while True:
            try:
                self.spark.streams.awaitAnyTermination()
            except StreamingQueryException as error:
                self._count(error)
            self.spark.streams.resetTerminated()
            active = {query.name for query in self.spark.streams.active}
            for name in self.starts:
                if name not in active:
                    self._start_under_way(name)

    def _start_under_way(self, name: str) -> None:
        while True:
            try:
                query = self.starts[name]()
                while query.status["message"] == "Initializing sources":
                    if query.awaitTermination(LOOK_S):
                        raise AssertionError(f"query {name} stopped while it started")
                return
            except Exception as error:  # a start analyses, and raises the error Spark gave, whatever its class
                self._count(error)
                self.spark.streams.resetTerminated()

    def _count(self, error: Exception) -> None:
        if WORKER_START_TIMEOUT not in str(error) or self.restarts >= WORKER_START_RESTARTS_MAX:
            raise error
        self.restarts += 1
        print(f"query {RESTARTED} ({self.restarts})", file=sys.stderr, flush=True)


def main(bootstrap: str, read_topic: str, sink: str, inputs: str, write_topic: str, checkpoint: str,
         local_dir: str, options_json: str = "{}") -> None:
    options = json.loads(options_json)
    spark = local_session("local[2]", app_name="stratalog-stream-driver",
                          extra_conf={**TEST_JVM_CONF, "spark.local.dir": local_dir})
    spark.sparkContext.setLogLevel("ERROR")
    checkpoints = Path(checkpoint)

    def read() -> StreamingQuery:
        return (spark.readStream.format("stratalog").option("path", f"kafka://{bootstrap}")
                .options(**options).option("topics", read_topic)
                .option("maxRowsPerTrigger", str(ROWS_PER_TRIGGER)).load()
                .select("stream", "offset", "value")
                .writeStream.queryName("read").format("parquet")
                .option("checkpointLocation", str(checkpoints / "read"))
                .trigger(processingTime="300 milliseconds").start(sink))

    def write() -> StreamingQuery:
        return (spark.readStream.schema("id long, key string").option("maxFilesPerTrigger", "1").json(inputs)
                .selectExpr("key", "cast(id as string) as value")
                .writeStream.queryName("write").format("stratalog").option("path", f"kafka://{bootstrap}")
                .options(**options).option("topic", write_topic).option("sinkId", "kill9")
                .option("checkpointLocation", str(checkpoints / "write"))
                .trigger(processingTime="200 milliseconds").start())

    Supervisor(spark, {"read": read, "write": write}).run()


if __name__ == "__main__":
    main(*sys.argv[1:9])
