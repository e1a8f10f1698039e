"""A Spark driver for the kill -9 tests, run as its own process (with its own JVM):

    python spark_stream_driver.py read BOOTSTRAP TOPIC SINK_DIR CHECKPOINT_DIR SPARK_LOCAL_DIR
        a streaming read of a broker's topic into a Parquet sink
    python spark_stream_driver.py write BOOTSTRAP TOPIC INPUT_DIR CHECKPOINT_DIR SPARK_LOCAL_DIR
        a streaming write of JSON files (id, key) into a broker's topic, exactly once (sink id "kill9")

Prints ``started`` once the query runs, then runs until killed.
"""

from __future__ import annotations

import sys

from stratalog.spark import local_session

#: Records per micro-batch of the read: several batches a second at the tests' produce rate.
ROWS_PER_TRIGGER = 1500


def main(mode: str, bootstrap: str, topic: str, data: str, checkpoint: str, local_dir: str) -> None:
    spark = local_session("local[2]", app_name="stratalog-stream-driver", extra_conf={"spark.local.dir": local_dir})
    spark.sparkContext.setLogLevel("ERROR")
    if mode == "read":
        query = (spark.readStream.format("stratalog").option("path", f"kafka://{bootstrap}").option("topics", topic)
                 .option("maxRowsPerTrigger", str(ROWS_PER_TRIGGER)).load()
                 .select("stream", "offset", "value")
                 .writeStream.format("parquet").option("checkpointLocation", checkpoint)
                 .trigger(processingTime="300 milliseconds").start(data))
    else:
        query = (spark.readStream.schema("id long, key string").option("maxFilesPerTrigger", "1").json(data)
                 .selectExpr("key", "cast(id as string) as value")
                 .writeStream.format("stratalog").option("path", f"kafka://{bootstrap}").option("topic", topic)
                 .option("sinkId", "kill9").option("checkpointLocation", checkpoint)
                 .trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:7])
