"""`stratalog bench streams` at a tiny scale: it creates, touches and reopens every stream and writes its
JSON."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from stratalog.cli import cli


def test_bench_streams_creates_touches_and_reopens_every_stream(tmp_path: Path) -> None:
    out = tmp_path / "streams.json"
    result = CliRunner().invoke(cli, ["bench", "streams", "--streams", "3000", "--dir", str(tmp_path / "run"),
                                      "--json", str(out)], catch_exceptions=False, terminal_width=200)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["bench"] == "streams" and doc["streams"] == 3000 and doc["sampled_streams"] == 1000
    assert set(doc["seconds"]) == {"create_s", "append_s", "flush_s", "read_sample_s", "close_s", "reopen_s"}
    assert all(v > 0 for v in doc["streams_per_s"].values())
    # One 58 B record per stream: metadata, object and manifest bytes stay within a few hundred bytes each.
    assert 100 < doc["disk_bytes_per_stream_without_wal"] < 4000
