"""``stratalog chaos engine``: kill a StreamStore writer with SIGKILL over and over, and count what survived."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratalog.chaos.engine import (
    MUST_BE_ZERO,
    ChaosHarnessError,
    EngineChaosConfig,
    EngineChaosFigures,
    IterationFigures,
    run_engine_chaos,
)
from stratalog.objects.uri import redact

#: (label, figure name) of the figures that describe the run, in table order.
_ROWS: tuple[tuple[str, str], ...] = (
    ("iterations (SIGKILL each)", "iterations"),
    ("iterations checked", "iterations_checked"),
    ("iterations with acknowledgements", "iterations_with_acks"),
    ("children killed while recovering", "iterations_killed_in_recovery"),
    ("batches acknowledged", "batches_acknowledged"),
    ("records acknowledged", "records_acknowledged"),
    ("acknowledged records checked present", "acknowledged_verified"),
    ("records read and checked", "records_checked"),
    ("trims completed", "trims_completed"),
    ("flushes completed", "flushes_completed"),
    ("recovery: batches replayed", "batches_replayed"),
    ("recovery: batches already in objects", "batches_already_in_objects"),
    ("recovery: batches not contiguous", "batches_not_contiguous"),
    ("recovery: orphan objects deleted", "orphan_objects_deleted"),
    ("opens replaying batches", "iterations_replaying"),
    ("opens finding batches already in objects", "iterations_with_batches_in_objects"),
    ("opens deleting orphans", "iterations_deleting_orphans"),
    ("objects after open, max", "objects_after_open_max"),
    ("recovery time, mean (ms)", "recovery_ms_mean"),
    ("recovery time, max (ms)", "recovery_ms_max"),
    ("open time, mean (ms)", "open_ms_mean"),
    ("elapsed (s)", "elapsed_s"),
)
#: Labels of the counts that each mean a broken promise unless they read 0, in MUST_BE_ZERO's order.
_LABELS: dict[str, str] = {
    "acknowledged_lost": "acknowledged lost",
    "recovered_lost": "recovered earlier, then lost",
    "duplicates": "duplicates returned",
    "out_of_order": "out of order returned",
    "gaps": "gaps (offsets missing)",
    "corrupt": "corrupt returned",
    "below_trim_returned": "below-trim returned",
    "trim_mismatches": "stream start not a trim",
    "orphan_objects_left": "orphan objects after open",
    "objects_missing": "referenced objects missing",
    "read_errors": "read errors",
    "offset_mismatches": "unpredicted offsets",
    "reopen_disagreements": "reopen disagrees with check",
    "streams_lost": "streams lost",
    "child_failures": "writer failed by itself",
    "open_failures": "open after kill failed",
}
#: Leaks that break no promise about records but grow storage: shown, never failed.
_LEAKS: tuple[tuple[str, str], ...] = (
    ("interrupted-put temp files after open", "temp_files_after_open"),
)


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def figures_table(figures: EngineChaosFigures, title: str = "Engine kill -9 chaos") -> Table:
    """The figures as a two-column table; counts that must be zero are green at zero, red otherwise."""
    table = Table(title=title, title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for label, name in _ROWS:
        table.add_row(label, _format(getattr(figures, name)))
    table.add_section()
    for name in MUST_BE_ZERO:
        value = getattr(figures, name)
        style = "green" if value == 0 else "bold red"
        table.add_row(_LABELS[name], f"[{style}]{_format(value)}[/]")
    table.add_section()
    for label, name in _LEAKS:
        value = getattr(figures, name)
        style = "green" if value == 0 else "yellow"
        table.add_row(label, f"[{style}]{_format(value)}[/]")
    return table


def write_json(path: Path, config: EngineChaosConfig, figures: EngineChaosFigures,
               iterations: list[IterationFigures]) -> None:
    payload = {
        "command": "chaos engine",
        "parameters": {
            "iterations": config.iterations,
            "seed": config.seed,
            "streams": config.streams,
            "threads": config.threads,
            "object_store": None if config.object_store is None else redact(config.object_store),
            "kill_after_s_min": config.kill_after_s_min,
            "kill_after_s_max": config.kill_after_s_max,
            "recovery_kill_share": config.recovery_kill_share,
        },
        "figures": figures.as_dict(),
        "per_iteration": [it.as_dict() for it in iterations],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


@click.command("engine")
@click.option("--iterations", type=click.IntRange(min=1), default=300, show_default=True,
              help="Kill/reopen/check rounds.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds the kill times, the rounds left unchecked and the writers' run ids.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Where the store's data directory goes (a real disk, not tmpfs).")
@click.option("--object-store", "object_store", default=None, metavar="URI",
              help="Object store for the store (default: a directory inside the data directory). It must "
                   "hold nothing else: every open deletes objects under data/ that the store does not know.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures (and each iteration's) as JSON here.")
def engine(iterations: int, seed: int, directory: Path, object_store: str | None, json_path: Path | None) -> None:
    """SIGKILL a StreamStore writer at random moments; after each kill, reopen and check every stream.

    Exits 1 when any acknowledged record is lost, any offset is missing or returned twice, any record is
    corrupt or below a completed trim, an orphan object survives the open, or any other check fails.
    The data directory is removed after a clean run and kept after a failed one.
    """
    console = Console()
    config = EngineChaosConfig(iterations=iterations, seed=seed, object_store=object_store)
    directory.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="stratalog-chaos-engine-", dir=directory))
    data_dir = work_dir / "store"
    per_iteration: list[IterationFigures] = []
    try:
        figures = _run_with_progress(console, data_dir, config, per_iteration)
    except ChaosHarnessError as e:
        raise click.ClickException(f"{e}\n(the store is kept at {data_dir})") from e
    console.print(figures_table(figures))
    if json_path is not None:
        write_json(json_path, config, figures, per_iteration)
    if figures.ok:
        shutil.rmtree(work_dir)
        return
    for message in figures.errors:
        console.print(message, style="red", markup=False, highlight=False)
    console.print(f"[bold red]{figures.failures} check(s) failed[/]; the store is kept at {data_dir}")
    raise SystemExit(1)


def _run_with_progress(console: Console, data_dir: Path, config: EngineChaosConfig,
                       per_iteration: list[IterationFigures]) -> EngineChaosFigures:
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

        return run_engine_chaos(data_dir, config, on_iteration)
