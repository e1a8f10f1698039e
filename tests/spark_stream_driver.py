"""A Spark driver for the kill -9 test, run as its own process (with its own JVM):

    python spark_stream_driver.py BOOTSTRAP READ_TOPIC SINK_DIR INPUT_DIR WRITE_TOPIC CHECKPOINT_DIR SPARK_LOCAL_DIR

It runs two streaming queries at once, each with a checkpoint under CHECKPOINT_DIR:
    read:  the broker's READ_TOPIC into a Parquet sink at SINK_DIR;
    write: JSON files (id, key) appearing in INPUT_DIR into the broker's WRITE_TOPIC, exactly once (sink
           id "kill9").

Prints ``started`` once both run, then runs until killed. One driver for both: a kill -9 stops both
mid-stream, and the test pays for one JVM start a driver, not two.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stratalog.spark import local_session

#: Records per micro-batch of the read: several batches a second at the test's produce rate.
ROWS_PER_TRIGGER = 1500


def main(bootstrap: str, read_topic: str, sink: str, inputs: str, write_topic: str, checkpoint: str,
         local_dir: str) -> None:
    spark = local_session("local[2]", app_name="stratalog-stream-driver", extra_conf={"spark.local.dir": local_dir})
    spark.sparkContext.setLogLevel("ERROR")
    checkpoints = Path(checkpoint)
    (spark.readStream.format("stratalog").option("path", f"kafka://{bootstrap}").option("topics", read_topic)
     .option("maxRowsPerTrigger", str(ROWS_PER_TRIGGER)).load()
     .select("stream", "offset", "value")
     .writeStream.format("parquet").option("checkpointLocation", str(checkpoints / "read"))
     .trigger(processingTime="300 milliseconds").start(sink))
    (spark.readStream.schema("id long, key string").option("maxFilesPerTrigger", "1").json(inputs)
     .selectExpr("key", "cast(id as string) as value")
     .writeStream.format("stratalog").option("path", f"kafka://{bootstrap}").option("topic", write_topic)
     .option("sinkId", "kill9").option("checkpointLocation", str(checkpoints / "write"))
     .trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    spark.streams.awaitAnyTermination()


if __name__ == "__main__":
    main(*sys.argv[1:8])
