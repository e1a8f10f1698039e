"""`stratalog bench catchup`'s tables, made from the run's JSON only: printed by the run, and as Markdown for
BENCHMARKS.md by `stratalog bench catchup --markdown-from JSON`."""

from __future__ import annotations

from typing import Any

from stratalog.bench.common import MIB_BYTES
from stratalog.bench.log_report import ms
from stratalog.bench.tables import FigureTable, Verdict, report


def produce_table(doc: dict[str, Any], phases: tuple[tuple[str, str], ...] = (
        ("A: idle", "idle"), ("B: during catch-up", "catchup"))) -> FigureTable:
    """Produce latency in each of ``phases`` (label, key in doc["produce"]), phase A idle: also the table of
    `bench compaction`."""
    p = doc["produce"]
    w = p["idle"]["windows_p99_ms"]
    out = FigureTable(f"Produce latency, ms, {p['producers']} producers, {p['rate_per_s']:,.0f} x 1 KiB appends/s in "
                      "all; 'due' from when a record was due, 'call' from append(). Idle p99 in "
                      f"{w['windows']} windows as long as phase B ({w['window_s']:.2f} s): median {w['median']:.2f}, "
                      f"min {w['min']:.2f}, max {w['max']:.2f}",
                      ("phase", "fsync", "seconds", "count", "due p50", "due p99", "due max", "call p50", "call p99",
                       "call max"), left=("phase", "fsync"))
    for name, key in phases:
        r = p[key]
        due, call = r["latency_from_due_ms"], r["latency_ms"]
        out.add(name, doc["fsync"], f"{r['seconds']:.1f}", f"{r['count']:,}", ms(due["p50"]), ms(due["p99"]),
                ms(due["max"]), ms(call["p50"]), ms(call["p99"]), ms(call["max"]))
    return out


def read_table(doc: dict[str, Any]) -> FigureTable:
    read, raw = doc["catchup_read"], doc["raw_ranged_get"]
    limit = doc["settings"]["cold_read_bytes_per_s_max"]
    held = "not held to a rate" if limit is None else f"held to {limit / MIB_BYTES:,.0f} MiB/s"
    out = FigureTable(f"Reading {read['block_bytes'] / MIB_BYTES:,.0f} MiB of cold blocks ({held}), and raw "
                      f"{raw['get_bytes'] >> 20} MiB ranged gets of the same bytes; object store: "
                      f"{doc['object_store'].split('?')[0]}, page cache: {doc['page_cache']}",
                      ("reader", "fsync", "seconds", "MiB/s", "payload MiB/s", "consumer CPU ms/MiB",
                       "fetches / gets"), left=("reader", "fsync"))
    out.add("consumer: fetch(max_bytes=1 MiB), while producing", doc["fsync"], f"{read['seconds']:.2f}",
            f"{read['mib_per_s']:,.1f}", f"{read['payload_mib_per_s']:,.1f}", f"{read['consumer_cpu_ms_per_mib']:.2f}",
            f"{read['fetches']:,}")
    alone = doc["catchup_read_alone"]
    out.add("consumer, no producers (phase C, for diagnosis)", doc["fsync"], f"{alone['seconds']:.2f}",
            f"{alone['mib_per_s']:,.1f}", f"{alone['payload_mib_per_s']:,.1f}",
            f"{alone['consumer_cpu_ms_per_mib']:.2f}", f"{alone['fetches']:,}")
    for name in ("sequential", "parallel"):
        r = raw[name]
        out.add(f"raw gets, {name} ({r['threads']} thread{'s' if r['threads'] > 1 else ''})", "-",
                f"{r['seconds']:.2f}", f"{r['mib_per_s']:,.1f}", "-", "-", f"{r['gets']:,}")
    return out


def targets_table(doc: dict[str, Any], title: str = "Targets: produce p99 in phase B over the idle windows' median "
                  "p99; the read's MiB/s over one thread's raw gets") -> FigureTable:
    out = FigureTable(title, ("figure", "fsync", "value", "target", ""), left=("figure", "fsync", "target"))
    for t in doc["targets"]:
        sign = ">=" if t["at_least"] else "<="
        out.add(t["name"], doc["fsync"], f"{t['figure']:.2f}", f"{sign} {t['bound']:g}",
                Verdict(bool(t["met"]) if t.get("applies", True) else None))
    return out


def tables(doc: dict[str, Any]) -> list[FigureTable]:
    return [produce_table(doc), read_table(doc), targets_table(doc)]


def markdown_report(doc: dict[str, Any]) -> str:
    return report(doc, tables(doc))
