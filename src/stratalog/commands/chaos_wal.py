"""``stratalog chaos wal``: kill a WAL writer with SIGKILL over and over, and count what survived."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from stratalog.chaos.wal import IterationFigures, WALChaosConfig, WALChaosFigures, run_wal_chaos
from stratalog.commands import chaos_report

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
#: The settings the JSON file records, in order.
_PARAMETERS = ("iterations", "seed", "capacity_bytes", "kill_after_s_min", "kill_after_s_max")


def figures_table(figures: WALChaosFigures, title: str = "WAL kill -9 chaos") -> Table:
    """The figures as a two-column table; counts that must be zero are green at zero, red otherwise."""
    return chaos_report.figures_table(figures, title=title, rows=_ROWS, must_be_zero=_MUST_BE_ZERO)


def write_json(path: Path, config: WALChaosConfig, figures: WALChaosFigures,
               iterations: list[IterationFigures]) -> None:
    chaos_report.write_json(path, "chaos wal", config, _PARAMETERS, figures.as_dict(),
                            [{**_iteration_dict(it), "failures": it.failures} for it in iterations])


def _iteration_dict(figures: IterationFigures) -> dict[str, object]:
    return {name: getattr(figures, name) for name in figures.__dataclass_fields__}


_HARNESS = chaos_report.Harness(name="wal", target="chaos.wal", target_label="the WAL file", run=run_wal_chaos,
                                table=figures_table, write_json=write_json)


@click.command("wal")
@chaos_report.run_options(
    iterations_default=200,
    iterations_help="Kill/recover/check rounds.",
    seed_help="Seeds the kill times and the writers' run ids.",
    dir_help="Where the WAL file goes (a real disk, not tmpfs, to test O_DIRECT).",
)
@click.option("--capacity-mib", type=click.IntRange(min=2), default=32, show_default=True,
              help="Size of the WAL file; the ring is 8 KiB less.")
@chaos_report.json_option
def wal(iterations: int, seed: int, directory: Path, capacity_mib: int, json_path: Path | None) -> None:
    """SIGKILL a WAL writer at random moments; after each kill, recover and check every record.

    Exits 1 when any acknowledged record is lost, any returned record is corrupt or below the trim, or
    any other check fails. The WAL file is removed after a clean run and kept after a failed one.
    """
    config = WALChaosConfig(iterations=iterations, seed=seed, capacity_bytes=capacity_mib << 20)
    chaos_report.run_and_report(_HARNESS, config, directory, json_path)
