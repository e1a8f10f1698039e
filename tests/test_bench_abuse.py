"""`stratalog bench abuse` at a tiny scale: every phase measured, the broker up throughout, nothing left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stratalog.bench.abuse_hostile import FAMILIES

LATENCY_KEYS = {"avg", "p50", "p99", "p999", "max", "samples"}
CONNECTIONS = 20
PHASE_S = 2.0
RATE_PER_S = 100.0
#: Ten phases of 2 s, each with a hostile process spawned and stopped, and the broker's start.
RUN_TIMEOUT_S = 300


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.slow
def test_bench_abuse_measures_every_phase_and_the_broker_stays_up(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    json_path = tmp_path / "bench-abuse.json"
    run = subprocess.run(
        [sys.executable, "-c", "from stratalog.cli import main; main()", "bench", "abuse", "--connections",
         str(CONNECTIONS), "--phase-s", str(PHASE_S), "--rate", str(RATE_PER_S), "--ramp-s", "10",
         "--data-dir", str(data_dir), "--json", str(json_path)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(json_path.read_text())
    assert [p["name"] for p in doc["phases"]] == ["baseline", *FAMILIES, "all", "baseline after"]
    for phase in doc["phases"]:
        assert set(phase["produce_ms"]) == LATENCY_KEYS, phase["name"]
        assert phase["produce_ms"]["samples"] == phase["sent"] == round(PHASE_S * RATE_PER_S), phase["name"]
        assert phase["error_count"] == 0 and not phase["aborted"], phase
        assert phase["broker_up"] and phase["answer_ms"] is not None, phase["name"]
        assert phase["broker_rss_mib_peak"] > 0 and phase["broker_sockets_peak"] > 0
        assert phase["p99_over_baseline"] > 0
        if phase["connections"]:
            assert phase["connections"] == CONNECTIONS
            assert phase["hostile"]["ramp"]["connected"] == CONNECTIONS, phase["hostile"]
            report = phase["hostile"]["report"]
            assert report.get("stopped") == "told to stop" and report["task_failures"] == 0, (phase["name"], report)
            assert sum(f["opened"] for f in report["families"].values()) >= CONNECTIONS
    by_name = {p["name"]: p for p in doc["phases"]}
    for family in ("oversize", "garbage"):  # each refused frame closes its connection
        counted = by_name[family]["hostile"]["report"]["families"][family]
        assert counted["closed_by_broker"] > 0 and counted["not_closed"] == 0, counted
    assert by_name["fetch_all"]["hostile"]["report"]["families"]["fetch_all"]["read_bytes"] > 0
    assert by_name["baseline"]["p99_over_baseline"] == 1.0
    assert doc["broker"]["alive_at_end"] and doc["broker"]["rss_mib_hwm"] > 0
    assert {t["met"] in (True, False) for t in doc["targets"]} == {True}
    report = subprocess.run(
        [sys.executable, "-c", "from stratalog.cli import main; main()", "bench", "abuse", "--report", str(json_path)],
        capture_output=True, text=True, timeout=60, check=True)
    assert "| baseline | 0 |" in report.stdout and "| target |" in report.stdout
    assert not _processes_mentioning(str(data_dir))
