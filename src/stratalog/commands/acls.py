"""``stratalog acls``: list, create and delete the ACLs of any Kafka broker (one with an authorizer on)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from stratalog.admin import acls as ops
from stratalog.admin.connect import admin_client
from stratalog.commands.admin_options import OUTPUT, connection, emit

_F = TypeVar("_F", bound=Callable[..., Any])


class _Spelled(click.Choice[str]):
    """A choice in any case, listed as Kafka spells its choices (click would list them in lower case)."""

    def get_invalid_choice_message(self, value: Any, ctx: click.Context | None) -> str:
        return f"{value!r} is not one of {', '.join(map(str, self.choices))} (in any case)."


#: --operation: Kafka's spelling, any case; a wrong one is a usage error that lists them.
OPERATION = _Spelled(list(ops.OPERATIONS), case_sensitive=False)
OPERATIONS_HELP = ", ".join(ops.OPERATIONS)


def _principal(_ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A principal is TYPE:NAME (User:alice, User:*), as Kafka writes it."""
    values = value if isinstance(value, tuple) else (value,)
    for principal in values:
        if principal is not None and (":" not in principal or principal.endswith(":")):
            raise click.BadParameter(f"{principal!r}: expected TYPE:NAME, such as User:alice or User:*", param=param)
    return value


def resource_options(command: _F) -> _F:
    """--topic, --group, --cluster and --transactional-id, passed on as ``resource``: (type, name) or None."""

    @click.option("--topic", default=None, metavar="NAME", help="A topic (a prefix with --pattern prefixed).")
    @click.option("--group", default=None, metavar="NAME", help="A consumer group (or a prefix).")
    @click.option("--cluster", is_flag=True, help="The cluster (creating topics, IdempotentWrite, ACLs, ...).")
    @click.option("--transactional-id", default=None, metavar="ID", help="A transactional id (or a prefix).")
    @functools.wraps(command)
    def wrapper(*args: Any, topic: str | None, group: str | None, cluster: bool, transactional_id: str | None,
                **kwargs: Any) -> Any:
        chosen = [(kind, name) for kind, name in (("topic", topic), ("group", group),
                                                  ("cluster", ops.CLUSTER_NAME if cluster else None),
                                                  ("transactional-id", transactional_id)) if name is not None]
        if len(chosen) > 1:
            raise click.UsageError("name one resource: --topic, --group, --cluster or --transactional-id")
        return command(*args, resource=chosen[0] if chosen else None, **kwargs)

    return wrapper  # type: ignore[return-value]


def filter_options(command: _F) -> _F:
    """The options that select ACLs (list, delete), passed on as ``selected``: an AclFilter."""

    @click.option("--principal", default=None, callback=_principal, metavar="TYPE:NAME",
                  help="Only ACLs of this principal (User:alice; User:* selects the ACLs for everyone, not every "
                       "principal's).")
    @click.option("--host", default=None, help="Only ACLs of this host (* selects the ACLs for every host).")
    @click.option("--operation", "operations", multiple=True, type=OPERATION, metavar="OPERATION",
                  help=f"Only ACLs of this operation (repeatable; {OPERATIONS_HELP}) [default: any].")
    @click.option("--permission", type=click.Choice(ops.PERMISSIONS, case_sensitive=False), default=None,
                  help="Only ACLs that allow, or only those that deny [default: either].")
    @click.option("--pattern", type=click.Choice(ops.FILTER_PATTERNS, case_sensitive=False), default="any",
                  show_default=True,
                  help="literal or prefixed: ACLs of that pattern type named exactly as given; any: either; match: "
                       "every ACL that applies to the resource named (its name, the * wildcard, its prefixes).")
    @resource_options
    @functools.wraps(command)
    def wrapper(*args: Any, principal: str | None, host: str | None, operations: tuple[str, ...],
                permission: str | None, pattern: str, resource: tuple[str, str] | None, **kwargs: Any) -> Any:
        selected = ops.AclFilter(principal=principal, host=host, operations=operations,
                                 resource_type=resource[0] if resource else None,
                                 resource_name=resource[1] if resource else None, pattern=pattern.lower(),
                                 permission=permission.lower() if permission else None)
        return command(*args, selected=selected, **kwargs)

    return wrapper  # type: ignore[return-value]


