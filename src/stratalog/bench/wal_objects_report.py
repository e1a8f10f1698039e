"""`stratalog bench wal-objects`'s table, made from the run's JSON only: printed by the run, and as Markdown for
BENCHMARKS.md by `stratalog bench wal-objects --markdown-from JSON`."""

from __future__ import annotations

from typing import Any

from stratalog.bench.tables import FigureTable, report

PHASES = (("serial", "serial"), ("flat_out", "flat out"))


def targets_table(doc: dict[str, Any]) -> FigureTable:
    """Each WAL's two phases: rate, and latency from append to acknowledgement."""
    config = doc["object_wal_config"]
    out = FigureTable(f"{doc['record_bytes']:,} B records, {doc['seconds_per_phase']:g} s a phase (serial: one append "
                      f"at a time; flat out: {doc['outstanding_max']:,} in flight); object WAL: linger "
                      f"{config['linger_s'] * 1000:g} ms, {config['puts_in_flight_max']} puts in flight",
                      ("target", "phase", "records/s", "MiB/s", "p50 ms", "p99 ms", "max ms"), left=("target", "phase"))
    for target in doc["targets"]:
        for key, label in PHASES:
            figures = target[key]
            latency = figures["latency_ms"]
            out.add(target["target"], label, f"{figures['records_per_s']:,.0f}", f"{figures['mib_per_s']:,.1f}",
                    f"{latency['p50']:.2f}", f"{latency['p99']:.2f}", f"{latency['max']:.2f}")
    return out


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, [targets_table(doc)])
