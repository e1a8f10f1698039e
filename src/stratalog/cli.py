"""The ``stratalog`` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import logging

import click

from stratalog import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="stratalog")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """stratalog: a durable, fast store for millions of append-only streams.

    Run `stratalog serve` for the Kafka-compatible broker (any Kafka client connects to 127.0.0.1:9092),
    or `stratalog demo` for a short end-to-end tour of the write-ahead log.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


@cli.group()
def bench() -> None:
    """Benchmarks: each prints a table and writes JSON with --json PATH."""


@cli.group()
def chaos() -> None:
    """Crash harnesses that count what they tried and what survived."""


def _register() -> None:
    # Subcommands live beside the code they drive; importing them here keeps `stratalog --help` fast
    # enough and the modules independent of each other.
    from stratalog.commands import register_all

    register_all(cli, bench=bench, chaos=chaos)


def main() -> None:
    _register()
    cli()
