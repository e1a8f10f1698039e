"""A Spark driver in a process of its own (spark_stream_driver.py) streaming out of and into a live broker,
killed with SIGKILL mid-stream and restarted from its checkpoints (test_spark_broker_stream.py): what
feeds it (a producer remembering every acknowledged record, JSON files appearing a few at a time) and the
run through two drivers that the test checks for each record once. ``options`` and ``mid_stream`` are for
the same run against a cluster (S3 credentials, the kill of a broker).

The waits look twice a second, so each look is cheap: the sink's rows are counted from its commit log and
its Parquet files' footers (``SinkRows``), not by a Spark job (on two cores, one every half second competed
with the drivers under test). The test reads the results without Spark too, so it starts no SparkSession
of its own beside the drivers' JVMs: the sink's rows from the files its commit log names (as Spark's file
source reads a streaming sink), the written topic through a Kafka consumer."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from spark_stream_driver import RESTARTED
from stratalog.chaos.cluster_load import read_log
from waiting import wait_progressing

DRIVER = Path(__file__).with_name("spark_stream_driver.py")
#: A driver starts its own JVM: allow for a slow start on a busy machine.
DRIVER_START_S = 120.0
#: How long the streams may show no progress at all (no new checkpoint file, no new sink row, no new
#: record in the topic) before the test calls them stuck: a busy machine is slower, never stuck this long.
STALL_S = 300.0
#: Between looks at the sink and the written topic.
LOOK_S = 0.5
#: How long a look at the end of the written topic waits for its answer before it looks again.
LIST_OFFSETS_S = 10.0


class Producing(threading.Thread):
    """Produces to a topic whenever it is given records to produce, remembering every acknowledged one."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.topic, self.partitions = topic, partitions
        self.acked: set[tuple[str, int, bytes]] = set()
        self.errors: list[str] = []
        self.wanted = 0
        self.sent = 0
        self.stopping = False
        self.changed = threading.Condition()

    def produce(self, count: int) -> None:
        """Produce ``count`` more records, in the background."""
        with self.changed:
            self.wanted += count
            self.changed.notify()

    def stop(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify()
        self.join(60)

    def delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.acked.add((f"{self.topic}/{message.partition()}", message.offset(), message.value()))

    def run(self) -> None:
        # Made and dropped here: a producer kept alive would knock on the brokers' ports after they stop.
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 5,
                             "enable.idempotence": True})
        while True:
            with self.changed:
                while self.sent >= self.wanted and not self.stopping:
                    producer.poll(0)
                    self.changed.wait(0.1)
                if self.sent >= self.wanted:
                    break
                burst = min(self.wanted - self.sent, 100)
            for _ in range(burst):
                producer.produce(self.topic, value=b"e%d" % self.sent, partition=self.sent % self.partitions,
                                 on_delivery=self.delivered)
                self.sent += 1
            producer.poll(0)
        producer.flush(60)


#: Rows of each input file of the streaming write: one file a micro-batch (maxFilesPerTrigger 1).
ROWS_PER_FILE = 400


