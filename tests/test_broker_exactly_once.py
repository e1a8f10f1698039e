"""Exactly once through librdkafka's consume-transform-produce loop (a read_committed consumer, a
transactional producer, send_offsets_to_transaction) while the broker is killed with -9 ROUNDS times:
every input record appears in the output exactly once, read_committed. (The loop, and the producer setting
it needs with a broker that goes away: txnkit.RdkafkaPipeline.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from txnkit import INPUT_RECORDS, ROUNDS, RdkafkaPipeline, assert_each_input_once, through_kills

pytestmark = pytest.mark.slow

def test_consume_transform_produce_writes_each_input_once_across_kill9(tmp_path: Path) -> None:
    values, pipeline = through_kills(tmp_path / "data", lambda bootstrap: RdkafkaPipeline(bootstrap, "in", "out"))
    assert_each_input_once(values)
    print(f"{INPUT_RECORDS} inputs through {ROUNDS} kills of the broker: each once; the pipeline went back "
          f"{pipeline.restarts} times")
