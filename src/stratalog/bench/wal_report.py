"""`stratalog bench wal`'s tables, made from the run's JSON only: printed by the run, and as Markdown for
BENCHMARKS.md by `stratalog bench wal --markdown-from JSON` (with `--plot`, the ratios as a PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratalog.bench.common import MIB_BYTES, size_label
from stratalog.bench.tables import WHOLE_FIGURE_MIN, FigureTable, Verdict, report


def _target(result: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in result["targets"] if t["name"] == name), None)


def _target_text(target: dict[str, Any] | None) -> str:
    if target is None:
        return "-"
    sign = ">=" if target["at_least"] else "<="
    bound = target["bound"]
    shown = f"{bound:,.0f}" if bound >= WHOLE_FIGURE_MIN else f"{bound:g}"
    return f"{target['name']} {sign} {shown}"


def _verdict(target: dict[str, Any] | None) -> Verdict | str:
    return "-" if target is None else Verdict(bool(target["met"]))


def throughput_table(doc: dict[str, Any]) -> FigureTable:
    rate = doc["settings"]["rate_mib_per_s"]
    how = f"at {rate:g} MiB/s" if rate else "flat out"
    out = FigureTable(f"WAL throughput, {how}, against the reference (plain O_DIRECT writes of the WAL's block "
                      "size, taking turns with it)",
                      ("record", "fsync", "records/s", "MiB/s", "IOPS", "write KiB", "ref MiB/s", "ratio", "target",
                       ""), left=("record", "fsync", "target"))
    for r in doc["results"]:
        target = _target(r, "records/s") or _target(r, "ratio")
        out.add(size_label(r["record_bytes"]), doc["fsync"], f"{r['records_per_s']:,.0f}", f"{r['mib_per_s']:,.1f}",
                f"{r['iops']:,.0f}", f"{r['block_bytes_mean'] / 1024:,.0f}", f"{r['reference_mib_per_s']:,.1f}",
                f"{r['ratio_to_reference']:.2f}", _target_text(target), _verdict(target))
    return out


def latency_table(doc: dict[str, Any]) -> FigureTable:
    out = FigureTable("WAL append latency, ms: flat p99 is the flat-out run's; the rest at half its rate; disk p99: "
                      "the reference at the same writes/s, acknowledged in order",
                      ("record", "fsync", "flat p99", "half rec/s", "avg", "p50", "p99", "max", "disk p99", "target",
                       ""), left=("record", "fsync", "target"))
    for r in doc["results"]:
        half = r["half_rate_latency_ms"]
        target = _target(r, "p99 ms")
        out.add(size_label(r["record_bytes"]), doc["fsync"], f"{r['latency_ms']['p99']:,.1f}",
                f"{r['half_rate_records_per_s']:,.0f}", f"{half['avg']:.2f}", f"{half['p50']:.2f}",
                f"{half['p99']:.2f}", f"{half['max']:.2f}",
                f"{r['half_rate_reference']['latency_ms_in_order']['p99']:.2f}", _target_text(target),
                _verdict(target))
    return out


def recovery_table(doc: dict[str, Any]) -> FigureTable:
    rec = doc["recovery"]
    out = FigureTable(f"WAL recovery: open + recover() of a full log of {rec['record_bytes'] // 1024} KiB records, "
                      f"against a plain O_DIRECT sequential read (best of {len(rec['seconds_runs'])} and "
                      f"{len(rec['reference_mib_per_s_runs'])})",
                      ("WAL MiB", "fsync", "records", "seconds", "MiB/s", "ref MiB/s", "ratio", "target", ""),
                      left=("fsync", "target"))
    target = rec["targets"][0]
    out.add(f"{rec['wal_bytes'] / MIB_BYTES:,.0f}", doc["fsync"], f"{rec['records']:,}", f"{rec['seconds']:.2f}",
            f"{rec['mib_per_s']:,.1f}", f"{rec['reference_mib_per_s']:,.1f}", f"{rec['ratio_to_reference']:.2f}",
            _target_text(target), _verdict(target))
    return out


def tables(doc: dict[str, Any]) -> list[FigureTable]:
    return [throughput_table(doc), latency_table(doc), recovery_table(doc)]


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, tables(doc))


def plot_ratios(doc: dict[str, Any], path: Path) -> None:
    """Per record size, the WAL's MiB/s over the reference's flat out, and its half-rate p99 beside the
    disk's in-order p99: the two figures the targets are about."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [size_label(r["record_bytes"]) for r in doc["results"]]
    at = list(range(len(labels)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.bar(at, [r["ratio_to_reference"] for r in doc["results"]], color="tab:blue")
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xticks(at, labels)
    left.set_ylabel("WAL MiB/s over the bare disk's")
    left.set_title("Flat out (same run, taking turns)")
    width = 0.4
    right.bar([x - width / 2 for x in at], [r["half_rate_latency_ms"]["p99"] for r in doc["results"]], width,
              label="WAL p99")
    right.bar([x + width / 2 for x in at],
              [r["half_rate_reference"]["latency_ms_in_order"]["p99"] for r in doc["results"]], width,
              label="disk p99, same writes/s", color="black")
    bounds = {t["bound"] for r in doc["results"] for t in r["targets"] if t["name"] == "p99 ms"}
    for bound in bounds:
        right.axhline(bound, color="tab:red", linestyle="dashed", linewidth=0.8)
    right.set_yscale("log")
    right.set_xticks(at, labels)
    right.set_ylabel("ms (log scale)")
    right.set_title("Append p99 at half the flat-out rate; dashed: target")
    right.legend(fontsize="small", loc="best", framealpha=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
