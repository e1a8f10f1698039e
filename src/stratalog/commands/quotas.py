"""``stratalog quotas``: describe and alter the client quotas of any Kafka broker (users, client ids)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from stratalog.admin import quotas as ops
from stratalog.commands.admin_options import OUTPUT, connection, emit, pairs

_F = TypeVar("_F", bound=Callable[..., Any])


def entity_options(command: _F) -> _F:
    """--user, --default-user, --client-id and --default-client-id, passed on as ``entity``."""

    @click.option("--user", default=None, metavar="NAME", help="The quotas of this user (its SASL name).")
    @click.option("--default-user", is_flag=True, help="The default user's: for users without quotas of their own.")
    @click.option("--client-id", default=None, metavar="ID", help="The quotas of this client id (with --user: of "
                                                                  "that user's clients with this id).")
    @click.option("--default-client-id", is_flag=True,
                  help="The default client id's: for client ids without quotas of their own.")
    @functools.wraps(command)
    def wrapper(*args: Any, user: str | None, default_user: bool, client_id: str | None, default_client_id: bool,
                **kwargs: Any) -> Any:
        if user is not None and default_user:
            raise click.UsageError("choose --user or --default-user, not both")
        if client_id is not None and default_client_id:
            raise click.UsageError("choose --client-id or --default-client-id, not both")
        return command(*args, entity=ops.entity_of(user, default_user, client_id, default_client_id), **kwargs)

    return wrapper  # type: ignore[return-value]


@click.group()
def quotas() -> None:
    """Client quotas: describe, alter (Kafka's DescribeClientQuotas and AlterClientQuotas: any Kafka broker).

    A quota limits a user, a client id, or a user's clients with one id: producer_byte_rate and
    consumer_byte_rate in bytes per second (and request_rate per second on stratalog; Kafka's
    request_percentage elsewhere). The default user or client id covers those without quotas of their own.

    \b
    Examples:
      stratalog quotas alter --user alice --set producer_byte_rate=1048576 --set consumer_byte_rate=2097152
      stratalog quotas alter --default-user --set consumer_byte_rate=10485760
      stratalog quotas alter --user alice --delete consumer_byte_rate
      stratalog quotas describe --user alice -o json
    """


@quotas.command()
@entity_options
@connection
@OUTPUT
def describe(entity: ops.Entity, settings: dict[str, str], output: str) -> None:
    """The quotas of the entity named (of a user: also of that user with each client id), or of every
    entity when none is."""
    described = ops.describe_quotas(settings, entity)
    rows = ops.rows(described)
    emit(output, described, [(None, rows)], empty="no quotas")


@quotas.command()
@entity_options
@click.option("--set", "set_values", multiple=True, metavar="KEY=VALUE",
              help="Set a quota (repeatable): producer_byte_rate=1048576 (bytes/s), consumer_byte_rate=..., ...")
@click.option("--delete", "delete_keys", multiple=True, metavar="KEY",
              help="Remove a quota of the entity (repeatable): the next one that applies takes over.")
@connection
def alter(entity: ops.Entity, set_values: tuple[str, ...], delete_keys: tuple[str, ...],
          settings: dict[str, str]) -> None:
    """Set and delete the quotas of one entity: a user, a client id, or both (each may be the default)."""
    if not entity:
        raise click.UsageError("whose quotas? Give --user or --default-user, --client-id or --default-client-id, "
                               "or a user and a client id")
    if not set_values and not delete_keys:
        raise click.UsageError("nothing to change: give --set KEY=VALUE or --delete KEY")
    given = pairs(set_values, "--set")
    values = {}
    for key, text in given.items():
        try:
            values[key] = float(text)
        except ValueError:
            values[key] = math.nan
        if not math.isfinite(values[key]):
            raise click.BadParameter(f"{key}={text}: expected a number", param_hint="--set")
    ops.alter_quotas(settings, entity, values, delete_keys)
    changes = [f"set {k}={text}" for k, text in given.items()] + [f"deleted {k}" for k in delete_keys]
    click.echo(f"altered the quotas of {ops.entity_text(entity)}: {', '.join(changes)}")
