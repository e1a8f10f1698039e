"""A quixstreams application with processing_guarantee="exactly-once" (tests/apps/quixstreams_counter.py)
counting the events of each key into an output topic, killed with SIGKILL KILLS times mid-stream (as soon as
a checkpoint's transaction is open: records past the output's last stable offsets) and started again each
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
    Watermarks,
    broker_args,
    committed,
    create_topic,
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


def feed_and_kill(app: AppProcess, keys: list[str], output: Watermarks) -> bool:
    """Produce ``keys``' events and SIGKILL the app as soon as a transaction of its output is open: some of
    a checkpoint's records written and none committed. Whether it still was after the kill (it may have
    committed in between: then the kill fell between two), once its timeout has aborted it."""
    produce(app.bootstrap, keys)
    wait_progressing(lambda: output.open_records() > 0, lambda: (done_so_far(app), output.ends()),
                     lambda: f"an open transaction in the output:\n{app.log_tail()}", poll_s=0.005)
    app.kill9()
    inside = output.open_records() > 0
    # quixstreams gives each run a transactional.id of its own: only the transaction's timeout ends it.
    wait_progressing(lambda: output.open_records() == 0, output.ends,
                     lambda: f"the killed run's transaction to be aborted:\n{app.log_tail()}", poll_s=0.1)
    return inside


def test_exactly_once_counts_survive_kills_mid_transaction(tmp_path: Path) -> None:
    python = app_python("quixstreams")
    with running_broker(tmp_path / "data", *broker_args(tmp_path)) as broker:
        create_topic(broker.bootstrap, INPUT_TOPIC, INPUT_PARTITIONS)
        keys = event_keys(seed=41)
        size = len(keys) // (KILLS + 1)
        chunks = [keys[i * size:(i + 1) * size if i < KILLS else len(keys)] for i in range(KILLS + 1)]
        app = AppProcess(python, "quixstreams_counter.py", broker.bootstrap, tmp_path / "state",
                         tmp_path / "app.log", args=("exactly-once",))
        output = Watermarks(broker.bootstrap, OUTPUT_TOPIC)
        kills_inside = 0
        try:
            for chunk in chunks[:-1]:
                app.start()
                kills_inside += feed_and_kill(app, chunk, output)
                shutil.rmtree(app.state_dir, ignore_errors=True)
            app.start()
            produce(broker.bootstrap, chunks[-1])
            wait_progressing(lambda: done_so_far(app) == len(keys), lambda: done_so_far(app),
                             lambda: f"{GROUP} to commit all {len(keys)} events:\n{app.log_tail()}", poll_s=0.1)
            wait_progressing(lambda: output.open_records() == 0, output.ends,
                             lambda: f"the last run's transactions to end:\n{broker.output[-20:]}", poll_s=0.1)
        finally:
            app.stop()
            output.close()
        running: dict[str, list[int]] = {}
        for message in read_topic(broker.bootstrap, OUTPUT_TOPIC):   # librdkafka reads read_committed
            key, value = message.key(), message.value()
            assert key is not None and value is not None
            running.setdefault(key.decode(), []).append(int(json.loads(value)))
        written = len(read_topic(broker.bootstrap, OUTPUT_TOPIC, "read_uncommitted"))
        assert not refused_requests(broker), refused_requests(broker)
    true = Counter(keys)
    assert app.runs == KILLS + 1
    assert kills_inside > 0 and written > len(keys), \
        "the kills fell inside transactions: their records were written, then aborted"
    assert {k: len(v) for k, v in running.items()} == dict(true), "one output per event, none twice"
    assert all(v == list(range(1, len(v) + 1)) for v in running.values()), \
        {k: v for k, v in running.items() if v != list(range(1, len(v) + 1))}