class Inputs:
    """JSON files (id, key) for the streaming write, added to its input directory a few at a time."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir()
        self.files = 0
        self.rows = 0

    def add(self, files: int) -> None:
        for _ in range(files):
            lines = [json.dumps({"id": self.rows + i, "key": f"user-{(self.rows + i) % 17}"})
                     for i in range(ROWS_PER_FILE)]
            staged = self.directory / f".part-{self.files:03d}.json"  # hidden until whole: the source skips it
            staged.write_text("\n".join(lines) + "\n")
            staged.rename(self.directory / f"part-{self.files:03d}.json")
            self.files += 1
            self.rows += ROWS_PER_FILE


class Driver:
    """The driver (its read of "events", its write into "out") in a process of its own."""

    def __init__(self, tmp_path: Path, bootstrap: str, inputs: Inputs, name: str,
                 options: dict[str, str]) -> None:
        self.log_path = tmp_path / f"{name}.log"
        self.name = name
        self.local = tmp_path / f"{name}-local"
        self.command = [sys.executable, str(DRIVER), bootstrap, "events", str(tmp_path / "sink"),
                        str(inputs.directory), "out", str(tmp_path / "checkpoint"), str(self.local),
                        json.dumps(options)]
        self.local.mkdir(exist_ok=True)
        self.log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=self.log, start_new_session=True)
        stdout = self.process.stdout
        assert stdout is not None
        started = threading.Event()
        threading.Thread(target=lambda: stdout.readline() and started.set(), daemon=True).start()
        if not started.wait(DRIVER_START_S):
            raise AssertionError(f"{self.name} did not start:\n{self.said()}")

    def said(self, tail_chars: int | None = 3000) -> str:
        said = self.log_path.read_text(errors="replace")
        return said if tail_chars is None else said[-tail_chars:]

    def restarts(self) -> int:
        """Queries the driver restarted after a slow Python worker start (see spark_stream_driver)."""
        return self.said(None).count(RESTARTED)

    def check(self) -> None:
        """Fail at once if the driver ended: it runs until killed."""
        code = self.process.poll()
        if code is not None:
            raise AssertionError(f"{self.name} ended with status {code}:\n{self.said()}")

    def kill(self) -> None:
        """SIGKILL with its JVM, as when its machine dies."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        assert self.process.stdout is not None
        self.process.stdout.close()
        self.log.close()


@contextmanager
def stream_driver(tmp_path: Path, bootstrap: str, inputs: Inputs, name: str,
                  options: dict[str, str]) -> Iterator[Driver]:
    """A driver, killed on the way out."""
    driver = Driver(tmp_path, bootstrap, inputs, name, options)
    try:
        yield driver
    finally:
        driver.kill()


def through_two_drivers(tmp_path: Path, bootstrap: str, admin: AdminClient, producing: Producing, inputs: Inputs,
                        options: dict[str, str] | None = None,
                        mid_stream: Callable[[], None] = lambda: None) -> list[SinkRow]:
    """The rows of the sink after two drivers: the first reads and writes, sees the topic trimmed behind it,
    lives through ``mid_stream()`` (a broker killed) and is killed -9 mid-stream; the second, started from
    the checkpoints, goes on until every acknowledged record is in the sink and every input row in "out".
    ``options``: the data source's own (S3 credentials) for the drivers."""
    sink_count = SinkRows(tmp_path / "sink")

    def until(condition: Any, what: str, driver: Driver) -> None:
        def progress() -> tuple[int, int, int]:
            """What moves while the driver works: its checkpoint files, the records in the written topic, and
            its queries' restarts after a slow worker start (each a sign of life on a loaded machine)."""
            checkpoint = tmp_path / "checkpoint"
            files = sum(1 for _ in checkpoint.rglob("*")) if checkpoint.is_dir() else 0
            return files, topic_records(bootstrap, "out"), driver.restarts()

        def said() -> str:
            return f"{what} (sink {sink_count()} rows, topic out {topic_records(bootstrap, 'out')}, " \
                   f"{driver.restarts()} query restarts); {driver.name}'s log ends:\n{driver.said()}"

        def checked() -> Any:
            driver.check()
            return condition()
        wait_progressing(checked, progress, said, stall_s=STALL_S, poll_s=LOOK_S)

    with stream_driver(tmp_path, bootstrap, inputs, "driver-1", options or {}) as first:
        until(lambda: sink_count() >= 3000, "the first micro-batches of the read", first)
        until(lambda: topic_records(bootstrap, "out") >= 2 * ROWS_PER_FILE, "the first micro-batches of the write",
              first)
        # Trim what the sink holds (a retention pass behind the reader); the kill comes a few
        # micro-batches later, so the batch a restart plans again starts past the trim.
        trim_to: dict[str, int] = {}
        for stream, offset, _ in sink_count.rows():
            trim_to[stream] = max(offset, trim_to.get(stream, offset))
        count = sink_count()
        done = admin.delete_records([TopicPartition("events", int(s.split("/")[1]), o) for s, o in trim_to.items()])
        for future in done.values():
            future.result(30)
        # Files enough for the write to be under way at the kill, a micro-batch each.
        written = topic_records(bootstrap, "out")
        inputs.add(8)
        producing.produce(6000)
        mid_stream()
        until(lambda: sink_count() >= count + 4500, "micro-batches of the read after the trim", first)
        until(lambda: topic_records(bootstrap, "out") > written, "a micro-batch of the new files", first)
    killed_at = sink_count()

    with stream_driver(tmp_path, bootstrap, inputs, "driver-2", options or {}) as second:
        producing.produce(6000)
        inputs.add(2)
        until(lambda: sink_count() >= killed_at + 3000, "micro-batches after the restart", second)
        producing.stop()
        assert not producing.errors
        until(lambda: sink_count() >= len(producing.acked), "the last acknowledged records", second)
        until(lambda: topic_records(bootstrap, "out") >= inputs.rows, "every file written", second)
        return sink_count.rows()


