"""`stratalog bench compaction`'s tables, made from the run's JSON only: printed by the run, and as Markdown
for BENCHMARKS.md by `stratalog bench compaction --markdown-from JSON`."""

from __future__ import annotations

from typing import Any

from stratalog.bench import catchup_report
from stratalog.bench.common import MIB_BYTES
from stratalog.bench.tables import FigureTable, report


def produce_table(doc: dict[str, Any]) -> FigureTable:
    return catchup_report.produce_table(doc, (("A: idle", "idle"), ("B: during a pass of compaction", "compacting")))


def pass_table(doc: dict[str, Any]) -> FigureTable:
    built, r, raw = doc["stream"], doc["produce"]["pass"], doc["raw_ranged_get"]
    limit = doc["settings"]["cleaner"]["read_bytes_per_s_max"]
    held = "reads not held to a rate" if limit is None else f"reads held to {limit / MIB_BYTES:,.0f} MiB/s"
    out = FigureTable(f"One pass of compaction over {built['block_bytes'] / MIB_BYTES:,.0f} MiB in {built['blocks']:,} "
                      f"blocks ({built['records']:,} x 1 KiB records over {built['keys']:,} keys; {held}), and raw "
                      "1 MiB ranged gets of the same blocks from one thread (local directory store, page cache "
                      "dropped first)",
                      ("", "seconds", "input MiB/s", "read MiB/s", "records kept", "written / input"), left=("",))
    out.add("compaction, while producing", f"{r['seconds']:.2f}", f"{r['input_mib_per_s']:,.1f}",
            f"{r['read_mib_per_s']:,.1f}", f"{r['records_kept']:,} of {r['records_read'] // 2:,}",
            f"{r['written_share']:.3f}")
    out.add("raw gets, sequential", f"{raw['seconds']:.2f}", f"{raw['mib_per_s']:,.1f}", "-", "-", "-")
    return out


def targets_table(doc: dict[str, Any]) -> FigureTable:
    return catchup_report.targets_table(doc, "Target: produce p99 during the pass over the idle windows' median p99")


def tables(doc: dict[str, Any]) -> list[FigureTable]:
    return [produce_table(doc), pass_table(doc), targets_table(doc)]


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, tables(doc))
