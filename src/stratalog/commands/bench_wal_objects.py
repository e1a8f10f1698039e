"""`stratalog bench wal-objects`: the command-line shell around :mod:`stratalog.bench.wal_objects`."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from stratalog.bench.common import write_json
from stratalog.bench.wal_objects import WalObjectsBenchPlan, run_wal_objects_bench
from stratalog.bench.wal_objects_report import markdown_report, targets_table
from stratalog.wal.config import ObjectWALConfig

#: Output to a file or pipe is laid out this wide, so no column is cut.
CONSOLE_WIDTH_PIPED = 140


@click.command(name="wal-objects")
@click.option("--s3", "s3_uri", default=None, metavar="URI",
              help="Also run the object WAL on this S3 API store: s3://bucket/prefix?endpoint=URL"
                   "&access_key=ID&secret_key=KEY (objects go under wal/bench-<random>/ and are deleted after).")
@click.option("--record-bytes", type=click.IntRange(1, 8 << 20), default=4096, show_default=True,
              help="Size of every record.")
@click.option("--seconds", type=click.FloatRange(min=0.1), default=3.0, show_default=True,
              help="Length of each phase (two per target).")
@click.option("--outstanding", "outstanding_max", type=click.IntRange(1, 1 << 16), default=1024, show_default=True,
              help="Appends in flight in the flat-out phase.")
@click.option("--linger-ms", type=click.FloatRange(0, 1000), default=ObjectWALConfig().linger_s * 1000,
              show_default=True, help="The object WAL's linger_s, in milliseconds.")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the device WAL and the local object store go [default: a temporary directory under "
                   "the current one, so on its disk rather than a tmpfs /tmp].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
@click.option("--markdown-from", "markdown_from", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="JSON", help="Measure nothing: print this run's table (from --json) as Markdown.")
def wal_objects(s3_uri: str | None, record_bytes: int, seconds: float, outstanding_max: int, linger_ms: float,
                dir_path: Path | None, json_path: Path | None, markdown_from: Path | None) -> None:
    """The object WAL (local directory store, and an S3 API store with --s3) against the device WAL.

    Per target: one append at a time (the latency of a lone record), then flat out with --outstanding
    appends in flight (throughput, and latency under load), trimming every 0.5 s as uploads do.
    """
    if markdown_from is not None:
        click.echo(markdown_report(json.loads(markdown_from.read_text())))
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=CONSOLE_WIDTH_PIPED)
    made_dir = dir_path is None
    target_dir = Path(tempfile.mkdtemp(prefix=".stratalog-bench-", dir=Path.cwd())) if made_dir else dir_path
    assert target_dir is not None
    plan = WalObjectsBenchPlan(dir_path=target_dir, record_bytes=record_bytes, seconds=seconds,
                               outstanding_max=outstanding_max, s3_uri=s3_uri,
                               object_config=ObjectWALConfig(linger_s=linger_ms / 1000))
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        doc = run_wal_objects_bench(plan, lambda what: console.print(f"[dim]{what}[/]"))
    finally:
        if made_dir:
            shutil.rmtree(target_dir, ignore_errors=True)
    console.print(table(doc))
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")


def table(doc: dict[str, Any]) -> Table:
    """The run's table for the console (the Markdown one is made from the same rows)."""
    made: Table = targets_table(doc).rich()
    return made
