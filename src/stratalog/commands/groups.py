"""``stratalog groups``: list, describe (with lag per partition), reset the offsets of, and delete consumer
groups of any Kafka broker."""

from __future__ import annotations

from typing import Any

import click

from stratalog.admin import groups as ops
from stratalog.admin.connect import admin_client
from stratalog.commands.admin_options import OUTPUT, connection, emit, timestamp_ms


@click.group()
def groups() -> None:
    """Consumer groups: list, describe with lag, reset-offsets, delete (any Kafka broker).

    \b
    Examples:
      stratalog groups describe billing
      stratalog groups reset-offsets billing --topic events --to-earliest            (shows the plan)
      stratalog groups reset-offsets billing --topic events:0,1 --to-datetime 2026-11-29T08:00 --execute
    """


@groups.command(name="list")
@connection
@OUTPUT
def list_groups(settings: dict[str, str], output: str) -> None:
    """Every consumer group, with its state."""
    rows = ops.list_groups(admin_client(settings))
    emit(output, rows, [(None, rows)], empty="no groups")


@groups.command()
@click.argument("names", nargs=-1, required=True)
@connection
@OUTPUT
def describe(names: tuple[str, ...], settings: dict[str, str], output: str) -> None:
    """State, members, and per partition the committed offset, latest offset and lag of each group."""
    admin = admin_client(settings)
    docs = [ops.describe_group(admin, name) for name in names]
    summary = [{"group": d["group"], "state": d["state"], "coordinator": d["coordinator"],
                "assignor": d["assignor"], "members": len(d["members"])} for d in docs]
    tables: list[tuple[str | None, list[dict[str, Any]]]] = [(None, summary)]
    for doc in docs:
        tables.append((f"offsets of {doc['group']}", doc["partitions"]))
        tables.append((f"members of {doc['group']}", doc["members"]))
    emit(output, docs, tables)


@groups.command(name="reset-offsets")
@click.argument("name")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P,P...]",
              help="A topic (or some of its partitions) to reset; repeatable [default: every partition the "
                   "group has committed].")
@click.option("--to-earliest", is_flag=True, help="To each partition's earliest offset.")
@click.option("--to-latest", is_flag=True, help="To each partition's end: skip everything not yet read.")
@click.option("--to-offset", type=click.IntRange(0), default=None, help="To this offset (clamped to what exists).")
@click.option("--to-datetime", default=None, metavar="TIME",
              help="To the first record at or after TIME (ISO 8601, or ms since 1970).")
@click.option("--shift-by", type=int, default=None, help="Move each committed offset by N (negative: back).")
@click.option("--execute", is_flag=True, help="Commit the new offsets; without it the plan is only shown.")
@connection
@OUTPUT
def reset_offsets(name: str, topics: tuple[str, ...], to_earliest: bool, to_latest: bool, to_offset: int | None,
                  to_datetime: str | None, shift_by: int | None, execute: bool, settings: dict[str, str],
                  output: str) -> None:
    """Move group NAME's committed offsets (the group must have no running consumer)."""
    target = ops.ResetTarget(earliest=to_earliest, latest=to_latest, offset=to_offset, shift_by=shift_by,
                             timestamp_ms=None if to_datetime is None else timestamp_ms(to_datetime, "--to-datetime"))
    admin = admin_client(settings)
    rows = ops.plan_reset(admin, name, ops.partitions_of(admin, name, topics), target)
    if execute:
        ops.reset_offsets(admin, name, rows)
    title = f"offsets of {name} {'reset' if execute else 'planned (not changed: add --execute)'}"
    emit(output, {"group": name, "executed": execute, "partitions": rows}, [(title, rows)])


@groups.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@connection
def delete(names: tuple[str, ...], yes: bool, settings: dict[str, str]) -> None:
    """Delete groups NAMES and their committed offsets (each group must be empty)."""
    if not yes:
        click.confirm(f"delete groups {', '.join(names)} and their committed offsets?", abort=True)
    for name in ops.delete_groups(admin_client(settings), names):
        click.echo(f"deleted group {name}")
