"""`stratalog bench streams`'s tables, made from the run's JSON only: printed by the run, and as Markdown for
BENCHMARKS.md by `stratalog bench streams --markdown-from JSON`."""

from __future__ import annotations

from typing import Any

from stratalog.bench.common import MIB_BYTES
from stratalog.bench.tables import FigureTable, report

STEPS = (("create", "create_streams (one commit)"), ("append", "append one record to each, all acknowledged"),
         ("flush", "flush: every stream to objects, one upload"), ("reopen", "open again (a fresh process)"))


def steps_table(doc: dict[str, Any]) -> FigureTable:
    n = doc["streams"]
    out = FigureTable(f"{n:,} streams in one store, one {doc['record_bytes']} B record each; reference: the same "
                      "names inserted as rows of a plain SQLite table in the same run",
                      ("step", "seconds", "streams/s", "over SQLite's insert"), left=("step",))
    ref_s = doc["reference"]["sqlite_insert_s"]
    for step, label in STEPS:
        seconds = doc["seconds"][f"{step}_s"]
        out.add(label, f"{seconds:.2f}", f"{doc['streams_per_s'][step]:,.0f}", f"{seconds / ref_s:.1f}x")
    out.add(f"read back {doc['sampled_streams']:,} streams", f"{doc['seconds']['read_sample_s']:.2f}", "-", "-")
    out.add("reference: the names as rows of a plain SQLite table", f"{ref_s:.2f}", f"{n / ref_s:,.0f}", "1.0x")
    return out


def costs_table(doc: dict[str, Any]) -> FigureTable:
    rss, per, gc = doc["rss_bytes"], doc["rss_bytes_per_stream"], doc["gc"]
    out = FigureTable("What a stream costs", ("cost", "figure"), left=("cost",))
    out.add("memory of a process that only opened the store, per stream",
            f"{per['reopened']:,.0f} B ({(rss['reopen_child_after'] - rss['reopen_child_before']) / MIB_BYTES:,.0f} "
            "MiB in all)")
    out.add("memory grown while creating them, per stream (names and handles included)", f"{per['created']:,.0f} B")
    out.add("disk per stream, besides the preallocated WAL", f"{doc['disk_bytes_per_stream_without_wal']:,.0f} B")
    out.add("a full garbage collection with the store open",
            f"{gc['full_collection_ms']:,.0f} ms ({gc['tracked_objects']:,} tracked objects)")
    out.add("the same after gc.freeze()", f"{gc['full_collection_after_freeze_ms']:,.1f} ms")
    return out


def tables(doc: dict[str, Any]) -> list[FigureTable]:
    return [steps_table(doc), costs_table(doc)]


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, tables(doc))
