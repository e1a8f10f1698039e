"""``stratalog topics``: list, describe, create, delete and alter topics of any Kafka broker."""

from __future__ import annotations

from typing import Any

import click

from stratalog.admin import topics as ops
from stratalog.admin.connect import admin_client
from stratalog.commands.admin_options import OUTPUT, connection, emit, pairs


@click.group()
def topics() -> None:
    """Topics: list, describe, create, delete, alter (Kafka's admin APIs: works with any Kafka broker).

    \b
    Examples:
      stratalog topics create events --partitions 6 --config retention.ms=604800000
      stratalog topics describe events
      stratalog topics list -o json
    """


@topics.command(name="list")
@connection
@OUTPUT
def list_topics(settings: dict[str, str], output: str) -> None:
    """Every topic, with its partition count and replication factor."""
    rows = ops.list_topics(admin_client(settings))
    emit(output, rows, [(None, rows)], empty="no topics")


@topics.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--all-configs", is_flag=True, help="Every config with its value, not only those set on the topic.")
@connection
@OUTPUT
def describe(names: tuple[str, ...], all_configs: bool, settings: dict[str, str], output: str) -> None:
    """Partitions (leader, replicas, earliest and latest offset, records) and configs of each topic."""
    admin = admin_client(settings)
    docs = [ops.describe_topic(admin, name, all_configs) for name in names]
    tables: list[tuple[str | None, Any]] = []
    for doc in docs:
        tables.append((f"topic {doc['topic']}", doc["partitions"]))
        configs = [{"config": k, "value": v} for k, v in doc["configs"].items()]
        tables.append((f"configs of {doc['topic']}", configs))
    emit(output, docs, tables, empty="none set")


@topics.command()
@click.argument("name")
@click.option("--partitions", "-p", type=click.IntRange(1), default=1, show_default=True)
@click.option("--replication-factor", "-r", type=int, default=ops.REPLICATION_DEFAULT,
              help="Replicas of each partition [default: the broker's].")
@click.option("--config", "-c", "configs", multiple=True, metavar="NAME=VALUE",
              help="A topic config (repeatable): retention.ms=86400000, cleanup.policy=delete, ...")
@click.option("--if-not-exists", is_flag=True, help="Succeed when the topic exists already.")
@connection
def create(name: str, partitions: int, replication_factor: int, configs: tuple[str, ...], if_not_exists: bool,
           settings: dict[str, str]) -> None:
    """Create topic NAME."""
    created = ops.create_topic(admin_client(settings), name, partitions, replication_factor,
                               pairs(configs, "--config"), if_not_exists)
    click.echo(f"created topic {name} ({partitions} partitions)" if created else f"topic {name} exists")


@topics.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--if-exists", is_flag=True, help="Succeed for topics that do not exist.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@connection
def delete(names: tuple[str, ...], if_exists: bool, yes: bool, settings: dict[str, str]) -> None:
    """Delete topics NAMES and every record in them."""
    if not yes:
        click.confirm(f"delete {', '.join(names)} and every record in them?", abort=True)
    for name in ops.delete_topics(admin_client(settings), names, if_exists):
        click.echo(f"deleted topic {name}")


@topics.command()
@click.argument("name")
@click.option("--set", "set_configs", multiple=True, metavar="NAME=VALUE", help="Set a config (repeatable).")
@click.option("--delete-config", multiple=True, metavar="NAME", help="Return a config to its default (repeatable).")
@click.option("--partitions", type=click.IntRange(1), default=None, help="Raise the partition count to this.")
@connection
def alter(name: str, set_configs: tuple[str, ...], delete_config: tuple[str, ...], partitions: int | None,
          settings: dict[str, str]) -> None:
    """Change topic NAME's configs or raise its partition count."""
    if not set_configs and not delete_config and partitions is None:
        raise click.UsageError("nothing to change: give --set, --delete-config or --partitions")
    ops.alter_topic(admin_client(settings), name, pairs(set_configs, "--set"), delete_config, partitions)
    click.echo(f"altered topic {name}")
