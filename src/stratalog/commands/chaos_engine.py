"""``stratalog chaos engine``: kill a StreamStore writer with SIGKILL over and over, and count what survived."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
from rich.table import Table

from stratalog.chaos.engine import (
    MUST_BE_ZERO,
    EngineChaosConfig,
    EngineChaosFigures,
    IterationFigures,
    run_engine_chaos,
)
from stratalog.commands import chaos_report
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
#: The settings the JSON file records, in order.
_PARAMETERS = ("iterations", "seed", "streams", "threads", "object_store", "kill_after_s_min", "kill_after_s_max",
               "recovery_kill_share")


def figures_table(figures: EngineChaosFigures, title: str = "Engine kill -9 chaos") -> Table:
    """The figures as a two-column table; counts that must be zero are green at zero, red otherwise."""
    must_be_zero = [(_LABELS[name], name) for name in MUST_BE_ZERO]
    return chaos_report.figures_table(figures, title=title, rows=_ROWS, must_be_zero=must_be_zero, leaks=_LEAKS)


def write_json(path: Path, config: EngineChaosConfig, figures: EngineChaosFigures,
               iterations: list[IterationFigures]) -> None:
    # The object store URI may carry credentials.
    redacted = None if config.object_store is None else redact(config.object_store)
    shown = dataclasses.replace(config, object_store=redacted)
    chaos_report.write_json(path, "chaos engine", shown, _PARAMETERS, figures.as_dict(),
                            [it.as_dict() for it in iterations])


_HARNESS = chaos_report.Harness(name="engine", target="store", target_label="the store", run=run_engine_chaos,
                                table=figures_table, write_json=write_json, errors=lambda figures: figures.errors)


@click.command("engine")
@chaos_report.run_options(
    iterations_default=300,
    iterations_help="Kill/reopen/check rounds.",
    seed_help="Seeds the kill times, the rounds left unchecked and the writers' run ids.",
    dir_help="Where the store's data directory goes (a real disk, not tmpfs).",
)
@click.option("--object-store", "object_store", default=None, metavar="URI",
              help="Object store for the store (default: a directory inside the data directory). It must "
                   "hold nothing else: every open deletes objects under data/ that the store does not know.")
@chaos_report.json_option
def engine(iterations: int, seed: int, directory: Path, object_store: str | None, json_path: Path | None) -> None:
    """SIGKILL a StreamStore writer at random moments; after each kill, reopen and check every stream.

    Exits 1 when any acknowledged record is lost, any offset is missing or returned twice, any record is
    corrupt or below a completed trim, an orphan object survives the open, or any other check fails.
    The data directory is removed after a clean run and kept after a failed one.
    """
    config = EngineChaosConfig(iterations=iterations, seed=seed, object_store=object_store)
    chaos_report.run_and_report(_HARNESS, config, directory, json_path)
