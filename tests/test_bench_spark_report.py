"""`stratalog bench spark --markdown-from`: BENCHMARKS.md's tables and plot made from runs' JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from stratalog.bench.spark import ratio
from stratalog.cli import cli


def run_doc(records: int, value_bytes: int, at_rest: bool) -> dict[str, Any]:
    broker = {"write": ratio(records, 10.0, 5.0, 0.7), "read": ratio(records, 4.0, 2.0, 0.7),
              "materialized_read": ratio(records, 2.1, 2.0, 0.9),
              "materialize": {"seconds": 4.0, "files": 8, "bytes": 91_500_000, "rows_per_s": records / 4},
              "latency": {"records": 40_000, "seen": 40_000, "trigger": "1 second", "p50_ms": 644.2,
                          "p99_ms": 1169.0, "max_ms": 1207.0}}
    doc: dict[str, Any] = {"plan": {"records": records, "streams": 1000, "value_bytes": value_bytes,
                                    "master": "local[2]", "data_bytes": 1}, "broker": broker}
    if at_rest:  # this run also has the ceilings (a Python source doing nothing); the other predates them
        doc.update(write=ratio(records, 8.0, 5.0, 0.5), read=ratio(records, 3.0, 2.0, 0.7),
                   ceiling={"read": {"seconds": 2.5, "rows_per_s": records / 2.5, "over_parquet": 2.0 / 2.5},
                            "write": {"seconds": 6.25, "rows_per_s": records / 6.25, "over_parquet": 5.0 / 6.25}})
    return doc


def test_tables_and_plot_come_from_the_json(tmp_path: Path) -> None:
    paths = []
    for n, (records, size, at_rest) in enumerate([(5_000_000, 100, True), (20_000_000, 1024, False)]):
        paths.append(tmp_path / f"run{n}.json")
        paths[-1].write_text(json.dumps(run_doc(records, size, at_rest)))
    plot = tmp_path / "ratios.png"
    result = CliRunner().invoke(cli, ["bench", "spark", "--markdown-from", str(paths[0]), "--markdown-from",
                                       str(paths[1]), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "| 5,000,000 | 100 B | write, a Python source doing nothing | 6.25 | 800,000 | 1,000,000 | 0.80 | 1.00 " \
           "| - |" in lines
    assert "| 5,000,000 | 100 B | read, a Python source doing nothing | 2.50 | 2,000,000 | 2,500,000 | 0.80 | 1.00 " \
           "| - |" in lines
    assert "| 5,000,000 | 100 B | write, at rest | 8.00 | 625,000 | 1,000,000 | 0.62 | 0.78 | >= 0.5: met |" in lines
    assert "| 5,000,000 | 100 B | read, at rest | 3.00 | 1,666,667 | 2,500,000 | 0.67 | 0.83 | >= 0.7: missed |" \
           in lines
    assert "| 5,000,000 | 100 B | read, materialized | 2.10 | 2,380,952 | 2,500,000 | 0.95 | - | >= 0.9: met |" \
           in lines
    assert "| 20,000,000 | 1024 B | write, broker | 10.00 | 2,000,000 | 4,000,000 | 0.50 | - | >= 0.7: missed |" \
           in lines
    assert not any("20,000,000 | 1024 B | write, at rest" in line for line in lines), "a run without at-rest steps"
    assert "| 5,000,000 | 100 B | 8 files, 92 MB in 4.0 s | 644 / 1169 / 1207 ms (40,000 records) |" in lines
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
