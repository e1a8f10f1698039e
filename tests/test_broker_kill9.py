"""kill -9 of the broker under load from idempotent producers: every acknowledged record once, in order.

The harness (``stratalog.chaos.broker``, also ``stratalog chaos broker``) kills the broker 20 times
while two librdkafka idempotent producers (acks=all) write; each promise is a count that must be zero.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stratalog.chaos.broker import MUST_BE_ZERO, BrokerChaosConfig, IterationFigures, run_broker_chaos

#: Kills in the suite; `stratalog chaos broker` runs more.
KILLS = 20


@pytest.mark.slow
def test_kill9_under_idempotent_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rounds: list[IterationFigures] = []
    figures = run_broker_chaos(tmp_path / "data", BrokerChaosConfig(iterations=KILLS, seed=23), rounds.append)
    assert len(rounds) == KILLS
    assert figures.records_acknowledged > 1000 and all(r.records_acknowledged > 0 for r in rounds)
    assert figures.records_read == figures.records_sent == figures.records_acknowledged
    assert {name: getattr(figures, name) for name in MUST_BE_ZERO} == dict.fromkeys(MUST_BE_ZERO, 0)
