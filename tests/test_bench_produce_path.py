"""`stratalog bench produce-path` at its quick setting: every step timed on each core, and its report."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from stratalog.bench.produce_path import LOOP_RECORDS_QUICK, SHAPES
from stratalog.cli import cli


def test_every_step_of_every_shape_is_timed_and_reported(tmp_path: Path) -> None:
    out = tmp_path / "produce-path.json"
    result = CliRunner().invoke(cli, ["bench", "produce-path", "--quick", "--json", str(out), "--dir",
                                      str(tmp_path / "trace")], catch_exceptions=False, terminal_width=200)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["bench"] == "produce-path" and doc["core"] == "native (C)"
    assert (doc["repeats"], doc["loop_records"]) == (2, LOOP_RECORDS_QUICK), "--quick: shorter loops, said so"
    assert [(s["value_bytes"], s["records"]) for s in doc["shapes"]] == list(SHAPES)
    for shape in doc["shapes"]:
        assert len(shape["steps"]) == 7 and all(row["python_us"] > 0 for row in shape["steps"])
        # The recompression steps are apart: only topics with a compression.type codec take them.
        taken = [row for row in shape["steps"] if not row["optional"]]
        assert [row["step"] for row in shape["steps"] if row["optional"]] == [
            "compression.type=lz4: recompressed", "compression.type=zstd: recompressed"]
        assert shape["python_us"] == sum(row["python_us"] for row in taken)
        # The request's decoding and the record check are the steps with a compiled twin; the others are
        # timed once.
        assert [row["step"] for row in shape["steps"] if row["compiled_us"] is not None] == [
            "decode the request", "record check: every record walked"]
        assert shape["compiled_us"] > 0 and shape["python_us"] > 0
    # The trace through a broker in this process, with the WAL's compiled writer (its results taken by the
    # event loop, then by its reaper thread) and with its twin: every request of each pattern timed at
    # every hand-over.
    for key in ("trace", "trace_reaper", "trace_python_io"):
        trace = doc[key]
        assert [p["pattern"] for p in trace["patterns"]] == ["50 a second", "back to back"]
        for pattern in trace["patterns"]:
            assert pattern["samples"] == trace["requests"] == 50
            assert len(pattern["steps"]) == 5 and all(s["p50_ms"] > 0 for s in pattern["steps"])
            # Each request's time in the broker lies inside its round trip: so do their medians.
            assert 0 < pattern["broker_p50_ms"] <= pattern["round_trip_p50_ms"]
    assert "p50_ms" in trace["disk_reference"] or "error" in trace["disk_reference"]
    report = CliRunner().invoke(cli, ["bench", "produce-path", "--markdown-from", str(out)])
    assert report.exit_code == 0, report.output
    assert "| record check: every record walked |" in report.output
    assert "| + compression.type=zstd: recompressed |" in report.output
    assert "| the writer's thread wakes, writes and syncs on the device; the result back in Python (the event " \
           "loop's wake-up; or the reaper's, then the GIL) |" in report.output
    assert "per pattern, the WAL's blocks written by the compiled writer, the appends completed by the event " \
           "loop: each step's time" in report.output
    assert "the appends completed by its reaper thread (wal_completion_backstop_ms=0): each step's time" \
        in report.output
    assert "per pattern, the WAL's blocks written by Python I/O threads, the compiled writer's twin: each step's " \
           "time" in report.output
    assert f"at commit {doc['commit']}" in report.output
