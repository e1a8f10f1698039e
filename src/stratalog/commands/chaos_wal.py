"""``stratalog chaos wal``: kill a WAL writer with SIGKILL over and over, and count what survived."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratalog.chaos.wal import (
    ChaosHarnessError,
    IterationFigures,
    WALChaosConfig,
    WALChaosFigures,
    run_wal_chaos,
)

#: (label, figure name) of the figures that describe the run, in table order.
_ROWS: tuple[tuple[str, str], ...] = (
    ("iterations (SIGKILL each)", "iterations"),
    ("records acknowledged", "records_acknowledged"),
    ("records recovered", "records_recovered"),
    ("acknowledged records checked present", "acknowledged_verified"),
    ("iterations with acknowledgements", "iterations_with_acks"),
    ("trims completed", "trims_completed"),
    ("ring laps", "ring_laps"),
    ("recovery time, mean (ms)", "recovery_ms_mean"),
    ("recovery time, max (ms)", "recovery_ms_max"),
    ("elapsed (s)", "elapsed_s"),
)
#: (label, figure name) of the counts that each mean a broken promise unless they read 0.
_MUST_BE_ZERO: tuple[tuple[str, str], ...] = (
    ("acknowledged lost", "acknowledged_lost"),
    ("recovered earlier, then lost", "recovered_lost"),
    ("corrupt returned", "corrupt_returned"),
    ("below-trim returned", "below_trim_returned"),
    ("out of order returned", "out_of_order_returned"),
    ("duplicates returned", "duplicate_returned"),
    ("trim offset mismatches", "trim_mismatches"),
    ("child and parent recovery disagree", "recovery_disagreements"),
)


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def figures_table(figures: WALChaosFigures, title: str = "WAL kill -9 chaos") -> Table:
    """The figures as a two-column table; counts that must be zero are green at zero, red otherwise."""
    table = Table(title=title, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for label, name in _ROWS:
        table.add_row(label, _format(getattr(figures, name)))
    table.add_section()
    for label, name in _MUST_BE_ZERO:
        value = getattr(figures, name)
        style = "green" if value == 0 else "bold red"
        table.add_row(label, f"[{style}]{_format(value)}[/]")
    return table


def write_json(path: Path, config: WALChaosConfig, figures: WALChaosFigures,
               iterations: list[IterationFigures]) -> None:
    payload = {
        "command": "chaos wal",
        "parameters": {
            "iterations": config.iterations,
            "seed": config.seed,
            "capacity_bytes": config.capacity_bytes,
            "kill_after_s_min": config.kill_after_s_min,
            "kill_after_s_max": config.kill_after_s_max,
        },
        "figures": figures.as_dict(),
        "per_iteration": [{**_iteration_dict(it), "failures": it.failures} for it in iterations],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _iteration_dict(figures: IterationFigures) -> dict[str, object]:
    return {name: getattr(figures, name) for name in figures.__dataclass_fields__}


@click.command("wal")
@click.option("--iterations", type=click.IntRange(min=1), default=200, show_default=True,
              help="Kill/recover/check rounds.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds the kill times and the writers' run ids.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Where the WAL file goes (a real disk, not tmpfs, to test O_DIRECT).")
@click.option("--capacity-mib", type=click.IntRange(min=2), default=32, show_default=True,
              help="Size of the WAL file; the ring is 8 KiB less.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures (and each iteration's) as JSON here.")
def wal(iterations: int, seed: int, directory: Path, capacity_mib: int, json_path: Path | None) -> None:
    """SIGKILL a WAL writer at random moments; after each kill, recover and check every record.

    Exits 1 when any acknowledged record is lost, any returned record is corrupt or below the trim, or
    any other check fails. The WAL file is removed after a clean run and kept after a failed one.
    """
    console = Console()
    config = WALChaosConfig(iterations=iterations, seed=seed, capacity_bytes=capacity_mib << 20)
    directory.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="stratalog-chaos-wal-", dir=directory))
    wal_path = work_dir / "chaos.wal"
    per_iteration: list[IterationFigures] = []
    try:
        figures = _run_with_progress(console, wal_path, config, per_iteration)
    except ChaosHarnessError as e:
        raise click.ClickException(f"{e}\n(the WAL file is kept at {wal_path})") from e
    console.print(figures_table(figures))
    if json_path is not None:
        write_json(json_path, config, figures, per_iteration)
    if figures.ok:
        shutil.rmtree(work_dir)
        return
    console.print(f"[bold red]{figures.failures} check(s) failed[/]; the WAL file is kept at {wal_path}")
    raise SystemExit(1)


def _run_with_progress(console: Console, wal_path: Path, config: WALChaosConfig,
                       per_iteration: list[IterationFigures]) -> WALChaosFigures:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("kill -9", total=config.iterations, status="")
        acknowledged = failures = 0

        def on_iteration(figures: IterationFigures) -> None:
            nonlocal acknowledged, failures
            per_iteration.append(figures)
            acknowledged += figures.records_acknowledged
            failures += figures.failures
            progress.update(task, advance=1, status=f"acked {acknowledged:,}  failed checks {failures}")

        return run_wal_chaos(wal_path, config, on_iteration)
