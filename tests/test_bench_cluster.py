"""`stratalog bench cluster` at a small scale: its JSON has every figure the report shows, and the
report made from that JSON (`--markdown-from`) shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from stratalog.bench.cluster import BROKER_COUNTS, PARTITIONS, RECORD_BYTES
from stratalog.commands.bench_cluster import cluster


@pytest.mark.slow
def test_a_short_run_measures_each_cluster_size_both_wals_and_a_failover(tmp_path: Path) -> None:
    json_path = tmp_path / "cluster.json"
    work = tmp_path / "work"
    result = CliRunner().invoke(cluster, ["--seconds", "2", "--rate", "200", "--failover-rounds", "1",
                                          "--dir", str(work), "--json", str(json_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(json_path.read_text())
    assert {"date", "commit", "command", "machine"} <= set(doc)
    assert doc["settings"]["record_bytes"] == RECORD_BYTES and doc["settings"]["partitions"] == PARTITIONS
    assert [row["brokers"] for row in doc["throughput"]] == list(BROKER_COUNTS)
    for row in doc["throughput"]:
        assert row["records"] > 0 and row["failed"] == 0 and row["unanswered"] == 0
        assert row["mib_per_s"] == pytest.approx(row["records_per_s"] * RECORD_BYTES / (1 << 20))
    assert [row["wal"] for row in doc["latency"]] == ["object", "device"]
    for row in doc["latency"]:
        lat = row["latency_ms"]
        assert row["failed"] == 0 and lat["samples"] > 100
        assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    failover = doc["failover"]
    assert len(failover["rounds"]) == 1 and failover["load_failed"] == 0
    assert 0 < failover["min_s"] == failover["max_s"] == failover["rounds"][0]["failover_s"]
    assert list(work.iterdir()) == []   # the servers' directories are removed at the end

    markdown = CliRunner().invoke(cluster, ["--markdown-from", str(json_path)])
    assert markdown.exit_code == 0, markdown.output
    assert markdown.output.startswith(f"Measured {doc['date'][:10]}")
    for title in ("Produce throughput", "Produce latency", "Failover of three brokers"):
        assert title in markdown.output
    assert f"| 3 | {doc['throughput'][2]['records_per_s']:,.0f} |" in markdown.output
    assert f"{failover['max_s']:.2f}" in markdown.output
