"""`stratalog bench compaction`'s tables, made from the run's JSON only: printed by the run, and as Markdown
for BENCHMARKS.md by `stratalog bench compaction --markdown-from JSON`."""

from __future__ import annotations

from typing import Any

from stratalog.bench.common import MIB_BYTES
from stratalog.bench.log_report import ms
from stratalog.bench.tables import FigureTable, Verdict, report


def produce_table(doc: dict[str, Any]) -> FigureTable:
    p = doc["produce"]
    w = p["idle"]["windows_p99_ms"]
    out = FigureTable(f"Produce latency, ms, {p['producers']} producers, {p['rate_per_s']:,.0f} x 1 KiB appends/s in "
                      "all; 'due' from when a record was due, 'call' from append(). Idle p99 in "
                      f"{w['windows']} windows as long as phase B ({w['window_s']:.2f} s): median {w['median']:.2f}, "
                      f"min {w['min']:.2f}, max {w['max']:.2f}",
                      ("phase", "fsync", "seconds", "count", "due p50", "due p99", "due max", "call p50", "call p99",
                       "call max"), left=("phase", "fsync"))
    for name, key in (("A: idle", "idle"), ("B: during a pass of compaction", "compacting")):
        r = p[key]
        due, call = r["latency_from_due_ms"], r["latency_ms"]
        out.add(name, doc["fsync"], f"{r['seconds']:.1f}", f"{r['count']:,}", ms(due["p50"]), ms(due["p99"]),
                ms(due["max"]), ms(call["p50"]), ms(call["p99"]), ms(call["max"]))
    return out


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
    out = FigureTable("Target: produce p99 during the pass over the idle windows' median p99",
                      ("figure", "fsync", "value", "target", ""), left=("figure", "fsync", "target"))
    for t in doc["targets"]:
        sign = ">=" if t["at_least"] else "<="
        out.add(t["name"], doc["fsync"], f"{t['figure']:.2f}", f"{sign} {t['bound']:g}",
                Verdict(bool(t["met"]) if t.get("applies", True) else None))
    return out


def tables(doc: dict[str, Any]) -> list[FigureTable]:
    return [produce_table(doc), pass_table(doc), targets_table(doc)]


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, tables(doc))
