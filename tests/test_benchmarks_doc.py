"""BENCHMARKS.md's tables are the `--markdown-from` renderings of the JSON kept in bench/results/, verbatim:
a rerun whose JSON is committed without its tables (or a table edited by hand) fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stratalog.cli import cli

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
QUEUE_RUNS = ("queues-put", "queues-put-many", "queues-100k-put", "queues-100k-put-many", "queues-10k-peers")
SPARK_RUNS = ("spark-5m-100", "spark-5m-1k", "spark-20m-100", "spark-20m-1k")
SECTIONS = {
    "wal": ("wal",), "wal-objects": ("wal-objects",), "log": ("log",), "catchup": ("catchup",),
    "compaction": ("compaction",),
    "streams": ("streams",), "queues": QUEUE_RUNS, "kafka": ("kafka",), "produce-path": ("produce-path",),
    "abuse": ("abuse",), "spark": SPARK_RUNS,
    "cluster": ("cluster",),
}


@pytest.mark.parametrize("bench", sorted(SECTIONS))
def test_benchmarks_md_holds_the_tables_of_the_kept_json(bench: str) -> None:
    args = ["bench", bench]
    for run in SECTIONS[bench]:
        args += ["--markdown-from", str(RESULTS / f"{run}.json")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rendered = result.output.strip()
    assert rendered in (ROOT / "BENCHMARKS.md").read_text(), (
        f"BENCHMARKS.md's {bench} tables differ from `stratalog {' '.join(args)}`: paste its output there")
