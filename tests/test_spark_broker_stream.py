"""A streaming read of and a streaming write into a live broker, both in one driver, killed with SIGKILL
and restarted from their checkpoints: every acknowledged record reaches the sink once; every input row
reaches the topic once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from brokerkit import running_broker
from waiting import wait_progressing

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("spark_stream_driver.py")
#: A driver starts its own JVM: allow for a slow start on a busy machine.
DRIVER_START_S = 120.0
#: How long the streams may show no progress at all (no new checkpoint file, no new sink row, no new
#: record in the topic) before the test calls them stuck: a busy machine is slower, never stuck this long.
STALL_S = 300.0
#: Between looks at the sink: each look is a Spark job of the test's own session.
LOOK_S = 0.5


class Producing(threading.Thread):
    """Produces to a topic whenever it is given records to produce, remembering every acknowledged one."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                                  "enable.idempotence": True})
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
        while True:
            with self.changed:
                while self.sent >= self.wanted and not self.stopping:
                    self.producer.poll(0)
                    self.changed.wait(0.1)
                if self.sent >= self.wanted:
                    break
                burst = min(self.wanted - self.sent, 100)
            for _ in range(burst):
                self.producer.produce(self.topic, value=b"e%d" % self.sent, partition=self.sent % self.partitions,
                                      on_delivery=self.delivered)
                self.sent += 1
            self.producer.poll(0)
        self.producer.flush(60)


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


@contextmanager
def stream_driver(tmp_path: Path, bootstrap: str, inputs: Inputs, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """The driver (its read of "events", its write into "out"), killed with its JVM on the way out, as when
    its machine dies."""
    log = (tmp_path / f"{name}.log").open("wb")
    local = tmp_path / f"{name}-local"
    local.mkdir()
    process = subprocess.Popen([sys.executable, str(DRIVER), bootstrap, "events", str(tmp_path / "sink"),
                                str(inputs.directory), "out", str(tmp_path / "checkpoint"), str(local)],
                               stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    try:
        assert process.stdout is not None
        started = threading.Event()
        threading.Thread(target=lambda: process.stdout.readline() and started.set(), daemon=True).start()
        if not started.wait(DRIVER_START_S):
            raise AssertionError("the driver did not start:\n" + (tmp_path / f"{name}.log").read_text()[-3000:])
        yield process
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        assert process.stdout is not None
        process.stdout.close()
        log.close()


def test_a_driver_killed_mid_stream_and_restarted_reads_and_writes_each_record_once(spark: Any,
                                                                                    tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[store]\nupload_interval_s = 0.5\n")
    inputs = Inputs(tmp_path / "input")
    with running_broker(tmp_path / "data", "--config", str(config)) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic("events", 3), NewTopic("out", 1)]).values():
            future.result(30)
        producing = Producing(broker.bootstrap, "events", 3)
        producing.start()
        producing.produce(6000)
        inputs.add(4)
        try:
            rows = through_two_drivers(spark, tmp_path, broker.bootstrap, admin, producing, inputs)
        finally:
            producing.stop()
        written = spark.read.format("stratalog").option("path", f"kafka://{broker.bootstrap}") \
            .option("topics", "out").load().collect()
        assert broker.stop() == 0

    read = [(r.stream, r.offset, r.value) for r in rows]
    assert len(read) == len(set(read)), "a record reached the sink twice"
    assert set(read) == producing.acked
    assert sorted(int(r.value) for r in written) == list(range(inputs.rows)), "each input row once"
    assert sorted(r.offset for r in written) == list(range(inputs.rows))


def through_two_drivers(spark: Any, tmp_path: Path, bootstrap: str, admin: AdminClient, producing: Producing,
                        inputs: Inputs) -> list[Any]:
    def sink() -> Any:
        return spark.read.schema("stream string, offset bigint, value binary").parquet(str(tmp_path / "sink"))

    def sink_count() -> int:
        return sink().count() if (tmp_path / "sink" / "_spark_metadata").is_dir() else 0

    def progress() -> tuple[int, int]:
        """What moves while the driver works: its checkpoint files and the records in the written topic."""
        checkpoint = tmp_path / "checkpoint"
        files = sum(1 for _ in checkpoint.rglob("*")) if checkpoint.is_dir() else 0
        return files, topic_records(bootstrap, "out")

    def until(condition: Any, what: str, driver: str) -> None:
        def said() -> str:
            log = (tmp_path / f"{driver}.log").read_text(errors="replace")[-3000:]
            return f"{what} (sink {sink_count()} rows, topic out {topic_records(bootstrap, 'out')}); " \
                   f"{driver}'s log ends:\n{log}"
        wait_progressing(condition, progress, said, stall_s=STALL_S, poll_s=LOOK_S)

    with stream_driver(tmp_path, bootstrap, inputs, "driver-1"):
        until(lambda: sink_count() >= 3000, "the first micro-batches of the read", "driver-1")
        until(lambda: topic_records(bootstrap, "out") >= 2 * ROWS_PER_FILE, "the first micro-batches of the write",
              "driver-1")
        # Trim what the sink holds (a retention pass behind the reader); the kill comes a few
        # micro-batches later, so the batch a restart plans again starts past the trim.
        held = sink().groupBy("stream").max("offset").collect()
        trim_to = {r[0]: r[1] for r in held}
        count = sink_count()
        done = admin.delete_records([TopicPartition("events", int(s.split("/")[1]), o) for s, o in trim_to.items()])
        for future in done.values():
            future.result(30)
        # Files enough for the write to be under way at the kill, a micro-batch each.
        written = topic_records(bootstrap, "out")
        inputs.add(8)
        producing.produce(6000)
        until(lambda: sink_count() >= count + 4500, "micro-batches of the read after the trim", "driver-1")
        until(lambda: topic_records(bootstrap, "out") > written, "a micro-batch of the new files", "driver-1")
    killed_at = sink_count()

    with stream_driver(tmp_path, bootstrap, inputs, "driver-2"):
        producing.produce(6000)
        inputs.add(2)
        until(lambda: sink_count() >= killed_at + 3000, "micro-batches after the restart", "driver-2")
        producing.stop()
        assert not producing.errors
        until(lambda: sink_count() >= len(producing.acked), "the last acknowledged records", "driver-2")
        until(lambda: topic_records(bootstrap, "out") >= inputs.rows, "every file written", "driver-2")
        return list(sink().collect())


def topic_records(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()})
    return sum(int(f.result(30).offset) for f in futures.values())
