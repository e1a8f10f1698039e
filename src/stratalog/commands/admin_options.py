"""What the admin commands (topics, groups, produce, consume, acls, quotas) share: how they connect, how
they print (a table, or JSON for scripts), and Kafka's errors as the command's own error."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from stratalog.admin.connect import BOOTSTRAP_DEFAULT, AdminError, client_settings, parse_pairs

_F = TypeVar("_F", bound=Callable[..., Any])

OUTPUT = click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True,
                      help="A table for people, or JSON for scripts.")


def connection(command: _F) -> _F:
    """Adds --bootstrap, --command-config and -X, and passes the command ``settings`` (librdkafka's names)
    in their place; an AdminError the command raises becomes its error message and exit status 1."""

    @click.option("--bootstrap", "-b", envvar="STRATALOG_BOOTSTRAP", show_envvar=True, default=None,
                  metavar="HOST:PORT[,HOST:PORT]", help=f"The brokers to connect to [default: {BOOTSTRAP_DEFAULT}].")
    @click.option("--command-config", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
                  help="A client properties file (name=value lines, librdkafka's names: security.protocol, "
                       "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, ...).")
    @click.option("-X", "extra", multiple=True, metavar="NAME=VALUE",
                  help="One client setting (repeatable), over the properties file: -X security.protocol=SSL.")
    @functools.wraps(command)
    def wrapper(*args: Any, bootstrap: str | None, command_config: Path | None, extra: tuple[str, ...],
                **kwargs: Any) -> Any:
        try:
            settings = client_settings(bootstrap, command_config, parse_pairs(extra))
            return command(*args, settings=settings, **kwargs)
        except AdminError as e:
            failure = str(e)
        # Raised outside the handler: nothing keeps the failed call's frames (and their Kafka clients, whose
        # threads would go on calling a broker that is gone) alive through the exception's context.
        raise click.ClickException(failure)

    return wrapper  # type: ignore[return-value]


def pairs(values: Sequence[str], option: str) -> dict[str, str]:
    """--config NAME=VALUE options as a dict, or a usage error naming the option."""
    try:
        return parse_pairs(values, option)
    except AdminError as e:
        raise click.UsageError(str(e)) from None


def timestamp_ms(text: str, option: str) -> int:
    """A time given as milliseconds since the epoch or as an ISO 8601 date and time (local time unless it
    names its zone)."""
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected milliseconds since 1970 or an ISO 8601 time such as "
                                 "2026-11-29T08:00:00+00:00", param_hint=option) from None


def emit(output: str, doc: Any, tables: Sequence[tuple[str | None, Sequence[dict[str, Any]]]],
         empty: str = "none") -> None:
    """Print ``doc`` as JSON, or each (title, rows) of ``tables`` as a table (``empty`` when it has no rows)."""
    if output == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    console = Console()
    for title, rows in tables:
        if not rows:
            console.print(f"{title}: {empty}" if title else empty)
            continue
        table = Table(*rows[0].keys(), title=title, title_justify="left")
        for row in rows:
            table.add_row(*(_cell(v) for v in row.values()))
        console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
