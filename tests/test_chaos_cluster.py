"""`stratalog chaos cluster`: kill -9 of brokers of a three-broker cluster under Kafka clients, counted.

A short run (two kills) through the command line: it must exit 0, print the table, and write JSON whose
counts say nothing acknowledged was lost or written twice, no committed offset went back, and each kill
was followed by every partition served again; everything it started is gone once it returns.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from stratalog.chaos.cluster import FAILOVER_S_MAX, MUST_BE_ZERO
from stratalog.commands.chaos_cluster import cluster

KILLS = 2


@pytest.mark.slow
def test_two_kills_lose_nothing_and_every_partition_is_served_again(tmp_path: Path) -> None:
    json_path = tmp_path / "chaos.json"
    work = tmp_path / "work"
    result = CliRunner().invoke(cluster, ["--minutes", "2", "--kills", str(KILLS), "--seed", "3",
                                      "--dir", str(work), "--json", str(json_path)])
    assert result.exit_code == 0, result.output
    assert "Cluster kill -9 chaos" in result.output
    doc = json.loads(json_path.read_text())
    assert doc["command"] == "chaos cluster"
    assert doc["parameters"]["kills_max"] == KILLS and doc["parameters"]["brokers"] == 3
    figures = doc["figures"]
    assert figures["ok"] is True
    assert {name: figures[name] for name in MUST_BE_ZERO} == dict.fromkeys(MUST_BE_ZERO, 0)
    assert figures["kills"] == KILLS == len(doc["per_iteration"])
    assert figures["records_acknowledged"] > 1000
    assert figures["records_in_log"] == figures["records_acknowledged"] + figures["records_unacknowledged_in_log"]
    assert figures["records_consumed"] >= figures["records_acknowledged"]
    failovers = [k["failover_s"] for k in doc["per_iteration"]]
    assert 0 < figures["failover_s_min"] == min(failovers) <= figures["failover_s_max"] == max(failovers)
    assert figures["failover_s_max"] < FAILOVER_S_MAX
    # Killed brokers are among the live ones each time (one always stays alive).
    assert all(1 <= k["broker_id"] <= 3 for k in doc["per_iteration"])
    assert list(work.iterdir()) == []   # the servers' directories are removed at the end


def test_a_cluster_of_one_broker_is_refused() -> None:
    result = CliRunner().invoke(cluster, ["--brokers", "1"])
    assert result.exit_code == 2
    assert "--brokers" in result.output
