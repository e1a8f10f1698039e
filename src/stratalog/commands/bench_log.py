"""`stratalog bench log`: the command-line shell around :mod:`stratalog.bench.log`."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratalog.bench.common import machine_info, size_label, write_json
from stratalog.bench.log import (
    IN_FLIGHT_MAX_DEFAULT,
    RATE_PER_S_DEFAULT,
    SIZES_BYTES_DEFAULT,
    SYNC_SECONDS_DEFAULT,
    THROUGHPUT_BYTES_MAX_DEFAULT,
    THROUGHPUT_RECORDS_DEFAULT,
    LogBenchPlan,
    phase_count,
    run_log_bench,
)
from stratalog.bench.log_report import markdown_report, plot_latency, tables
from stratalog.commands.bench_wal import parse_sizes
from stratalog.engine.batch import BATCH_HEADER_BYTES, RECORD_HEAD
from stratalog.engine.config import StoreConfig
from stratalog.wal.config import FsyncPolicy

SECONDS_DEFAULT = 30.0
#: --quick: 5 s per size, 20,000 records for throughput: the whole run in about a minute.
SECONDS_QUICK = 5.0
THROUGHPUT_RECORDS_QUICK = 20_000
THROUGHPUT_BYTES_MAX_QUICK = 512 << 20
SYNC_SECONDS_QUICK = 1.0
#: Largest record: one record's batch (batch header + record head + value) must fit one WAL record.
RECORD_BYTES_MAX = StoreConfig().wal.record_bytes_max - BATCH_HEADER_BYTES - RECORD_HEAD.size
#: Output to a file or pipe is laid out this wide, so no column of the tables is cut.
CONSOLE_WIDTH_PIPED = 150
#: The progress bar redraws on its own thread; rarely, since it competes with the producer for the GIL.
PROGRESS_REFRESH_PER_S = 2


# Shared by the store benchmarks' commands ------------------------------------------------------------


class BarProgress:
    """Shows a benchmark's phases on a rich progress bar: one unit per phase."""

    def __init__(self, progress: Progress, phases: int) -> None:
        self._progress = progress
        self._task = progress.add_task("starting", total=phases)
        self._phase = -1

    def phase(self, description: str) -> None:
        self._phase += 1
        self._progress.update(self._task, description=description, completed=self._phase)

    def advance(self, fraction: float) -> None:
        self._progress.update(self._task, completed=self._phase + min(max(fraction, 0.0), 1.0))


@contextmanager
def progress_bar(console: Console, phases: int) -> Iterator[BarProgress]:
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True,
                  refresh_per_second=PROGRESS_REFRESH_PER_S) as progress:
        yield BarProgress(progress, phases)


def make_console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=CONSOLE_WIDTH_PIPED)


@contextmanager
def bench_dir(dir_path: Path | None) -> Iterator[Path]:
    """``dir_path``, or a temporary directory under the current one (on its disk, not a tmpfs /tmp),
    removed afterwards."""
    if dir_path is not None:
        dir_path.mkdir(parents=True, exist_ok=True)
        yield dir_path
        return
    made = Path(tempfile.mkdtemp(prefix=".stratalog-bench-", dir=Path.cwd()))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def print_machine(console: Console, dir_path: Path) -> dict[str, Any]:
    machine = machine_info(dir_path)
    console.print(
        f"machine: {machine['cpus']} x {machine['cpu_model']}, {machine['memory_mib']:,} MiB, "
        f"Linux {machine['kernel']}, Python {machine['python']}, "
        f"{machine['filesystem']} on {machine['disk_device']}"
    )
    if machine["filesystem"] == "tmpfs":
        console.print(f"[yellow]{dir_path} is on tmpfs: no O_DIRECT and no disk; pass --dir on a real disk[/]")
    return machine


def verdict(result: dict[str, Any] | None) -> str:
    if result is None:
        return "-"
    if not result.get("applies", True):
        return "[yellow]n/a[/]"
    return "[green]PASS[/]" if result["met"] else "[red]MISS[/]"


def target_text(result: dict[str, Any] | None) -> str:
    if result is None:
        return "-"
    sign = ">=" if result["at_least"] else "<="
    return f"{result['name']} {sign} {result['bound']:g}"


def table(title: str, columns: tuple[str, ...], left: tuple[str, ...]) -> Table:
    out = Table(title=title, title_justify="left")
    for column in columns:
        out.add_column(column, justify="left" if column in left else "right")
    return out


def print_load(console: Console, doc: dict[str, Any]) -> None:
    load, other = doc["load_average_1m"], doc["other_activity"]
    note = " (object-store server included)" if doc.get("object_store", "").startswith("s3") else ""
    console.print(f"while it ran, other processes{note} used {other['other_cpu_s']:,.1f} CPU-s and wrote "
                  f"{other['other_disk_write_mib']:,.0f} MiB, the hypervisor stole {other['steal_cpu_s']:,.1f} "
                  f"CPU-s; load average (1 min) {load['start']:.2f} at start, {load['end']:.2f} at end")




# Tables ----------------------------------------------------------------------------------------------


