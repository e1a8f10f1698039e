"""`stratalog bench wal-objects`: every target runs both phases and the table shows them."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from stratalog.bench.common import MIB_BYTES
from stratalog.bench.wal_objects import WalObjectsBenchPlan, run_wal_objects_bench
from stratalog.commands.bench_wal_objects import table
from stratalog.wal.config import ObjectWALConfig


def test_the_bench_measures_the_device_wal_and_the_object_wal_and_cleans_up(tmp_path: Path) -> None:
    plan = WalObjectsBenchPlan(dir_path=tmp_path, record_bytes=512, seconds=0.2, outstanding_max=64,
                               trim_interval_s=0.05, object_config=ObjectWALConfig(linger_s=0.001),
                               device_capacity_bytes=40 * MIB_BYTES)
    doc = run_wal_objects_bench(plan)
    names = [t["target"] for t in doc["targets"]]
    assert names == ["device WAL (file, fsync always)", "object WAL, local directory"]
    for target in doc["targets"]:
        for phase in ("serial", "flat_out"):
            figures = target[phase]
            assert figures["records"] > 0 and figures["latency_ms"]["samples"] == figures["records"]
            assert 0 < figures["latency_ms"]["p50"] <= figures["latency_ms"]["p99"] <= figures["latency_ms"]["max"]
    assert not (tmp_path / "device-wal").exists()
    assert [p for p in (tmp_path / "objects").rglob("*") if p.is_file()] == []  # the owner's objects deleted
    console = Console(width=140, record=True)
    console.print(table(doc))
    text = console.export_text()
    assert "object WAL, local directory" in text and "flat out" in text
