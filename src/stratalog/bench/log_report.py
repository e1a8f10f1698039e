"""`stratalog bench log`'s tables, made from the run's JSON only: printed by the run, and as Markdown for
BENCHMARKS.md by `stratalog bench log --markdown-from JSON` (with `--plot`, latency by percentile as a PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratalog.bench.common import size_label
from stratalog.bench.tables import WHOLE_FIGURE_MIN, FigureTable, Verdict, report

LATENCY_KEYS = ("p50", "p90", "p99", "p99_9", "p99_99", "max")
LATENCY_HEADS = ("p50", "p90", "p99", "p99.9", "p99.99", "max")

#: The record size the latency target is set for ("Building a Distributed Log from Scratch, Part 1").
TARGET_RECORD_BYTES = 256


def ms(value: float) -> str:
    return f"{value:,.2f}" if value < WHOLE_FIGURE_MIN else f"{value:,.0f}"


def _target_text(result: dict[str, Any] | None) -> str:
    if result is None:
        return "-"
    sign = ">=" if result["at_least"] else "<="
    return f"{result['name']} {sign} {result['bound']:g}"


def _verdict(result: dict[str, Any] | None) -> Verdict | str:
    if result is None:
        return "-"
    return Verdict(bool(result["met"]) if result.get("applies", True) else None)


def latency_table(doc: dict[str, Any]) -> FigureTable:
    s = doc["settings"]
    out = FigureTable(f"Append latency, ms: one record per append at {s['rate_per_s']:g}/s for "
                      f"{s['seconds_per_size']:g} s per size, from append() to its future completing; ref: one 4 KiB "
                      "O_DIRECT + O_DSYNC write per record on the bare disk, same pattern",
                      ("record", "fsync", "count", *LATENCY_HEADS, "target", ""), left=("record", "fsync", "target"))
    goal = doc["targets"][0] if doc["targets"] else None
    for r in doc["latency"]:
        lat = r["latency_ms"]
        mine = goal if r["record_bytes"] == TARGET_RECORD_BYTES else None
        out.add(size_label(r["record_bytes"]), doc["fsync"], f"{r['count']:,}", *(ms(lat[k]) for k in LATENCY_KEYS),
                _target_text(mine), _verdict(mine))
    ref = doc["reference"]
    if ref is not None:
        lat = ref["latency_ms"]
        out.add("ref 4 KiB", "O_DSYNC", f"{ref['count']:,}", *(ms(lat[k]) for k in LATENCY_KEYS), "-", "-")
    return out


def throughput_table(doc: dict[str, Any]) -> FigureTable:
    out = FigureTable(f"Throughput, every append acknowledged: one record per append, up to "
                      f"{doc['settings']['in_flight_max']:,} in flight, timed to the last future; and one at a time "
                      "(append, wait, repeat)",
                      ("record", "fsync", "records", "seconds", "records/s", "MiB/s", "1-at-a-time rec/s",
                       "1-at-a-time MiB/s"), left=("record", "fsync"))
    for r in doc["throughput"]:
        one = r["one_at_a_time"]
        out.add(size_label(r["record_bytes"]), doc["fsync"], f"{r['records']:,}", f"{r['seconds']:.2f}",
                f"{r['records_per_s']:,.0f}", f"{r['mib_per_s']:,.1f}", f"{one['records_per_s']:,.0f}",
                f"{one['mib_per_s']:,.1f}")
    return out


def targets_table(doc: dict[str, Any]) -> FigureTable:
    out = FigureTable("Target, against the disk's own p99 in the same run", ("target", "measured", "disk p99",
                      "over the disk", ""), left=("target", "measured"))
    for t in doc["targets"]:
        ref = t.get("reference_p99_ms")
        out.add(_target_text(t), f"{t['figure']:.2f} ms", f"{ref:.2f} ms" if ref is not None else "-",
                f"{t['ratio_to_reference']:.2f}x" if "ratio_to_reference" in t else "-", _verdict(t))
    return out


def tables(doc: dict[str, Any]) -> list[FigureTable]:
    return [latency_table(doc), throughput_table(doc), targets_table(doc)]


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, tables(doc))


def plot_latency(doc: dict[str, Any], path: Path) -> None:
    """Append latency by percentile, one line per record size, the bare disk's in black."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    at = list(range(len(LATENCY_KEYS)))
    for r in doc["latency"]:
        ax.plot(at, [r["latency_ms"][k] for k in LATENCY_KEYS], marker="o", label=size_label(r["record_bytes"]))
    if doc["reference"] is not None:
        ax.plot(at, [doc["reference"]["latency_ms"][k] for k in LATENCY_KEYS], marker="o", color="black",
                label="disk: 4 KiB O_DSYNC write")
    for t in doc["targets"]:
        ax.axhline(t["bound"], color="tab:red", linestyle="dashed", linewidth=0.8, label="target: 256 B p99")
    ax.set_yscale("log")
    ax.set_xticks(at, LATENCY_HEADS)
    ax.set_ylabel("ms (log scale)")
    ax.set_title(f"Stream append latency, one record at {doc['settings']['rate_per_s']:g}/s, fsync={doc['fsync']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
