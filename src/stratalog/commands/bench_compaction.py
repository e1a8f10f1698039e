"""`stratalog bench compaction`: the command-line shell around :mod:`stratalog.bench.compaction`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from stratalog.bench.common import MIB_BYTES, write_json
from stratalog.bench.compaction import CompactionBenchPlan, run_compaction_bench
from stratalog.bench.compaction_report import markdown_report, tables
from stratalog.commands.bench_log import bench_dir, make_console, print_load, print_machine, progress_bar
from stratalog.engine.config import CleanerBounds
from stratalog.wal.config import FsyncPolicy

STREAM_MIB_DEFAULT = 256
STREAM_MIB_QUICK = 32
KEYS_DEFAULT = 10_000
SECONDS_DEFAULT = 60.0
SECONDS_QUICK = 10.0
RATE_PER_S_DEFAULT = 2000.0
PRODUCERS_DEFAULT = 4
#: The cleaner's own default read bound, as a broker runs it.
READ_MIB_PER_S_DEFAULT = (CleanerBounds().read_bytes_per_s_max or 0) / MIB_BYTES
#: Phases the progress bar counts: build, reference, settle, idle, compaction.
PHASES = 5


@click.command(name="compaction")
@click.option("--stream-mib", type=click.IntRange(min=1), default=None,
              help=f"Size of the stream to compact [default: {STREAM_MIB_DEFAULT}; --quick: {STREAM_MIB_QUICK}].")
@click.option("--keys", type=click.IntRange(min=1), default=KEYS_DEFAULT, show_default=True,
              help="Distinct keys in it (each written stream-size / keys / 1 KiB times).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=RATE_PER_S_DEFAULT,
              show_default=True, help="1 KiB appends per second, all producers together.")
@click.option("--producers", type=click.IntRange(1, 64), default=PRODUCERS_DEFAULT, show_default=True,
              help="Producer threads, each appending to its own stream.")
@click.option("--seconds", type=click.FloatRange(min=1), default=None,
              help=f"Length of phase A (idle) [default: {SECONDS_DEFAULT:g}; --quick: {SECONDS_QUICK:g}].")
@click.option("--read-mib-per-s", type=click.FloatRange(min=0), default=READ_MIB_PER_S_DEFAULT, show_default=True,
              help="The cleaner's read bound ([store.cleaner] read_bytes_per_s_max); 0: none.")
@click.option("--cleaner", "cleaner_where", type=click.Choice(["process", "thread"]), default="process",
              show_default=True, help="Where a pass decodes records: a process of its own ([store.cleaner] "
              "own_process, the default) or the store's thread.")
@click.option("--fsync", type=click.Choice([p.value for p in FsyncPolicy]), default=FsyncPolicy.ALWAYS.value,
              show_default=True, help="When appends are acknowledged; printed beside every figure.")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the store goes [default: a temporary directory under the current directory].")
@click.option("--quick", is_flag=True, help=f"A {STREAM_MIB_QUICK} MiB stream and a {SECONDS_QUICK:g} s idle phase.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
@click.option("--markdown-from", "markdown_from", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="JSON", help="Measure nothing: print this run's tables (from --json) as Markdown.")
def compaction(stream_mib: int | None, keys: int, rate: float, producers: int, seconds: float | None,
               read_mib_per_s: float, cleaner_where: str, fsync: str, dir_path: Path | None, quick: bool,
               json_path: Path | None, markdown_from: Path | None) -> None:
    """How fast log compaction cleans a stream, and what a pass costs producers.

    Builds a stream of keyed 1 KiB records in objects, reopens the store, then runs producers at --rate:
    idle for --seconds (phase A), then while one pass of the cleaner compacts the stream (phase B, with the
    cleaner's bounds as a broker runs it). Reports the pass's input MiB/s beside raw 1 MiB ranged gets of
    the same blocks, and compares produce p99 in B with A (target <= 1.5x).
    """
    if markdown_from is not None:
        click.echo(markdown_report(json.loads(markdown_from.read_text())))
        return
    console = make_console()
    with bench_dir(dir_path) as target_dir:
        size = stream_mib if stream_mib is not None else (STREAM_MIB_QUICK if quick else STREAM_MIB_DEFAULT)
        plan = CompactionBenchPlan(
            backlog_bytes=size * MIB_BYTES, keys=keys, rate_per_s=rate, producers=producers,
            seconds=seconds if seconds is not None else (SECONDS_QUICK if quick else SECONDS_DEFAULT),
            dir_path=target_dir, fsync=FsyncPolicy(fsync),
            cleaner=CleanerBounds(read_bytes_per_s_max=int(read_mib_per_s * MIB_BYTES) or None,
                                  own_process=cleaner_where == "process"))
        print_machine(console, target_dir)
        with progress_bar(console, PHASES) as bar:
            doc = run_compaction_bench(plan, bar)
    print_load(console, doc)
    for t in tables(doc):
        console.print(t.rich())
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")
