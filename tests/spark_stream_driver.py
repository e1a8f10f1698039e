"""A Spark driver for the kill -9 tests: a streaming read of a broker's topic into a Parquet sink.

    python spark_stream_driver.py BOOTSTRAP TOPIC SINK_DIR CHECKPOINT_DIR SPARK_LOCAL_DIR

Prints ``started`` once the query runs, then runs until killed.
"""

from __future__ import annotations

import sys

from stratalog.spark import local_session

#: Records per micro-batch: several batches a second at the tests' produce rate.
ROWS_PER_TRIGGER = 1500


def main(bootstrap: str, topic: str, sink: str, checkpoint: str, local_dir: str) -> None:
    spark = local_session("local[2]", app_name="stratalog-stream-driver", extra_conf={"spark.local.dir": local_dir})
    spark.sparkContext.setLogLevel("ERROR")
    query = (spark.readStream.format("stratalog").option("path", f"kafka://{bootstrap}").option("topics", topic)
             .option("maxRowsPerTrigger", str(ROWS_PER_TRIGGER)).load()
             .select("stream", "offset", "value")
             .writeStream.format("parquet").option("checkpointLocation", checkpoint)
             .trigger(processingTime="300 milliseconds").start(sink))
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:6])
