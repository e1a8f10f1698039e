"""``stratalog produce``: a console producer. Records from standard input or a file, one a line."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from stratalog.admin.console_clients import produce as produce_records
from stratalog.admin.record_format import Format, Record, RecordFormatError, parse_line
from stratalog.commands.admin_options import connection, pairs


@click.command()
@click.argument("topic")
@click.option("--file", "-f", "path", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Read records from this file [default: standard input].")
@click.option("--format", "fmt", type=click.Choice([f.value for f in Format]), default="text", show_default=True,
              help="text: each line a value (UTF-8); hex: the same in hexadecimal; json: each line an object "
                   "with key, value, headers, partition, timestamp_ms (see `stratalog consume --format json`).")
@click.option("--key-separator", "-K", default=None, metavar="SEP",
              help="Each text or hex line is KEY<SEP>VALUE (a line without SEP is an error).")
@click.option("--header", "-H", "headers", multiple=True, metavar="NAME=VALUE",
              help="A header added to every record (repeatable).")
@click.option("--partition", "-p", type=click.IntRange(0), default=None,
              help="Produce to this partition [default: by key hash, or spread when there is no key].")
@connection
def produce(topic: str, path: Path | None, fmt: str, key_separator: str | None, headers: tuple[str, ...],
            partition: int | None, settings: dict[str, str]) -> None:
    """Produce records to TOPIC, one per input line; each is acknowledged by every in-sync replica (acks=all,
    idempotent) before the command ends. Exits 1 if any record failed.

    \b
    Examples:
      echo hello | stratalog produce events
      stratalog produce events -K : < users.txt                        (lines key:value)
      stratalog produce events --format json -f records.jsonl
    """
    added = tuple((name, value.encode()) for name, value in pairs(headers, "--header").items())
    stream: IO[str] = path.open(encoding="utf-8") if path is not None else sys.stdin
    chosen = Format(fmt)
    with _progress(path) as progress:
        task = progress.add_task("producing", total=path.stat().st_size if path is not None else None)

        def records() -> Iterator[Record]:
            for number, line in enumerate(stream, 1):
                progress.advance(task, len(line.encode()))
                try:
                    yield parse_line(line.rstrip("\r\n"), chosen, key_separator)
                except RecordFormatError as e:
                    raise click.ClickException(f"line {number}: {e}") from None

        outcome = produce_records(settings, topic, records(), partition, added)
    for error in outcome.errors:
        click.echo(f"error: {error}", err=True)
    click.echo(f"produced {outcome.acknowledged} record{'' if outcome.acknowledged == 1 else 's'} to {topic}"
               + (f"; {outcome.failed} failed" if outcome.failed else ""), err=True)
    if outcome.failed:
        sys.exit(1)


def _progress(path: Path | None) -> Progress:
    """A progress bar over the file's bytes, on a terminal's standard error only (never into a pipe)."""
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                    transient=True, disable=path is None or not sys.stderr.isatty())
