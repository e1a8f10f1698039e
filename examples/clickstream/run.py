"""Clickstream, end to end: Kafka producers into a stratalog broker, a Spark Structured Streaming job
counting clicks per minute of event time into Parquet and back into the broker, and a check that every
acknowledged click is counted exactly once.

    .venv/bin/python examples/clickstream/run.py                 # 200,000 clicks, 4 producers
    .venv/bin/python examples/clickstream/run.py --events 3000   # a quick run

1. Starts ``stratalog serve`` on 127.0.0.1 in a temporary directory (unless ``--bootstrap``) and creates
   the topics ``clicks`` (3 partitions) and ``clicks_per_minute`` (1 partition).
2. Starts two streaming queries over ``clicks``: JSON click events, counted per minute of their event
   time (a 1-minute window, a 2-minute watermark), written to Parquet and, through the stratalog
   sink, as ``{"minute": ..., "clicks": n}`` records keyed by minute to ``clicks_per_minute``.
3. Producer threads (idempotent, acks=all) replay the last few minutes of clicks keyed by user, one
   minute after the other while the queries run, counting what the broker acknowledged per minute.
4. Once every query has caught up, compares the three counts per minute, prints them, and exits 1 if any
   differ.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql.streaming import StreamingQuery

from stratalog.chaos.broker_process import start_broker
from stratalog.spark import local_session

CLICKS, PER_MINUTE = "clicks", "clicks_per_minute"
CLICKS_PARTITIONS = 3
#: Identifies the topic query to the broker, which commits each of its micro-batches once. A sink id
#: belongs to one checkpoint: the broker skips batch ids it has already committed for that id, so a query
#: with a fresh checkpoint needs a fresh id (this example suffixes the run's start time).
SINK_ID = "clicks-per-minute"
#: Minute labels as they appear in the table, the topic and the Parquet check (the session runs in UTC).
MINUTE_FORMAT_PY, MINUTE_FORMAT_SPARK = "%Y-%m-%d %H:%M", "yyyy-MM-dd HH:mm"
MINUTE_MS = 60_000
#: A click: {"user": "u123", "page": "/product/42", "ts": epoch milliseconds of the click}.
EVENT_SCHEMA = "user string, page string, ts long"
#: The watermark's delay: a click is counted unless the queries have already seen one this much later in
#: event time, and a minute is written once the watermark (the latest event time seen, less this) has
#: passed its end. The producers send the minutes in order, each minute acknowledged before the next one
#: starts, and each micro-batch reads every partition about equally far, so a click is never read after
#: one two minutes later in event time: none is dropped as late.
WATERMARK_MINUTES = 2
USERS = 10_000
SECTIONS = ("/", "/search", "/cart", "/checkout")
#: Records per micro-batch at most: bounds the memory of each batch whatever the backlog.
MAX_ROWS_PER_TRIGGER = 50_000
#: Longest wait for the broker to acknowledge one producer's clicks of one minute.
FLUSH_TIMEOUT_S = 120.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Produce clicks into a stratalog broker, count them per minute with Spark Structured "
                    "Streaming into Parquet and back into the broker, and check every count.")
    parser.add_argument("--events", type=int, default=200_000, metavar="N",
                        help="clicks to produce (default: %(default)s)")
    parser.add_argument("--minutes", type=int, default=5, metavar="M",
                        help="minutes of event time the clicks cover, ending at the start of the run "
                             "(default: %(default)s)")
    parser.add_argument("--producers", type=int, default=4, metavar="P",
                        help="producer threads, each with its own Kafka producer (default: %(default)s)")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="use this running broker instead of starting one (its topics clicks and "
                             "clicks_per_minute must not exist yet)")
    parser.add_argument("--data-dir", type=Path, metavar="DIR",
                        help="the started broker's data directory, kept afterwards (default: a temporary "
                             "directory, deleted at the end)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="where the Parquet output and the queries' checkpoints go, kept afterwards; "
                             "new or empty (default: a temporary directory, deleted at the end)")
    parser.add_argument("--trigger-ms", type=int, default=1000, metavar="MS",
                        help="micro-batch interval of the streaming queries (default: %(default)s)")
    args = parser.parse_args()
    if args.events < 1 or args.minutes < 1 or args.producers < 1 or args.trigger_ms < 1:
        parser.error("--events, --minutes, --producers and --trigger-ms must be at least 1")
    if args.bootstrap and args.data_dir:
        parser.error("--data-dir is for the broker this example starts; it cannot be given with --bootstrap")
    if args.out and args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out} is not empty: the queries would resume from the checkpoints there")
    return args


def minute_label(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime(MINUTE_FORMAT_PY)


# The broker and its topics ------------------------------------------------------------------------


@contextmanager
def own_broker(data_dir: Path | None) -> Iterator[str]:
    """``stratalog serve`` on an ephemeral port of 127.0.0.1, stopped (SIGTERM) on the way out."""
    with ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="clickstream-broker-")))
        broker = start_broker(data_dir)
        try:
            yield broker.bootstrap
        finally:
            code = broker.stop()
            broker.close_output()
            if code != 0:
                print(f"the broker exited with status {code}:\n{''.join(broker.output[-20:])}", file=sys.stderr)


def create_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(CLICKS, CLICKS_PARTITIONS), NewTopic(PER_MINUTE, 1)])
    for topic, future in futures.items():
        try:
            future.result(30)
        except KafkaException as e:
            if e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                raise SystemExit(f"topic {topic} already exists on {bootstrap}: its records would be counted "
                                 "too; use a fresh broker (leave out --bootstrap)") from None
            raise SystemExit(f"could not create topic {topic} on {bootstrap}: {e}") from None


# Producing ----------------------------------------------------------------------------------------


class ClickProducer:
    """One Kafka producer of click events, counting the clicks the broker acknowledged per minute."""

    def __init__(self, bootstrap: str, seed: int) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "linger.ms": 20})
        self.random = random.Random(seed)
        self.acked: Counter[str] = Counter()
        self.failed: list[str] = []

    def send_minute(self, minute_ms: int, count: int) -> None:
        """Produce ``count`` clicks at random times within the minute from ``minute_ms``, and wait until
        the broker has acknowledged all of them."""
        label = minute_label(minute_ms)

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is None:
                self.acked[label] += 1
            else:
                self.failed.append(str(error))

        for _ in range(count):
            user = f"u{self.random.randrange(USERS)}"
            page = (f"/product/{self.random.randrange(1000)}" if self.random.random() < 0.7
                    else self.random.choice(SECTIONS))
            event = {"user": user, "page": page, "ts": minute_ms + self.random.randrange(MINUTE_MS)}
            while True:
                try:
                    self.producer.produce(CLICKS, key=user, value=json.dumps(event), on_delivery=delivered)
                    break
                except BufferError:  # the client's queue is full: let acknowledgements drain it
                    self.producer.poll(0.1)
            self.producer.poll(0)
        left = self.producer.flush(FLUSH_TIMEOUT_S)
        if left:
            raise RuntimeError(f"{left} clicks of {label} not acknowledged within {FLUSH_TIMEOUT_S:.0f} s")


def split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal counts."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def produce_clicks(bootstrap: str, events: int, minutes: int, producers: int) -> Counter[str]:
    """Produce ``events`` clicks over the ``minutes`` before now; the acknowledged clicks per minute.

    The minutes go one after the other, each one's clicks all acknowledged before the next one's first is
    sent (see WATERMARK_MINUTES); within a minute, the producers' clicks interleave in any order.
    """
    first_ms = int(time.time() * 1000) // MINUTE_MS * MINUTE_MS - minutes * MINUTE_MS
    clients = [ClickProducer(bootstrap, seed) for seed in range(producers)]
    with ThreadPoolExecutor(producers, thread_name_prefix="producer") as pool:
        for minute, count in enumerate(split(events, minutes)):
            minute_ms = first_ms + minute * MINUTE_MS
            list(pool.map(ClickProducer.send_minute, clients, repeat(minute_ms), split(count, producers)))
            acked = sum(client.acked[minute_label(minute_ms)] for client in clients)
            print(f"  {minute_label(minute_ms)}: {acked:,} clicks acknowledged", flush=True)
    failed = [f for client in clients for f in client.failed]
    if failed:
        raise RuntimeError(f"{len(failed)} clicks were not acknowledged, such as: {failed[0]}")
    end_of_input(bootstrap, first_ms + (minutes + WATERMARK_MINUTES) * MINUTE_MS)
    return sum((client.acked for client in clients), Counter())


def end_of_input(bootstrap: str, ts: int) -> None:
    """Produce a record with event time ``ts`` and nothing else.

    A window is written once the watermark passes its end, and only a later event time moves the
    watermark, so after the last click nothing would ever write the last minute (a stream has no end of
    input in Spark). This record, one watermark delay past the last minute, moves the watermark past it.
    Its own minute never closes, so it is never written nor counted.
    """
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    errors: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            errors.append(error)

    producer.produce(CLICKS, value=json.dumps({"ts": ts}), on_delivery=delivered)
    if producer.flush(FLUSH_TIMEOUT_S) or errors:
        raise RuntimeError(f"the end-of-input record was not acknowledged: {errors or 'timed out'}")


# The streaming job --------------------------------------------------------------------------------


def start_queries(spark: SparkSession, bootstrap: str, out: Path, trigger_ms: int) -> list[StreamingQuery]:
    """The two streaming queries: clicks per minute into Parquet, and into topic clicks_per_minute.

    Both sinks take appended rows only (the file sink and the stratalog sink are append-only), so the
    windowed count runs in append mode: a minute is written once, final, when the watermark passes its
    end. Each query has its own checkpoint, and each sink is exactly once per micro-batch: the file sink
    through its metadata log, the stratalog sink through the broker, which commits each micro-batch of a
    sink id once. (foreachBatch writing both would be simpler, but a batch write into the broker names no
    sink, so a micro-batch replayed after a crash would be written twice.)
    """
    clicks = (spark.readStream.format("stratalog").option("path", f"kafka://{bootstrap}").option("topics", CLICKS)
              .option("maxRowsPerTrigger", MAX_ROWS_PER_TRIGGER).load())
    events = clicks.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("click")).select(
        F.timestamp_millis("click.ts").alias("time"))
    per_minute = (events.withWatermark("time", f"{WATERMARK_MINUTES} minutes")
                  .groupBy(F.window("time", "1 minute")).count()
                  .select(F.date_format("window.start", MINUTE_FORMAT_SPARK).alias("minute"),
                          F.col("count").alias("clicks")))
    trigger = f"{trigger_ms} milliseconds"
    to_parquet = (per_minute.writeStream.queryName("parquet").format("parquet").outputMode("append")
                  .option("checkpointLocation", str(out / "checkpoints" / "parquet"))
                  .trigger(processingTime=trigger).start(str(out / PER_MINUTE)))
    records = per_minute.select(F.col("minute").alias("key"), F.to_json(F.struct("minute", "clicks")).alias("value"))
    to_topic = (records.writeStream.queryName("topic").format("stratalog").outputMode("append")
                .option("path", f"kafka://{bootstrap}").option("topic", PER_MINUTE)
                .option("sinkId", f"{SINK_ID}-{int(time.time() * 1000)}")
                .option("checkpointLocation", str(out / "checkpoints" / "topic"))
                .trigger(processingTime=trigger).start())
    return [to_parquet, to_topic]


def written(spark: SparkSession, bootstrap: str, out: Path) -> tuple[Counter[str], Counter[str]]:
    """Clicks per minute in the Parquet output, and in topic clicks_per_minute (summed per minute, so a
    minute written twice would show)."""
    in_parquet, in_topic = Counter[str](), Counter[str]()
    for row in spark.read.parquet(str(out / PER_MINUTE)).collect():
        in_parquet[row.minute] += row.clicks
    topic = (spark.read.format("stratalog").option("path", f"kafka://{bootstrap}").option("topics", PER_MINUTE)
             .load().select(F.from_json(F.col("value").cast("string"), "minute string, clicks long").alias("v")))
    for row in topic.select("v.*").collect():
        in_topic[row.minute] += row.clicks
    return in_parquet, in_topic


def report(produced: Counter[str], in_parquet: Counter[str], in_topic: Counter[str]) -> bool:
    """Print the counts per minute; whether all three agree on every minute."""
    print(f"\n{'minute (UTC)':<18} {'produced':>10} {'in Parquet':>10} {'in topic':>10}")
    agree = True
    for minute in sorted(produced.keys() | in_parquet.keys() | in_topic.keys()):
        counts = (produced[minute], in_parquet[minute], in_topic[minute])
        same = len(set(counts)) == 1
        agree &= same
        print(f"{minute:<18} {counts[0]:>10,} {counts[1]:>10,} {counts[2]:>10,}  {'ok' if same else 'MISMATCH'}")
    totals = (produced.total(), in_parquet.total(), in_topic.total())
    print(f"{'total':<18} {totals[0]:>10,} {totals[1]:>10,} {totals[2]:>10,}")
    return agree


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    with ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(own_broker(args.data_dir))
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="clickstream-out-")))
        print(f"broker at {bootstrap}, output in {out}", flush=True)
        create_topics(bootstrap)

        spark = local_session("local[2]", app_name="clickstream")
        stack.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")
        queries = start_queries(spark, bootstrap, out, args.trigger_ms)
        for query in queries:
            stack.callback(query.stop)

        producing = time.monotonic()
        print(f"producing {args.events:,} clicks with {args.producers} producer{'s' * (args.producers > 1)}",
              flush=True)
        produced = produce_clicks(bootstrap, args.events, args.minutes, args.producers)
        print(f"acknowledged in {time.monotonic() - producing:.1f} s; waiting for the queries", flush=True)
        for query in queries:
            query.processAllAvailable()
        agree = report(produced, *written(spark, bootstrap, out))
    print(f"\n{'every minute matches' if agree else 'COUNTS DIFFER'} ({time.monotonic() - started:.0f} s in all)")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
