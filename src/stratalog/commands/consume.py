"""``stratalog consume``: a console consumer. Records of a topic printed one a line."""

from __future__ import annotations

import click

from stratalog.admin.console_clients import Start
from stratalog.admin.console_clients import consume as consume_records
from stratalog.admin.record_format import Fields, Format, Record, render
from stratalog.commands.admin_options import connection, timestamp_ms


@click.command()
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="Start at each partition's earliest record [default: its end].")
@click.option("--offset", type=click.IntRange(0), default=None, help="Start at this offset of each partition.")
@click.option("--from-time", default=None, metavar="TIME",
              help="Start at each partition's first record at or after TIME (ISO 8601, or ms since 1970).")
@click.option("--partition", "-p", type=click.IntRange(0), default=None, help="Read only this partition.")
@click.option("--group", "-g", default=None,
              help="Read as a member of this consumer group, from its committed offsets, committing as it reads.")
@click.option("--max-messages", "-n", type=click.IntRange(1), default=None, help="Stop after this many records.")
@click.option("--idle-timeout-s", type=click.FloatRange(0, min_open=True), default=None,
              help="Stop when no record came for this long [default: run until interrupted].")
@click.option("--format", "fmt", type=click.Choice([f.value for f in Format]), default="text", show_default=True,
              help="text: UTF-8 (other bytes escaped); hex; json: one object a line with every field, lossless.")
@click.option("--print-key", is_flag=True, help="Show each record's key (text and hex formats).")
@click.option("--print-headers", is_flag=True, help="Show each record's headers as NAME:VALUE,...")
@click.option("--print-timestamp", is_flag=True, help="Show each record's timestamp (ms since 1970).")
@click.option("--print-offset", is_flag=True, help="Show each record's PARTITION:OFFSET.")
@connection
def consume(topic: str, from_beginning: bool, offset: int | None, from_time: str | None, partition: int | None,
            group: str | None, max_messages: int | None, idle_timeout_s: float | None, fmt: str, print_key: bool,
            print_headers: bool, print_timestamp: bool, print_offset: bool, settings: dict[str, str]) -> None:
    """Print the records of TOPIC, one a line, with the fields asked for separated by tabs.

    \b
    Examples:
      stratalog consume events --from-beginning -n 10 --print-key
      stratalog consume events --from-time 2026-11-29T08:00 --format json
      stratalog consume events --group audit --idle-timeout-s 5
    """
    if sum([from_beginning, offset is not None, from_time is not None]) > 1:
        raise click.UsageError("choose one of --from-beginning, --offset, --from-time")
    if group is not None and (offset is not None or from_time is not None or partition is not None):
        raise click.UsageError("--group reads from the group's committed offsets: --offset, --from-time and "
                               "--partition are for reading without a group")
    start = Start(beginning=from_beginning, offset=offset,
                  timestamp_ms=None if from_time is None else timestamp_ms(from_time, "--from-time"))
    chosen = Format(fmt)
    fields = Fields(offset=print_offset, timestamp=print_timestamp, key=print_key, headers=print_headers)

    def show(record: Record) -> None:
        click.echo(render(record, chosen, fields))

    try:
        read = consume_records(settings, topic, show, start, group, partition, max_messages, idle_timeout_s)
    except KeyboardInterrupt:
        return
    click.echo(f"consumed {read} record{'' if read == 1 else 's'}", err=True)
