"""A faust-streaming agent that counts the events of each key in a table: faust creates the table's
changelog topic itself (cleanup.policy=compact), keeps the table in RocksDB (rocksdict) under its data
directory, and writes each key's running count to the output topic. tests/test_app_faust.py runs it as a
child process, kills it with SIGKILL and starts it again with its data directory deleted, so the table is
rebuilt from the changelog.

    python faust_counter.py BOOTSTRAP DATA_DIR

At-least-once, faust's default (exactly-once needs Kafka transactions, which the broker does not serve
yet): every table update is sent to the changelog as it is made, and every COMMIT_INTERVAL_S the producer
is flushed (changelog and output) and then the offsets of the events processed are committed.
"""

from __future__ import annotations

import sys

import faust

INPUT_TOPIC = "events"
OUTPUT_TOPIC = "counts"
APP_ID = "faust-counter"
TABLE = "counts"
#: As the input topic's partitions (the test makes it): faust partitions a table as the stream it counts.
PARTITIONS = 3
#: Short, so a test waits little for the commit after its last event.
COMMIT_INTERVAL_S = 0.25
#: A killed member holds its partitions until its session times out: short, so the restarted app gets them
#: soon (the test's broker lowers its minimum session timeout to allow it).
SESSION_TIMEOUT_S = 4.0


def make_app(bootstrap: str, data_dir: str) -> faust.App:
    app = faust.App(APP_ID, broker=f"kafka://{bootstrap}", store="rocksdb://", datadir=data_dir,
                    topic_partitions=PARTITIONS, topic_replication_factor=1, broker_commit_interval=COMMIT_INTERVAL_S,
                    broker_session_timeout=SESSION_TIMEOUT_S, broker_heartbeat_interval=0.5, web_enabled=False,
                    processing_guarantee="at_least_once")
    events = app.topic(INPUT_TOPIC, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    counts_out = app.topic(OUTPUT_TOPIC, key_type=bytes, value_type=int, key_serializer="raw",
                           value_serializer="json")
    # Partitioned as the input: each event's count is kept in the changelog partition of its own partition.
    table = app.Table(TABLE, default=int, partitions=PARTITIONS, key_type=bytes)

    @app.agent(events)
    async def count(stream: faust.StreamT[bytes]) -> None:
        async for key, _ in stream.items():
            table[key] += 1
            await counts_out.send(key=key, value=table[key])

    return app


if __name__ == "__main__":
    app = make_app(sys.argv[1], sys.argv[2])
    sys.argv = [sys.argv[0], "worker", "--loglevel", "info"]
    app.main()
