"""`stratalog bench streams`: the command-line shell around :mod:`stratalog.bench.streams`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from stratalog.bench.common import write_json
from stratalog.bench.streams import run_streams_bench
from stratalog.bench.streams_report import markdown_report, tables
from stratalog.commands.bench_log import bench_dir, make_console, print_machine, progress_bar

STREAMS_DEFAULT = 1_000_000
STREAMS_QUICK = 100_000
PHASES = 6


@click.command(name="streams")
@click.option("--streams", type=click.IntRange(min=1), default=None,
              help=f"Streams to create [default: {STREAMS_DEFAULT:,}; --quick: {STREAMS_QUICK:,}].")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the store goes [default: a temporary directory under the current directory].")
@click.option("--quick", is_flag=True, help=f"{STREAMS_QUICK:,} streams.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
@click.option("--markdown-from", "markdown_from", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="JSON", help="Measure nothing: print this run's tables (from --json) as Markdown.")
def streams(streams: int | None, dir_path: Path | None, quick: bool, json_path: Path | None,
            markdown_from: Path | None) -> None:
    """What many streams cost the stream store: time to create, touch, flush and reopen them, memory and
    disk per stream, against inserting the same names into a plain SQLite table."""
    if markdown_from is not None:
        click.echo(markdown_report(json.loads(markdown_from.read_text())))
        return
    console = make_console()
    count = streams or (STREAMS_QUICK if quick else STREAMS_DEFAULT)
    with bench_dir(dir_path) as target:
        print_machine(console, target)
        with progress_bar(console, PHASES) as bar:
            doc = run_streams_bench(target, count, bar)
    for t in tables(doc):
        console.print(t.rich())
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")