@click.group()
def acls() -> None:
    """ACLs: list, create, delete (Kafka's admin APIs: works with any Kafka broker whose authorizer is on).

    An ACL allows or denies a principal (User:alice, or User:* for everyone) one operation on a resource
    pattern: a topic, group or transactional id named literally (* for every one) or by prefix, or the
    cluster. Operations as Kafka's kafka-acls spells them, in any case: Read, Write, Create, Delete, Alter,
    Describe, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All.

    \b
    Examples:
      stratalog acls create --allow User:alice --operation Read --operation Describe --topic events
      stratalog acls create --allow User:etl --operation Write --topic raw- --pattern prefixed
      stratalog acls list --principal User:alice
      stratalog acls delete --principal User:alice --topic events
    """


@acls.command(name="list")
@filter_options
@connection
@OUTPUT
def list_acls(selected: ops.AclFilter, settings: dict[str, str], output: str) -> None:
    """Every ACL, or those the options select."""
    rows = ops.list_acls(admin_client(settings), selected, settings)
    emit(output, rows, [(None, rows)], empty="no ACLs")


@acls.command()
@click.option("--allow", "allow", multiple=True, callback=_principal, metavar="TYPE:NAME",
              help="Allow this principal (repeatable): User:alice, or User:* for everyone.")
@click.option("--deny", "deny", multiple=True, callback=_principal, metavar="TYPE:NAME",
              help="Deny this principal (repeatable); a deny wins over any allow.")
@click.option("--operation", "operations", multiple=True, type=OPERATION, required=True, metavar="OPERATION",
              help=f"An operation to allow or deny (repeatable): {OPERATIONS_HELP}; in any case.")
@click.option("--pattern", type=click.Choice(ops.PATTERNS, case_sensitive=False), default="literal",
              show_default=True,
              help="literal: the resource named (* for every one); prefixed: every resource whose name starts so.")
@click.option("--host", default=ops.WILDCARD, show_default=True, help="The client address the ACL applies to.")
@resource_options
@connection
@OUTPUT
def create(allow: tuple[str, ...], deny: tuple[str, ...], operations: tuple[str, ...], pattern: str, host: str,
           resource: tuple[str, str] | None, settings: dict[str, str], output: str) -> None:
    """Allow or deny principals operations on a topic, group, transactional id, or the cluster."""
    if not allow and not deny:
        raise click.UsageError("whom does the ACL concern? Give --allow or --deny with a principal (User:alice)")
    if resource is None:
        raise click.UsageError("on what? Give --topic, --group, --cluster or --transactional-id")
    rows = ops.create_acls(admin_client(settings), operations, resource[0], resource[1], allow=allow, deny=deny,
                           pattern=pattern.lower(), host=host)
    emit(output, rows, [(f"created {len(rows)} ACL{'s' if len(rows) != 1 else ''}", rows)])


@acls.command()
@filter_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (nor list the ACLs first).")
@connection
def delete(selected: ops.AclFilter, yes: bool, settings: dict[str, str]) -> None:
    """Delete every ACL the options select (at least one is needed: a principal, host, operation, permission
    or resource)."""
    if selected == ops.AclFilter(pattern=selected.pattern):
        raise click.UsageError("select the ACLs to delete: --principal, --host, --operation, --permission, --topic, "
                               "--group, --cluster or --transactional-id")
    admin = admin_client(settings)
    if not yes:
        found = ops.list_acls(admin, selected, settings)
        if not found:
            click.echo("nothing to delete: no ACL matches")
            return
        emit("table", found, [(None, found)])
        click.confirm("delete this ACL?" if len(found) == 1 else f"delete these {len(found)} ACLs?", abort=True)
    deleted = ops.delete_acls(admin, selected)
    click.echo(f"deleted {len(deleted)} ACL{'s' if len(deleted) != 1 else ''}")
