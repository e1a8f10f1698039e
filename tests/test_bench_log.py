"""`stratalog bench log` at a tiny scale: it runs, prints its tables and writes its JSON in the shape the
report reads."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from stratalog.cli import cli

PERCENTILES = {"p50", "p90", "p99", "p99_9", "p99_99", "max"}


def test_bench_log_prints_and_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "log.json"
    result = CliRunner().invoke(cli, ["bench", "log", "--sizes", "256B,1KiB", "--rate", "100", "--seconds", "0.3",
                                      "--records", "300", "--dir", str(tmp_path), "--json", str(out)],
                                catch_exceptions=False, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "Append latency" in result.output and "Throughput" in result.output
    doc = json.loads(out.read_text())
    assert doc["bench"] == "log" and doc["fsync"] == "always"
    assert [row["record_bytes"] for row in doc["latency"]] == [256, 1024]
    for row in doc["latency"]:
        assert row["rate_per_s"] == 100 and row["seconds"] == 0.3 and row["count"] == 30
        assert set(row["latency_ms"]) >= PERCENTILES
        ms = row["latency_ms"]
        assert 0 < ms["p50"] <= ms["p90"] <= ms["p99"] <= ms["p99_9"] <= ms["p99_99"] <= ms["max"]
    assert [row["record_bytes"] for row in doc["throughput"]] == [256, 1024]
    for row in doc["throughput"]:
        assert row["records"] == 300 and row["records_per_s"] > 0 and row["mib_per_s"] > 0
    assert not [p for p in tmp_path.iterdir() if p.name != "log.json"], "the bench left files behind"
