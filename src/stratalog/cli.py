"""The ``stratalog`` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping
from typing import Any

import click

from stratalog import __version__
from stratalog.commands import BENCH, CHAOS, TOP
from stratalog.commands.log_format import TEXT_FORMAT


class LazyGroup(click.Group):
    """A group whose subcommands are imported when first looked up, from ``lazy``: name -> "module:attr"."""

    def __init__(self, *args: Any, lazy: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy and cmd_name not in self.commands:
            module, attribute = self._lazy[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, lazy=TOP,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="stratalog")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """stratalog: a durable, fast store for millions of append-only streams.

    Run `stratalog serve` for the Kafka-compatible broker (any Kafka client connects to 127.0.0.1:9092),
    or `stratalog demo` for a short end-to-end tour of the write-ahead log.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format=TEXT_FORMAT)


@cli.group(cls=LazyGroup, lazy=BENCH)
def bench() -> None:
    """Benchmarks: each prints a table and writes JSON with --json PATH."""


@cli.group(cls=LazyGroup, lazy=CHAOS)
def chaos() -> None:
    """Crash harnesses that count what they tried and what survived."""


def main() -> None:
    # kio (the Kafka schemas) registers strategies with hypothesis whenever hypothesis is importable, as
    # in a test environment: 130 ms more at every start, and a .hypothesis/ directory made wherever the
    # command runs. No command uses hypothesis: keep it out (tests import it before this and keep it).
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    cli()
