"""`stratalog bench cluster`'s tables, made from the run's JSON only: printed by the run, and as Markdown for
BENCHMARKS.md by `stratalog bench cluster --markdown-from JSON`."""

from __future__ import annotations

from typing import Any

from stratalog.bench.tables import FigureTable, report


def throughput_table(doc: dict[str, Any]) -> FigureTable:
    s, cpus = doc["settings"], doc["machine"]["cpus"]
    out = FigureTable("Produce throughput, one confluent-kafka producer (idempotent, acks=all), "
                      f"{s['record_bytes']:,} B records over {s['partitions']} partitions, {s['seconds']:g} s after "
                      f"a {s['warm_up_s']:g} s warm-up; the brokers, PostgreSQL, SeaweedFS and the client share "
                      f"{cpus} cores",
                      ("brokers", "records/s", "MiB/s", "vs 1 broker", "failed"))
    base = doc["throughput"][0]["records_per_s"]
    for row in doc["throughput"]:
        out.add(str(row["brokers"]), f"{row['records_per_s']:,.0f}", f"{row['mib_per_s']:,.2f}",
                f"{row['records_per_s'] / base:.2f}x" if base else "-", f"{row['failed']:,}")
    return out


def latency_table(doc: dict[str, Any]) -> FigureTable:
    s = doc["settings"]
    out = FigureTable(f"Produce latency, ms, one broker, {s['latency_rate_per_s']:,.0f} x {s['record_bytes']:,} B "
                      "records/s (acks=all, linger.ms=0), from produce() to the acknowledgement",
                      ("WAL", "broker", "records", "p50", "p99", "max"), left=("WAL", "broker"))
    for row in doc["latency"]:
        lat = row["latency_ms"] or {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0}
        where = "object store (SeaweedFS)" if row["wal"] == "object" else "local device"
        out.add(where, f"`{row['serve']}`", f"{lat['samples']:,}", f"{lat['p50']:.1f}", f"{lat['p99']:.1f}",
                f"{lat['max']:.1f}")
    return out


def failover_table(doc: dict[str, Any]) -> FigureTable:
    f = doc["failover"]
    out = FigureTable("Failover of three brokers under a light load: from kill -9 of one until every partition has a "
                      "live leader answering for it (lease 3 s, renewed every 0.5 s, reconcile every 0.3 s)",
                      ("rounds", "min s", "p50 s", "max s", "produces failed"))
    out.add(str(len(f["rounds"])), f"{f['min_s']:.2f}", f"{f['p50_s']:.2f}", f"{f['max_s']:.2f}",
            f"{f['load_failed']:,}")
    return out


def tables(doc: dict[str, Any]) -> list[FigureTable]:
    return [throughput_table(doc), latency_table(doc), failover_table(doc)]


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, tables(doc))
