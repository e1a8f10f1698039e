"""`stratalog bench streams`: the command-line shell around :mod:`stratalog.bench.streams`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stratalog.bench.common import MIB_BYTES, write_json
from stratalog.bench.streams import run_streams_bench
from stratalog.commands.bench_log import bench_dir, make_console, print_machine, progress_bar, table

STREAMS_DEFAULT = 1_000_000
STREAMS_QUICK = 100_000
PHASES = 6


def _report(doc: dict[str, Any]) -> Any:
    n = doc["streams"]
    out = table(f"{n:,} streams in one store: one {doc['record_bytes']} B record each", ("step", "seconds",
                "streams/s"), left=("step",))
    per_s = doc["streams_per_s"]
    for step, label in (("create", "create_streams (one commit)"), ("append", "append one record to each, "
                        "all acknowledged"), ("flush", "flush: every stream to objects, one upload"),
                        ("reopen", "open again (a fresh process)")):
        out.add_row(label, f"{doc['seconds'][f'{step}_s']:.2f}", f"{per_s[step]:,.0f}")
    out.add_row(f"read back {doc['sampled_streams']:,} streams", f"{doc['seconds']['read_sample_s']:.2f}", "-")
    ref = doc["reference"]
    out.add_row("reference: the names as rows of a plain SQLite table", f"{ref['sqlite_insert_s']:.2f}",
                f"{n / ref['sqlite_insert_s']:,.0f}")
    return out


@click.command(name="streams")
@click.option("--streams", type=click.IntRange(min=1), default=None,
              help=f"Streams to create [default: {STREAMS_DEFAULT:,}; --quick: {STREAMS_QUICK:,}].")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the store goes [default: a temporary directory under the current directory].")
@click.option("--quick", is_flag=True, help=f"{STREAMS_QUICK:,} streams.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
def streams(streams: int | None, dir_path: Path | None, quick: bool, json_path: Path | None) -> None:
    """What many streams cost the stream store: time to create, touch, flush and reopen them, memory and
    disk per stream, against inserting the same names into a plain SQLite table."""
    console = make_console()
    count = streams or (STREAMS_QUICK if quick else STREAMS_DEFAULT)
    with bench_dir(dir_path) as target:
        print_machine(console, target)
        with progress_bar(console, PHASES) as bar:
            doc = run_streams_bench(target, count, bar)
    console.print(_report(doc))
    rss, per = doc["rss_bytes"], doc["rss_bytes_per_stream"]
    console.print(f"memory: {per['reopened']:,.0f} B per stream in a process that opened the store "
                  f"({(rss['reopen_child_after'] - rss['reopen_child_before']) / MIB_BYTES:,.0f} MiB in all); "
                  f"{per['created']:,.0f} B per stream grown while creating them here")
    gc = doc["gc"]
    console.print(f"garbage collection: a full collection took {gc['full_collection_ms']:,.0f} ms with the store "
                  f"open ({gc['tracked_objects']:,} tracked objects), {gc['full_collection_after_freeze_ms']:,.1f} "
                  "ms after gc.freeze()")
    console.print(f"disk: {doc['disk_bytes'] / MIB_BYTES:,.0f} MiB in all, "
                  f"{doc['disk_bytes_per_stream_without_wal']:,.0f} B per stream besides the preallocated WAL; "
                  f"create_streams took {doc['reference']['create_over_sqlite']:.1f}x the plain SQLite insert")
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")
