"""examples/clickstream/run.py, small: producers, a live broker, Spark streaming into Parquet and back into
the broker, and the example's own check that every acknowledged click is counted once per minute."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[1] / "examples" / "clickstream" / "run.py"
EVENTS, MINUTES = 3000, 5
#: The example starts a broker and a JVM and runs two streaming queries: generous for a busy machine.
TIMEOUT_S = 600
#: A row of the example's table: minute, produced, in Parquet, in topic, verdict.
ROW = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s+(ok|MISMATCH)$", re.MULTILINE)


def test_clickstream_example_counts_every_acknowledged_click_once_per_minute(tmp_path: Path) -> None:
    example = subprocess.Popen([sys.executable, str(EXAMPLE), "--events", str(EVENTS), "--minutes", str(MINUTES),
                                "--producers", "2", "--trigger-ms", "500", "--data-dir", str(tmp_path / "data"),
                                "--out", str(tmp_path / "out")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = example.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(example.pid, signal.SIGKILL)  # the example, its broker and its JVM
        stdout, stderr = example.communicate()
        pytest.fail(f"the example did not finish within {TIMEOUT_S} s:\n{stdout}\n{stderr[-5000:]}")
    assert example.returncode == 0, f"exit status {example.returncode}:\n{stdout}\n{stderr[-5000:]}"

    rows = ROW.findall(stdout)
    assert len(rows) == MINUTES, stdout
    for minute, produced, in_parquet, in_topic, verdict in rows:
        assert (in_parquet, in_topic, verdict) == (produced, produced, "ok"), \
            f"{minute}: {produced} produced, {in_parquet} in Parquet, {in_topic} in the topic"
    assert sum(int(r[1].replace(",", "")) for r in rows) == EVENTS
    assert "every minute matches" in stdout
    assert list((tmp_path / "out" / "clicks_per_minute").glob("*.parquet")), "no Parquet output"
