"""What the ``stratalog chaos`` commands share: their common options, running a harness under a progress
bar in a work directory of its own, the figures table, the JSON file, and the exit status (1, with the
work directory kept, when any check failed).

Each command keeps what is its own: its other options, which figures its table shows and how they are
labelled, and which settings its JSON file records.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratalog.chaos.harness import ChaosHarnessError

#: (label, figure name) pairs, in table order.
Rows = Sequence[tuple[str, str]]


class RunConfig(Protocol):
    @property
    def iterations(self) -> int: ...


class RoundFigures(Protocol):
    """What the progress bar reads from one round's figures."""

    @property
    def records_acknowledged(self) -> int: ...

    @property
    def failures(self) -> int: ...


class RunFigures(Protocol):
    """What the exit status follows from: a whole run's figures."""

    @property
    def ok(self) -> bool: ...

    @property
    def failures(self) -> int: ...


ConfigT = TypeVar("ConfigT", bound=RunConfig)
RoundT = TypeVar("RoundT", bound=RoundFigures)
RunT = TypeVar("RunT", bound=RunFigures)
CommandT = TypeVar("CommandT", bound=Callable[..., Any])


# Options -------------------------------------------------------------------------------------------


def run_options(*, iterations_default: int, iterations_help: str, seed_help: str,
                dir_help: str) -> Callable[[CommandT], CommandT]:
    """``--iterations``, ``--seed`` and ``--dir``, the first options of every chaos command."""
    options = (
        click.option("--iterations", type=click.IntRange(min=1), default=iterations_default, show_default=True,
                     help=iterations_help),
        click.option("--seed", type=int, default=0, show_default=True, help=seed_help),
        click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
                     show_default=True, help=dir_help),
    )

    def decorate(command: CommandT) -> CommandT:
        for option in reversed(options):  # as if stacked in this order above the command
            command = option(command)
        return command

    return decorate


#: ``--json``, the last option of every chaos command.
json_option = click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                           help="Also write the figures (and each iteration's) as JSON here.")


# Table and JSON ------------------------------------------------------------------------------------


def format_figure(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def figures_table(figures: object, *, title: str, rows: Rows, must_be_zero: Rows, leaks: Rows = ()) -> Table:
    """The figures as a two-column table: ``rows`` as they are, then the counts that break a promise
    unless zero (green at zero, red otherwise), then ``leaks``, which break none (yellow unless zero)."""
    table = Table(title=title, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for label, name in rows:
        table.add_row(label, format_figure(getattr(figures, name)))
    _add_zero_section(table, figures, must_be_zero, "bold red")
    if leaks:
        _add_zero_section(table, figures, leaks, "yellow")
    return table


def _add_zero_section(table: Table, figures: object, rows: Rows, style_unless_zero: str) -> None:
    table.add_section()
    for label, name in rows:
        value = getattr(figures, name)
        style = "green" if value == 0 else style_unless_zero
        table.add_row(label, f"[{style}]{format_figure(value)}[/]")


def write_json(path: Path, command: str, config: object, parameters: Sequence[str], figures: Mapping[str, object],
               per_iteration: Sequence[Mapping[str, object]]) -> None:
    """The settings named in ``parameters``, the run's figures and each round's, as one JSON document."""
    payload = {
        "command": command,
        "parameters": {name: getattr(config, name) for name in parameters},
        "figures": figures,
        "per_iteration": per_iteration,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


# Running -------------------------------------------------------------------------------------------


def _no_errors(figures: object) -> Sequence[str]:
    return ()


@dataclass(frozen=True, slots=True)
class Harness(Generic[ConfigT, RoundT, RunT]):
    """How a chaos command runs its harness, and reports on the run."""

    #: Names the work directory: ``stratalog-chaos-<name>-*``.
    name: str
    #: The file or directory the harness works on, inside the work directory, and what to call it.
    target: str
    target_label: str
    #: ``run(target path, config, on_iteration)``
    run: Callable[[Path, ConfigT, Callable[[RoundT], None]], RunT]
    table: Callable[[RunT], Table]
    #: ``write_json(path, config, figures, per_iteration)``
    write_json: Callable[[Path, ConfigT, RunT, list[RoundT]], None]
    #: Messages printed before the failure count when a check failed.
    errors: Callable[[RunT], Sequence[str]] = _no_errors


def run_and_report(harness: Harness[ConfigT, RoundT, RunT], config: ConfigT, directory: Path,
                   json_path: Path | None) -> None:
    """Run the harness in a new work directory inside ``directory``, print its table, write its JSON.

    Removes the work directory after a clean run. After a failed one, keeps it, prints the errors and
    how many checks failed, and exits 1. A harness error becomes a click error.
    """
    console = Console()
    directory.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix=f"stratalog-chaos-{harness.name}-", dir=directory))
    target = work_dir / harness.target
    kept = f"{harness.target_label} is kept at {target}"
    per_iteration: list[RoundT] = []
    try:
        figures = _run_with_progress(console, config.iterations, per_iteration,
                                     lambda on_iteration: harness.run(target, config, on_iteration))
    except ChaosHarnessError as e:
        raise click.ClickException(f"{e}\n({kept})") from e
    console.print(harness.table(figures))
    if json_path is not None:
        harness.write_json(json_path, config, figures, per_iteration)
    if figures.ok:
        shutil.rmtree(work_dir)
        return
    for message in harness.errors(figures):
        console.print(message, style="red", markup=False, highlight=False)
    console.print(f"[bold red]{figures.failures} check(s) failed[/]; {kept}")
    raise SystemExit(1)


def _run_with_progress(console: Console, iterations: int, per_iteration: list[RoundT],
                       run: Callable[[Callable[[RoundT], None]], RunT]) -> RunT:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("kill -9", total=iterations, status="")
        acknowledged = failures = 0

        def on_iteration(figures: RoundT) -> None:
            nonlocal acknowledged, failures
            per_iteration.append(figures)
            acknowledged += figures.records_acknowledged
            failures += figures.failures
            progress.update(task, advance=1, status=f"acked {acknowledged:,}  failed checks {failures}")

        return run(on_iteration)