def _print_notes(console: Console, doc: dict[str, Any]) -> None:
    for goal in doc["targets"]:
        if "ratio_to_reference" in goal:
            console.print(f"256 B p99 {goal['figure']:.2f} ms vs the disk's floor (ref p99) "
                          f"{goal['reference_p99_ms']:.2f} ms: {goal['ratio_to_reference']:.2f}x "
                          f"(fsync={doc['fsync']})")
        if not goal["applies"]:
            console.print(f"[yellow]{goal['why_not']}[/]")
    wanted = doc["settings"]["throughput_records"]
    for r in doc["throughput"]:
        if r["records"] < wanted:
            console.print(f"throughput at {size_label(r['record_bytes'])}: {r['records']:,} records, not {wanted:,} "
                          f"(capped at {doc['settings']['throughput_bytes_max'] >> 20:,} MiB per size)")
    lags = [r["start_lag_ms_max"] for r in doc["latency"]]
    if lags:
        console.print(f"pacing: appends started at most {max(lags):.2f} ms after their due time")


def _report(console: Console, doc: dict[str, Any], json_path: Path | None) -> None:
    print_load(console, doc)
    for t in tables(doc):
        console.print(t.rich())
    _print_notes(console, doc)
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")


# The command -----------------------------------------------------------------------------------------


def _pick(value: Any, quick: bool, quick_value: Any, default: Any) -> Any:
    if value is not None:
        return value
    return quick_value if quick else default


@click.command(name="log")
@click.option("--sizes", default=",".join(size_label(s).replace(" ", "") for s in SIZES_BYTES_DEFAULT),
              show_default=True, help="Record sizes, comma-separated (K/KiB = 1024 bytes, M/MiB = 1 MiB).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=RATE_PER_S_DEFAULT,
              show_default=True, help="Records per second in the latency runs.")
@click.option("--seconds", type=click.FloatRange(min=0.1), default=None,
              help=f"Length of each latency run [default: {SECONDS_DEFAULT:g}; --quick: {SECONDS_QUICK:g}].")
@click.option("--records", type=click.IntRange(min=1), default=None,
              help=f"Records per size in the throughput run [default: {THROUGHPUT_RECORDS_DEFAULT:,}; "
                   f"--quick: {THROUGHPUT_RECORDS_QUICK:,}], at most --records-mib-max of them.")
@click.option("--records-mib-max", type=click.IntRange(min=1), default=None,
              help=f"Cap on the bytes of one throughput run [default: {THROUGHPUT_BYTES_MAX_DEFAULT >> 20}; "
                   f"--quick: {THROUGHPUT_BYTES_MAX_QUICK >> 20}].")
@click.option("--in-flight", type=click.IntRange(min=1), default=IN_FLIGHT_MAX_DEFAULT, show_default=True,
              help="Appends outstanding at once in the throughput run.")
@click.option("--fsync", type=click.Choice([p.value for p in FsyncPolicy]), default=FsyncPolicy.ALWAYS.value,
              show_default=True, help="When appends are acknowledged; printed beside every figure.")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the store and the reference file go [default: a temporary directory under the "
                   "current directory, so on its disk rather than a tmpfs /tmp].")
@click.option("--quick", is_flag=True, help=f"{SECONDS_QUICK:g} s per latency run, "
                                            f"{THROUGHPUT_RECORDS_QUICK:,} records per throughput run.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
@click.option("--markdown-from", "markdown_from", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="JSON", help="Measure nothing: print this run's tables (from --json) as Markdown.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --markdown-from: also plot latency by percentile as a PNG here (needs matplotlib).")
def log(sizes: str, rate: float, seconds: float | None, records: int | None, records_mib_max: int | None,
        in_flight: int, fsync: str, dir_path: Path | None, quick: bool, json_path: Path | None,
        markdown_from: Path | None, plot_path: Path | None) -> None:
    """Append latency and throughput of a stream, as in "Benchmarking Commit Logs" (Kafka vs NATS).

    Latency: one record per append at --rate for --seconds, per size; its p99 for 256 B records is
    compared with the target (1 ms, fsync=always) and with the bare disk (one O_DIRECT+O_DSYNC 4 KiB
    write per record, same pattern). Throughput: --records records per size, every append awaited.
    """
    if markdown_from is not None:
        doc = json.loads(markdown_from.read_text())
        click.echo(markdown_report(doc))
        if plot_path is not None:
            plot_latency(doc, plot_path)
        return
    console = make_console()
    with bench_dir(dir_path) as target_dir:
        plan = LogBenchPlan(
            sizes_bytes=parse_sizes(sizes, RECORD_BYTES_MAX),
            rate_per_s=rate,
            seconds=_pick(seconds, quick, SECONDS_QUICK, SECONDS_DEFAULT),
            throughput_records=_pick(records, quick, THROUGHPUT_RECORDS_QUICK, THROUGHPUT_RECORDS_DEFAULT),
            throughput_bytes_max=(records_mib_max << 20 if records_mib_max is not None else
                                  _pick(None, quick, THROUGHPUT_BYTES_MAX_QUICK, THROUGHPUT_BYTES_MAX_DEFAULT)),
            in_flight_max=in_flight,
            sync_seconds=SYNC_SECONDS_QUICK if quick else SYNC_SECONDS_DEFAULT,
            dir_path=target_dir,
            fsync=FsyncPolicy(fsync),
        )
        print_machine(console, target_dir)
        if plan.fsync is not FsyncPolicy.ALWAYS:
            console.print(f"[yellow]fsync={plan.fsync.value}: acknowledged records are not durable; these "
                          "figures are not comparable with fsync=always[/]")
        with progress_bar(console, phase_count(plan)) as bar:
            doc = run_log_bench(plan, bar)
    _report(console, doc, json_path)