#: A row of the sink: the record's stream ("topic/partition"), offset and value.
SinkRow = tuple[str, int, bytes]


class SinkRows:
    """The rows a streaming file sink has committed, as Spark reads them: the files its commit log
    (``_spark_metadata``: batch files ``N`` and compactions ``N.compact``, each a version line then one JSON
    entry per file added or deleted) names, their rows counted from each Parquet footer once."""

    def __init__(self, sink: Path) -> None:
        self.log = sink / "_spark_metadata"
        self._rows: dict[str, int] = {}

    def __call__(self) -> int:
        try:
            return sum(self._rows_of(path) for path in self._committed())
        except FileNotFoundError:   # a compaction deleted a batch file just listed: look again
            return sum(self._rows_of(path) for path in self._committed())

    def rows(self) -> list[SinkRow]:
        """Every row of the files the commit log names."""
        rows: list[SinkRow] = []
        for path in sorted(self._committed()):
            table = pq.read_table(path, columns=["stream", "offset", "value"])
            rows.extend(zip(*(table.column(name).to_pylist() for name in ("stream", "offset", "value")),
                            strict=True))
        return rows

    def _committed(self) -> set[str]:
        if not self.log.is_dir():
            return set()
        batches = {int(f.name.removesuffix(".compact")): f for f in self.log.iterdir()
                   if f.name.removesuffix(".compact").isdigit()}
        since = max((b for b, f in batches.items() if f.name.endswith(".compact")), default=-1)
        files: set[str] = set()
        for batch in sorted(b for b in batches if b >= since):
            for line in batches[batch].read_text().splitlines()[1:]:
                entry = json.loads(line)
                path = unquote(urlparse(entry["path"]).path)
                if entry["action"] == "add":
                    files.add(path)
                else:
                    files.discard(path)
        return files

    def _rows_of(self, path: str) -> int:
        if path not in self._rows:
            self._rows[path] = pq.ParquetFile(path).metadata.num_rows
        return self._rows[path]


def topic_records(bootstrap: str, topic: str) -> int:
    """The end offset of ``topic``'s partition 0; -1 while no leader answers (a failover under way). A new
    client each time: librdkafka's admin client can stay stuck on a leader that was killed (kafka_client.py,
    TIMED_OUT), its threads spinning."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()})
    try:
        return sum(int(f.result(LIST_OFFSETS_S).offset) for f in futures.values())
    except (KafkaException, TimeoutError):
        return -1


def assert_each_record_once(read: list[SinkRow], bootstrap: str, producing: Producing, inputs: Inputs) -> None:
    """Every acknowledged record read into the sink (``read``) once; every input row written once, at the
    offsets 0 to n-1 of "out" (read back by a Kafka consumer: read_log's value ``i`` is at offset ``i``)."""
    assert len(read) == len(set(read)), "a record reached the sink twice"
    assert set(read) == producing.acked, f"missing: {sorted(producing.acked - set(read))[:10]}"
    written = read_log(bootstrap, "out", 1)[0]
    assert sorted(int(value) for value in written) == list(range(inputs.rows)), "each input row once"
    assert len(written) == inputs.rows
