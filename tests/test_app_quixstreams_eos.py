"""A quixstreams application with processing_guarantee="exactly-once" (tests/apps/quixstreams_counter.py)
counting the events of each key into an output topic, killed with SIGKILL KILLS times mid-stream (while a
checkpoint's transaction is open: its output grew past what its last commit covered) and started again each
time with its state directory deleted: read_committed, every key's running counts in the output are exactly
1, 2, ..., its number of events, in order. Each checkpoint is one Kafka transaction of the changelog's and
output's records and the input offsets (KIP-98, KIP-447), so what a killed run had begun is aborted and
done again, never twice. quixstreams gives each run a transactional.id of its own, so a killed run's
transaction is ended by its timeout, not by the next run's fencing: the output is read once all have ended."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from appkit import (
    INPUT_PARTITIONS,
    INPUT_TOPIC,
    AppProcess,
    broker_args,
    committed,
    create_topic,
    end_offsets,
    event_keys,
    produce,
    read_topic,
    refused_requests,
)
from appvenv import app_python
from brokerkit import running_broker
from waiting import wait_progressing

pytestmark = pytest.mark.slow

GROUP = "quix-counter"
OUTPUT_TOPIC = "counts"
KILLS = 3


def done_so_far(app: AppProcess) -> int:
    """Input events the group has committed."""
    return sum(max(o, 0) for o in committed(app.bootstrap, GROUP, list(range(INPUT_PARTITIONS))).values())


def output_written(app: AppProcess) -> int:
    """Output records, committed or not (the high watermarks)."""
    return sum(end_offsets(app.bootstrap, OUTPUT_TOPIC, "read_uncommitted").values())


def output_open(app: AppProcess) -> int:
    """Output records of transactions not yet ended: between the last stable offsets and the high watermarks."""
    return output_written(app) - sum(end_offsets(app.bootstrap, OUTPUT_TOPIC).values())


def feed_and_kill(app: AppProcess, keys: list[str]) -> None:
    """Produce ``keys``' events and SIGKILL the app as soon as its output grows: a checkpoint's transaction
    is open then, some of its records written and none committed."""
    written = output_written(app) if app.runs > 1 else 0
    produce(app.bootstrap, keys)
    wait_progressing(lambda: output_written(app) > written, lambda: (done_so_far(app), output_written(app)),
                     lambda: f"output from the events:\n{app.log_tail()}", poll_s=0.01)
    app.kill9()


def test_exactly_once_counts_survive_kills_mid_transaction(tmp_path: Path) -> None:
    python = app_python("quixstreams")
    with running_broker(tmp_path / "data", *broker_args(tmp_path)) as broker:
        create_topic(broker.bootstrap, INPUT_TOPIC, INPUT_PARTITIONS)
        keys = event_keys(seed=41)
        size = len(keys) // (KILLS + 1)
        chunks = [keys[i * size:(i + 1) * size if i < KILLS else len(keys)] for i in range(KILLS + 1)]
        app = AppProcess(python, "quixstreams_counter.py", broker.bootstrap, tmp_path / "state",
                         tmp_path / "app.log", args=("exactly-once",))
        try:
            for chunk in chunks[:-1]:
                app.start()
                feed_and_kill(app, chunk)
                shutil.rmtree(app.state_dir, ignore_errors=True)
            app.start()
            produce(broker.bootstrap, chunks[-1])
            wait_progressing(lambda: done_so_far(app) == len(keys), lambda: done_so_far(app),
                             lambda: f"{GROUP} to commit all {len(keys)} events:\n{app.log_tail()}", poll_s=0.1)
        finally:
            app.stop()
        # Each killed run's transaction stays open until its timeout (the app's transaction.timeout.ms) and
        # holds back read_committed readers: read once every one has ended.
        wait_progressing(lambda: output_open(app) == 0, lambda: output_open(app),
                         lambda: f"the killed runs' transactions to be aborted:\n{broker.output[-20:]}", poll_s=0.1)
        running: dict[str, list[int]] = {}
        for message in read_topic(broker.bootstrap, OUTPUT_TOPIC):   # librdkafka reads read_committed
            key, value = message.key(), message.value()
            assert key is not None and value is not None
            running.setdefault(key.decode(), []).append(int(json.loads(value)))
        written = len(read_topic(broker.bootstrap, OUTPUT_TOPIC, "read_uncommitted"))
        assert not refused_requests(broker), refused_requests(broker)
    true = Counter(keys)
    assert app.runs == KILLS + 1
    assert written > len(keys), "the kills fell inside transactions: their records were written, then aborted"
    assert {k: len(v) for k, v in running.items()} == dict(true), "one output per event, none twice"
    assert all(v == list(range(1, len(v) + 1)) for v in running.values()), \
        {k: v for k, v in running.items() if v != list(range(1, len(v) + 1))}
