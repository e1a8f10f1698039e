"""A streaming read of and a streaming write into a live broker, both in one driver, killed with SIGKILL
and restarted from their checkpoints: every acknowledged record reaches the sink once; every input row
reaches the topic once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from brokerkit import running_broker
from sparkstreamkit import Inputs, Producing, assert_each_record_once, through_two_drivers

pytestmark = pytest.mark.slow


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
    assert_each_record_once(rows, written, producing, inputs)
