"""`stratalog bench compaction`: a short run prints its tables, writes its JSON, cleans what it built, and
renders the same tables again from the JSON."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from stratalog.cli import cli


def test_a_short_run_measures_a_pass_and_the_produce_latency_around_it(tmp_path: Path) -> None:
    out = tmp_path / "compaction.json"
    result = CliRunner().invoke(cli, ["bench", "compaction", "--stream-mib", "2", "--keys", "100", "--seconds", "1",
                                      "--rate", "200", "--producers", "2", "--dir", str(tmp_path / "run"),
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    built, cleaned = doc["stream"], doc["produce"]["pass"]
    assert built["records"] == 2048 and built["keys"] == 100
    assert cleaned["records_kept"] == 100, "one record a key"
    assert cleaned["records_read"] == 2 * 2048, "each record read twice: the key map, then the rewrite"
    assert cleaned["input_mib_per_s"] > 0 and doc["raw_ranged_get"]["mib_per_s"] > 0
    assert doc["produce"]["idle"]["count"] > 0 and doc["produce"]["compacting"]["count"] >= 0
    assert [t["name"] for t in doc["targets"]] == ["produce p99 compacting / idle"]
    assert not list((tmp_path / "run").iterdir()), "the run's store is deleted"
    rendered = CliRunner().invoke(cli, ["bench", "compaction", "--markdown-from", str(out)])
    assert rendered.exit_code == 0 and "One pass of compaction over 2 MiB" in rendered.output
