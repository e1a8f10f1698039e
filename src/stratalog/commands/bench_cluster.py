"""`stratalog bench cluster`: the command-line shell around :mod:`stratalog.bench.cluster`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from stratalog.bench.cluster import ClusterBenchPlan, run_cluster_bench
from stratalog.bench.cluster_report import markdown_report, tables
from stratalog.bench.common import write_json
from stratalog.chaos.cluster_process import stopped_by_signals, work_directory
from stratalog.chaos.harness import ChaosHarnessError
from stratalog.chaos.launch import no_child_left
from stratalog.commands.bench_log import make_console, print_machine

SECONDS_DEFAULT = 20.0
LATENCY_RATE_PER_S_DEFAULT = 500.0
FAILOVER_ROUNDS_DEFAULT = 3


@click.command(name="cluster")
@click.option("--seconds", type=click.FloatRange(min=1), default=SECONDS_DEFAULT, show_default=True,
              help="Length of each measured window (throughput per cluster size, latency per WAL).")
@click.option("--rate", "latency_rate_per_s", type=click.FloatRange(min=0, min_open=True),
              default=LATENCY_RATE_PER_S_DEFAULT, show_default=True,
              help="1 KiB records per second of the latency phase (the same for both WALs).")
@click.option("--failover-rounds", type=click.IntRange(min=1, max=50), default=FAILOVER_ROUNDS_DEFAULT,
              show_default=True, help="kill -9 rounds of the failover phase.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds which broker each round kills.")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the brokers' and SeaweedFS's directories go [default: the system's temporary "
                   "directory]; removed at the end.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
@click.option("--markdown-from", "markdown_from", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="JSON", help="Measure nothing: print this run's tables (from --json) as Markdown.")
def cluster(seconds: float, latency_rate_per_s: float, failover_rounds: int, seed: int, dir_path: Path | None,
            json_path: Path | None, markdown_from: Path | None) -> None:
    """Several `serve --cluster` brokers on this machine: produce throughput of 1, 2 and 3 brokers,
    produce latency with the WAL in the object store against the device WAL, and failover time.

    Starts a PostgreSQL and a SeaweedFS of its own, all on 127.0.0.1. Throughput: one idempotent
    confluent-kafka producer (acks=all, 1 KiB records) as fast as the brokers take it. Latency: one
    `serve --cluster` broker against one plain `serve`, at --rate. Failover: three brokers under a
    light load, one killed with kill -9 per round, until every partition is served again. Every
    process shares this machine's cores, so the throughput's scaling is this machine's.
    """
    if markdown_from is not None:
        click.echo(markdown_report(json.loads(markdown_from.read_text())))
        return
    console = make_console()
    with stopped_by_signals(), work_directory(dir_path, "bench-cluster") as work, no_child_left():
        print_machine(console, work)
        plan = ClusterBenchPlan(seconds=seconds, latency_rate_per_s=latency_rate_per_s,
                                failover_rounds=failover_rounds, seed=seed, dir_path=work)
        try:
            with console.status("starting") as status:
                doc = run_cluster_bench(plan, status.update)
        except ChaosHarnessError as e:
            raise click.ClickException(str(e)) from e
    for t in tables(doc):
        console.print(t.rich())
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")
