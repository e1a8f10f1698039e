"""``stratalog users``: the SASL users of a broker's data directory (SCRAM credentials, also used by PLAIN).

The credentials live in the broker's metadata (DATA_DIR/broker.sqlite, or the PostgreSQL database of
``stratalog serve --metadata``), salted and hashed. These commands may run while the broker runs: it
reads the table at each login.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from stratalog.broker.credentials import (
    DEFAULT_ITERATIONS,
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    CredentialError,
    CredentialStore,
    ScramMechanism,
    check_user_name,
    make_credential,
)
from stratalog.engine.metadata_backends import MetadataUnavailableError, is_postgres_uri

_DATA_DIR = click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data"),
                         show_default=True, help="The broker's data directory.")
_METADATA = click.option("--metadata", metavar="postgresql://USER:PASSWORD@HOST:PORT/DATABASE",
                         envvar="STRATALOG_METADATA", default=None, show_envvar=True,
                         help="The broker's PostgreSQL metadata database (as `stratalog serve --metadata`); "
                              "then --data-dir is not used.")


def _store(data_dir: Path, create: bool, metadata: str | None) -> CredentialStore:
    if metadata is not None:
        if not is_postgres_uri(metadata):
            raise click.BadParameter("expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE", param_hint="--metadata")
        try:
            return CredentialStore(metadata)
        except MetadataUnavailableError as e:   # its message names the database without the password
            raise click.ClickException(str(e)) from None
    if not (data_dir / "broker.sqlite").exists() and not create:
        raise click.UsageError(f"{data_dir} holds no broker metadata (broker.sqlite): is --data-dir the one "
                               "`stratalog serve` uses?")
    data_dir.mkdir(parents=True, exist_ok=True)
    return CredentialStore(data_dir / "broker.sqlite")


@click.group()
def users() -> None:
    """SASL users: add, remove, list (PLAIN and SCRAM-SHA-256/512 logins).

    \b
    Example:
      stratalog users add alice --data-dir data        (asks for the password)
      echo "$PASSWORD" | stratalog users add alice --password-stdin
    """


@users.command()
@click.argument("name")
@_DATA_DIR
@_METADATA
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input (one line).")
@click.option("--mechanism", "mechanisms", multiple=True, type=click.Choice([m.sasl_name for m in ScramMechanism]),
              help="Store credentials for this SCRAM mechanism (repeatable; default: both).")
@click.option("--iterations", type=click.IntRange(ITERATIONS_MIN, ITERATIONS_MAX), default=DEFAULT_ITERATIONS,
              show_default=True, help="PBKDF2 iterations: more make a stolen table harder to crack and each "
                                      "login slower.")
def add(name: str, data_dir: Path, metadata: str | None, password_stdin: bool, mechanisms: tuple[str, ...],
        iterations: int) -> None:
    """Add user NAME, or set a new password. The password is never stored, only salted keys."""
    try:
        check_user_name(name)
    except CredentialError as e:
        raise click.BadParameter(str(e), param_hint="NAME") from None
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(f"password for {name}", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password must not be empty")
    store = _store(data_dir, create=True, metadata=metadata)
    try:
        chosen = [ScramMechanism.named(m) for m in mechanisms] or list(ScramMechanism)
        for mechanism in chosen:
            store.put(name, make_credential(mechanism, password, iterations))
    finally:
        store.close()
    click.echo(f"user {name}: {', '.join(m.sasl_name for m in chosen)} ({iterations} iterations)")


@users.command()
@click.argument("name")
@_DATA_DIR
@_METADATA
def remove(name: str, data_dir: Path, metadata: str | None) -> None:
    """Remove user NAME: its next login fails (connections open now stay open)."""
    store = _store(data_dir, create=False, metadata=metadata)
    try:
        removed = store.remove(name)
    finally:
        store.close()
    if not removed:
        raise click.UsageError(f"no user {name!r}")
    click.echo(f"user {name} removed")


@users.command(name="list")
@_DATA_DIR
@_METADATA
def list_users(data_dir: Path, metadata: str | None) -> None:
    """List users and their mechanisms."""
    store = _store(data_dir, create=False, metadata=metadata)
    try:
        found = store.users()
    finally:
        store.close()
    table = Table("user", "mechanisms", "iterations")
    for user, creds in found.items():
        table.add_row(user, ", ".join(m.sasl_name for m, _ in creds), ", ".join(str(i) for _, i in creds))
    Console().print(table if found else "no users")
