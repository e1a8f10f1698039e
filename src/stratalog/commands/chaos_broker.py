"""``stratalog chaos broker``: kill the broker with SIGKILL under idempotent producers, count what survived."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from stratalog.chaos.broker import (
    MUST_BE_ZERO,
    BrokerChaosConfig,
    BrokerChaosFigures,
    IterationFigures,
    run_broker_chaos,
)
from stratalog.commands import chaos_report

_ROWS: tuple[tuple[str, str], ...] = (
    ("kills (SIGKILL, then restart on the same port)", "iterations"),
    ("records sent", "records_sent"),
    ("records acknowledged", "records_acknowledged"),
    ("records read back", "records_read"),
    ("restart until listening, mean (ms)", "restart_ms_mean"),
    ("restart until listening, max (ms)", "restart_ms_max"),
    ("elapsed (s)", "elapsed_s"),
)
_LABELS = {
    "acknowledged_lost": "acknowledged lost",
    "duplicates": "stored twice",
    "offset_mismatches": "not at the acknowledged offset",
    "out_of_order": "out of order (per producer and partition)",
    "delivery_failures": "produces failed for good",
    "committed_offsets_lost": "committed offsets lost",
    "unaccounted": "sent, never acknowledged",
    "stalled": "no acknowledgement after a restart",
}
_PARAMETERS = ("iterations", "seed", "producers", "partitions", "kill_after_s_min", "kill_after_s_max")


def figures_table(figures: BrokerChaosFigures, title: str = "Broker kill -9 chaos") -> Table:
    return chaos_report.figures_table(figures, title=title, rows=_ROWS,
                                      must_be_zero=[(_LABELS[name], name) for name in MUST_BE_ZERO])


def write_json(path: Path, config: BrokerChaosConfig, figures: BrokerChaosFigures,
               iterations: list[IterationFigures]) -> None:
    chaos_report.write_json(path, "chaos broker", config, _PARAMETERS, figures.as_dict(),
                            [{name: getattr(it, name) for name in it.__dataclass_fields__} for it in iterations])


_HARNESS = chaos_report.Harness(name="broker", target="data", target_label="the broker's data directory",
                                run=run_broker_chaos, table=figures_table, write_json=write_json)


@click.command("broker")
@chaos_report.run_options(
    iterations_default=50,
    iterations_help="Kills of the broker (each followed by a restart on the same port).",
    seed_help="Seeds the kill times.",
    dir_help="Where the broker's data directory goes.",
)
@click.option("--producers", type=click.IntRange(min=1, max=16), default=2, show_default=True,
              help="Idempotent librdkafka producers writing throughout.")
@click.option("--partitions", type=click.IntRange(min=1, max=64), default=2, show_default=True)
@chaos_report.json_option
def broker(iterations: int, seed: int, directory: Path, producers: int, partitions: int,
           json_path: Path | None) -> None:
    """SIGKILL `stratalog serve` at random moments under idempotent producers (acks=all), restart it,
    and at the end read the topic back.

    Exits 1 when an acknowledged record is lost, a record is stored twice or out of order, a produce fails
    for good, or committed offsets change. Needs confluent-kafka (the bench extra).
    """
    config = BrokerChaosConfig(iterations=iterations, seed=seed, producers=producers, partitions=partitions)
    chaos_report.run_and_report(_HARNESS, config, directory, json_path)
