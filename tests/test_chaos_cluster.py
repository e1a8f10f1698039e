"""`stratalog chaos cluster`: kill -9 of brokers of a three-broker cluster under Kafka clients, counted.

A short run (two kills) through the command line: it must exit 0, print the table, and write JSON whose
counts say nothing acknowledged was lost or written twice, no committed offset went back, and each kill
was followed by every partition served again; and, of the transactional load beside it, that every input
its loop's group committed is in the output once, read_committed, that transactions were committed and
aborted, and that no aborted record was read. Everything it started is gone once it returns, and once a
SIGTERM stops it mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from stratalog.chaos.cluster import FAILOVER_S_MAX, MUST_BE_ZERO
from stratalog.commands.chaos_cluster import cluster
from waiting import wait_until

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
    # The transactional load ran the whole time: committed and aborted transactions both, and what its loop's
    # group committed is in the output once (the must-be-zero counts above say nothing else is).
    assert figures["txn_loop_committed"] > 0 and figures["txn_aborter_committed"] > 0
    assert figures["txn_aborter_aborted"] > 0 and figures["txn_aborted_records_in_log"] > 0
    assert figures["txn_outputs"] == figures["txn_inputs_committed"] > 0
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


def _processes_naming(path: Path) -> list[int]:
    """Processes whose command line names ``path`` (the brokers' data directories and weed's are in it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass   # gone meanwhile
    return found


@pytest.mark.slow
def test_sigterm_mid_run_stops_and_removes_everything_it_started(tmp_path: Path) -> None:
    work = tmp_path / "work"
    process = subprocess.Popen(
        [sys.executable, "-c", "from stratalog.cli import main; main()", "chaos", "cluster", "--minutes", "5",
         "--dir", str(work)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    assert process.stdout is not None
    pump = threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True)
    pump.start()
    try:
        # Mid-run: the three brokers and weed run (the load starts as soon as they serve).
        wait_until(lambda: len(_processes_naming(work)) >= 4, lambda: "the brokers and weed:\n" + "".join(lines),
                   timeout_s=120)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) != 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        pump.join(timeout=30)
        process.stdout.close()
    assert _processes_naming(work) == []
    assert list(work.iterdir()) == []
    # Nothing left of its process group (brokers, kafka-python, short commands), not even unreaped.
    assert _group(process.pid) == []


def _group(pgid: int) -> list[str]:
    """The processes of a process group: pid, state and command line of each."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:
                    found.append(f"{entry.name} {fields[0]} {(entry / 'cmdline').read_bytes()[:200]!r}")
            except OSError:
                pass   # gone meanwhile
    return found
