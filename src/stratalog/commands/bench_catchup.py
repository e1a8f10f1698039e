"""`stratalog bench catchup`: the command-line shell around :mod:`stratalog.bench.catchup`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from stratalog.bench.catchup import PHASES, CatchupBenchPlan, run_catchup_bench
from stratalog.bench.common import MIB_BYTES, write_json
from stratalog.commands.bench_log import (
    bench_dir,
    make_console,
    ms,
    print_load,
    print_machine,
    progress_bar,
    table,
    target_text,
    verdict,
)
from stratalog.engine.config import StoreConfig
from stratalog.objects.uri import redact
from stratalog.wal.config import FsyncPolicy

BACKLOG_MIB_DEFAULT = 512
BACKLOG_MIB_QUICK = 64
SECONDS_DEFAULT = 30.0
SECONDS_QUICK = 10.0
RATE_PER_S_DEFAULT = 2000.0
PRODUCERS_DEFAULT = 4


def _produce_table(doc: dict[str, Any]) -> Table:
    p = doc["produce"]
    out = table(f"Produce latency (ms): {p['producers']} producers, {p['rate_per_s']:,.0f} x 1 KiB appends/s "
                "in all, one record per append; 'due' counts from when the record was due, 'call' from "
                "append()", ("phase", "fsync", "seconds", "count", "due p50", "due p99", "due max",
                             "call p50", "call p99", "call max"), left=("phase", "fsync"))
    for name, key in (("A: idle", "idle"), ("B: during catch-up", "catchup")):
        r = p[key]
        due, call = r["latency_from_due_ms"], r["latency_ms"]
        out.add_row(name, doc["fsync"], f"{r['seconds']:.1f}", f"{r['count']:,}", ms(due["p50"]),
                    ms(due["p99"]), ms(due["max"]), ms(call["p50"]), ms(call["p99"]), ms(call["max"]))
    return out


def _print_idle_windows(console: Console, doc: dict[str, Any]) -> None:
    idle = doc["produce"]["idle"]
    w = idle["windows_p99_ms"]
    console.print(f"idle p99 (from due) in {w['windows']} windows of {w['window_s']:.2f} s (phase B's length): "
                  f"median {w['median']:.2f} ms, min {w['min']:.2f}, max {w['max']:.2f}; over all of phase A "
                  f"{idle['latency_from_due_ms']['p99']:.2f} ms. The target compares phase B with the median.")


def _read_table(doc: dict[str, Any]) -> Table:
    read, raw = doc["catchup_read"], doc["raw_ranged_get"]
    limit = doc["settings"]["cold_read_bytes_per_s_max"]
    held = "no limit" if limit is None else f"held to {limit / MIB_BYTES:,.0f} MiB/s"
    out = table(f"Catch-up read of a cold backlog ({read['block_bytes'] / MIB_BYTES:,.0f} MiB of blocks, cold "
                f"reads {held}) vs the object store's raw {raw['get_bytes'] >> 20} MiB ranged gets of the same "
                f"bytes; object store: {doc['object_store'].split('?')[0]}, page cache: {doc['page_cache']}",
                ("reader", "fsync", "seconds", "MiB/s", "payload MiB/s", "consumer CPU ms/MiB", "fetches / gets"),
                left=("reader", "fsync"))
    out.add_row("consumer: fetch(max_bytes=1 MiB), while producing", doc["fsync"], f"{read['seconds']:.2f}",
                f"{read['mib_per_s']:,.1f}", f"{read['payload_mib_per_s']:,.1f}",
                f"{read['consumer_cpu_ms_per_mib']:.2f}", f"{read['fetches']:,}")
    alone = doc["catchup_read_alone"]
    out.add_row("consumer, no producers (phase C, for diagnosis)", doc["fsync"], f"{alone['seconds']:.2f}",
                f"{alone['mib_per_s']:,.1f}", f"{alone['payload_mib_per_s']:,.1f}",
                f"{alone['consumer_cpu_ms_per_mib']:.2f}", f"{alone['fetches']:,}")
    for name in ("sequential", "parallel"):
        r = raw[name]
        out.add_row(f"raw gets, {name} ({r['threads']} thread{'s' if r['threads'] > 1 else ''})", "-",
                    f"{r['seconds']:.2f}", f"{r['mib_per_s']:,.1f}", "-", "-", f"{r['gets']:,}")
    return out


def _targets_table(doc: dict[str, Any]) -> Table:
    out = table("Targets (produce p99: phase B over the median p99 of idle windows as long as phase B)",
                ("figure", "fsync", "value", "target", ""), left=("figure", "fsync", "target"))
    for t in doc["targets"]:
        out.add_row(t["name"], doc["fsync"], f"{t['figure']:.2f}", target_text(t), verdict(t))
    return out


def _report(console: Console, doc: dict[str, Any], json_path: Path | None) -> None:
    backlog = doc["backlog"]
    print_load(console, doc)
    console.print(f"backlog: {backlog['records']:,} x 4 KiB records in {backlog['blocks']:,} blocks of "
                  f"{backlog['objects']:,} objects, built and flushed at {backlog['build_mib_per_s']:,.0f} MiB/s "
                  f"(fsync={doc['fsync']}); read from a freshly opened store (empty block cache)")
    settled = doc["settle"]
    console.print(f"settle before phase A: {settled['seconds']:.1f} s until 4 KiB synced writes took <= 5 ms "
                  f"{'' if settled['quiet'] else '[red](never quiet: figures disturbed)[/] '}"
                  f"(slowest {settled['slowest_write_ms']:.1f} ms)")
    console.print(_produce_table(doc))
    _print_idle_windows(console, doc)
    console.print(_read_table(doc))
    console.print(_targets_table(doc))
    for t in doc["targets"]:
        if not t["applies"]:
            console.print(f"[yellow]{t['why_not']}[/]")
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")


@click.command(name="catchup")
@click.option("--backlog-mib", type=click.IntRange(min=1), default=None,
              help=f"Size of the cold backlog [default: {BACKLOG_MIB_DEFAULT}; --quick: {BACKLOG_MIB_QUICK}].")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=RATE_PER_S_DEFAULT,
              show_default=True, help="1 KiB appends per second, all producers together.")
@click.option("--producers", type=click.IntRange(1, 64), default=PRODUCERS_DEFAULT, show_default=True,
              help="Producer threads, each appending to its own stream.")
@click.option("--seconds", type=click.FloatRange(min=1), default=None,
              help=f"Length of phase A (idle) [default: {SECONDS_DEFAULT:g}; --quick: {SECONDS_QUICK:g}].")
@click.option("--object-store", "object_store", default=None, metavar="URI",
              help="Object store URI (s3://bucket/prefix?endpoint=...) [default: a local directory in the "
                   "store's data directory]. The run uses a sub-prefix of it and deletes it afterwards.")
@click.option("--fsync", type=click.Choice([p.value for p in FsyncPolicy]), default=FsyncPolicy.ALWAYS.value,
              show_default=True, help="When appends are acknowledged; printed beside every figure.")
@click.option("--page-cache", type=click.Choice(["drop", "keep"]), default="drop", show_default=True,
              help="Local object store: drop its files from the page cache before each read phase (reads "
                   "go to the disk) or keep them (reads cost CPU only).")
@click.option("--reference-threads", type=click.IntRange(2, 64), default=StoreConfig().block_cache_io_threads,
              show_default=True, help="Threads of the parallel raw-get reference (the block cache's I/O "
                                      "threads by default).")
@click.option("--cold-read-mib-per-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Hold cold reads to this rate (StoreConfig.cold_read_bytes_per_s_max) [default: no limit]: "
                   "trades catch-up speed for produce latency.")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the store goes [default: a temporary directory under the current directory].")
@click.option("--quick", is_flag=True, help=f"A {BACKLOG_MIB_QUICK} MiB backlog and a {SECONDS_QUICK:g} s idle "
                                            "phase.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
def catchup(backlog_mib: int | None, rate: float, producers: int, seconds: float | None,
            object_store: str | None, fsync: str, page_cache: str, reference_threads: int,
            cold_read_mib_per_s: float | None, dir_path: Path | None, quick: bool, json_path: Path | None) -> None:
    """Produce latency while a consumer catches up on a cold backlog, and the catch-up read rate.

    Builds a backlog of 4 KiB records in objects, reopens the store (empty block cache), then runs
    producers at --rate: idle for --seconds (phase A), then while a consumer reads the whole backlog
    (phase B). Compares produce p99 in B with A (target <= 1.5x) and the catch-up rate with raw 1 MiB
    ranged gets of the same bytes (target >= 0.5x).
    """
    console = make_console()
    with bench_dir(dir_path) as target_dir:
        backlog = backlog_mib if backlog_mib is not None else (BACKLOG_MIB_QUICK if quick else BACKLOG_MIB_DEFAULT)
        plan = CatchupBenchPlan(
            backlog_bytes=backlog * MIB_BYTES,
            rate_per_s=rate,
            producers=producers,
            seconds=seconds if seconds is not None else (SECONDS_QUICK if quick else SECONDS_DEFAULT),
            dir_path=target_dir,
            object_store_uri=object_store,
            fsync=FsyncPolicy(fsync),
            reference_threads=reference_threads,
            drop_page_cache=page_cache == "drop",
            cold_read_bytes_per_s_max=None if cold_read_mib_per_s is None else int(cold_read_mib_per_s * MIB_BYTES),
        )
        print_machine(console, target_dir)
        if object_store:
            console.print(f"object store: {redact(object_store)}")
        if plan.fsync is not FsyncPolicy.ALWAYS:
            console.print(f"[yellow]fsync={plan.fsync.value}: acknowledged records are not durable; these "
                          "figures are not comparable with fsync=always[/]")
        with progress_bar(console, PHASES) as bar:
            doc = run_catchup_bench(plan, bar)
    _report(console, doc, json_path)
