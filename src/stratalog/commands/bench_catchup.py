"""`stratalog bench catchup`: the command-line shell around :mod:`stratalog.bench.catchup`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from stratalog.bench.catchup import PHASES, CatchupBenchPlan, run_catchup_bench
from stratalog.bench.catchup_report import markdown_report, tables
from stratalog.bench.common import MIB_BYTES, write_json
from stratalog.commands.bench_log import bench_dir, make_console, print_load, print_machine, progress_bar
from stratalog.engine.config import StoreConfig
from stratalog.objects.uri import redact
from stratalog.wal.config import FsyncPolicy

BACKLOG_MIB_DEFAULT = 512
BACKLOG_MIB_QUICK = 64
SECONDS_DEFAULT = 30.0
SECONDS_QUICK = 10.0
RATE_PER_S_DEFAULT = 2000.0
PRODUCERS_DEFAULT = 4


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
    for t in tables(doc):
        console.print(t.rich())
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
@click.option("--markdown-from", "markdown_from", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="JSON", help="Measure nothing: print this run's tables (from --json) as Markdown.")
def catchup(backlog_mib: int | None, rate: float, producers: int, seconds: float | None,
            object_store: str | None, fsync: str, page_cache: str, reference_threads: int,
            cold_read_mib_per_s: float | None, dir_path: Path | None, quick: bool, json_path: Path | None,
            markdown_from: Path | None) -> None:
    """Produce latency while a consumer catches up on a cold backlog, and the catch-up read rate.

    Builds a backlog of 4 KiB records in objects, reopens the store (empty block cache), then runs
    producers at --rate: idle for --seconds (phase A), then while a consumer reads the whole backlog
    (phase B). Compares produce p99 in B with A (target <= 1.5x) and the catch-up rate with raw 1 MiB
    ranged gets of the same bytes (target >= 0.5x).
    """
    if markdown_from is not None:
        click.echo(markdown_report(json.loads(markdown_from.read_text())))
        return
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
