"""`stratalog bench wal`: the command-line shell around :mod:`stratalog.bench.wal`."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from stratalog.bench.common import MIB_BYTES, machine_info, size_label, write_json
from stratalog.bench.wal import RECOVERY_ROUNDS, SIZES_BYTES_DEFAULT, WalBenchPlan, run_wal_bench
from stratalog.bench.wal_report import markdown_report, plot_ratios, tables
from stratalog.wal.config import FsyncPolicy, WALConfig

SECONDS_DEFAULT = 10.0
#: --quick: every size and the recovery figure in under 30 s (20 timed slices of 1 s, plus set-up).
SECONDS_QUICK = 1.0
CAPACITY_MIB_DEFAULT = 1024
CAPACITY_MIB_QUICK = 256
RECOVERY_MIB_DEFAULT = 1024
RECOVERY_MIB_QUICK = 256
#: The ring must hold four of the largest blocks (an 8 MiB record): below this the log refuses to open.
CAPACITY_MIB_MIN = 64
#: Output to a file or pipe is laid out this wide, so no column of the tables is cut.
CONSOLE_WIDTH_PIPED = 140
#: The progress bar redraws on its own thread; rarely, since it competes with the producer for the GIL.
PROGRESS_REFRESH_PER_S = 2

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
               "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_sizes(text: str, size_bytes_max: int) -> tuple[int, ...]:
    """ "1KiB,4KiB,1MiB" -> (1024, 4096, 1048576). K, KB and KiB all mean 1024 bytes."""
    sizes = []
    for part in text.split(","):
        match = _SIZE_RE.match(part)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _SIZE_UNITS or int(match.group(1)) <= 0:
            raise click.BadParameter(f"{part!r} is not a size like 4KiB or 1MiB", param_hint="--sizes")
        size = int(match.group(1)) * _SIZE_UNITS[unit]
        if size > size_bytes_max:
            raise click.BadParameter(f"{part!r} is above the WAL's record_bytes_max ({size_bytes_max} bytes)",
                                     param_hint="--sizes")
        sizes.append(size)
    return tuple(sizes)


class _BarProgress:
    """Shows the benchmark's phases on a rich progress bar: one unit per phase."""

    def __init__(self, progress: Progress, phases: int) -> None:
        self._progress = progress
        self._task = progress.add_task("starting", total=phases)
        self._phase = -1

    def phase(self, description: str) -> None:
        self._phase += 1
        self._progress.update(self._task, description=description, completed=self._phase)

    def advance(self, fraction: float) -> None:
        self._progress.update(self._task, completed=self._phase + min(max(fraction, 0.0), 1.0))


def _phases(plan: WalBenchPlan) -> int:
    # preallocation; per size flat out / reference, half rate / reference; fill, (read, recover) x N, read.
    return 1 + 2 * len(plan.sizes_bytes) + 2 + 2 * RECOVERY_ROUNDS


# Output ----------------------------------------------------------------------------------------------


def _print_machine(console: Console, machine: dict[str, Any]) -> None:
    console.print(
        f"machine: {machine['cpus']} x {machine['cpu_model']}, {machine['memory_mib']:,} MiB, "
        f"Linux {machine['kernel']}, Python {machine['python']}, "
        f"{machine['filesystem']} on {machine['disk_device']}"
    )


# The command -----------------------------------------------------------------------------------------


def _resolve_plan(sizes: str, seconds: float | None, rate_mib_s: float | None, dir_path: Path,
                  capacity_mib: int | None, fsync: str, io_threads: int, recovery_mib: int | None,
                  quick: bool) -> WalBenchPlan:
    return WalBenchPlan(
        sizes_bytes=parse_sizes(sizes, WALConfig().record_bytes_max),
        seconds=seconds if seconds is not None else (SECONDS_QUICK if quick else SECONDS_DEFAULT),
        rate_bytes_per_s=rate_mib_s * MIB_BYTES if rate_mib_s else None,
        dir_path=dir_path,
        capacity_bytes=(capacity_mib or (CAPACITY_MIB_QUICK if quick else CAPACITY_MIB_DEFAULT)) * MIB_BYTES,
        fsync=FsyncPolicy(fsync),
        io_threads=io_threads,
        recovery_bytes=(recovery_mib or (RECOVERY_MIB_QUICK if quick else RECOVERY_MIB_DEFAULT)) * MIB_BYTES,
    )


@click.command(name="wal")
@click.option("--sizes", default=",".join(size_label(s).replace(" ", "") for s in SIZES_BYTES_DEFAULT),
              show_default=True, help="Record sizes, comma-separated (K/KiB = 1024 bytes, M/MiB = 1 MiB).")
@click.option("--seconds", type=click.FloatRange(min=0.1), default=None,
              help=f"Length of each timed phase [default: {SECONDS_DEFAULT:g}; --quick: {SECONDS_QUICK:g}].")
@click.option("--rate-mib-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Append at this payload rate instead of flat out.")
@click.option("--dir", "dir_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the WAL and reference files go [default: a temporary directory under the "
                   "current directory, so on its disk rather than a tmpfs /tmp].")
@click.option("--capacity-mib", type=click.IntRange(min=CAPACITY_MIB_MIN), default=None,
              help=f"WAL file size [default: {CAPACITY_MIB_DEFAULT}; --quick: {CAPACITY_MIB_QUICK}].")
@click.option("--fsync", type=click.Choice([p.value for p in FsyncPolicy]), default=FsyncPolicy.ALWAYS.value,
              show_default=True, help="When appends are acknowledged; printed beside every figure.")
@click.option("--io-threads", type=click.IntRange(1, 64), default=WALConfig().io_threads, show_default=True,
              help="WAL I/O threads; the reference writes from as many threads.")
@click.option("--recovery-mib", type=click.IntRange(min=CAPACITY_MIB_MIN), default=None,
              help=f"Size of the log recovered [default: {RECOVERY_MIB_DEFAULT}; --quick: "
                   f"{RECOVERY_MIB_QUICK}].")
@click.option("--quick", is_flag=True, help="Short phases and small files: the whole run in under 30 s.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures as JSON here.")
@click.option("--markdown-from", "markdown_from", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="JSON", help="Measure nothing: print this run's tables (from --json) as Markdown.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --markdown-from: also plot the ratios to the disk and the half-rate p99 as a PNG here "
                   "(needs matplotlib).")
def wal(sizes: str, seconds: float | None, rate_mib_s: float | None, dir_path: Path | None,
        capacity_mib: int | None, fsync: str, io_threads: int, recovery_mib: int | None, quick: bool,
        json_path: Path | None, markdown_from: Path | None, plot_path: Path | None) -> None:
    """The write-ahead log against the bare disk: throughput, latency and recovery.

    For each record size: flat out (or at --rate-mib-s), taking turns with a plain O_DIRECT pwritev
    loop at the same write size and depth for reference; then at half the rate reached, taking turns
    with the reference paced to the same writes per second. Last, a full log is recovered and compared
    with a plain sequential read of it.
    """
    if markdown_from is not None:
        doc = json.loads(markdown_from.read_text())
        click.echo(markdown_report(doc))
        if plot_path is not None:
            plot_ratios(doc, plot_path)
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=CONSOLE_WIDTH_PIPED)
    made_dir = dir_path is None
    target_dir = Path(tempfile.mkdtemp(prefix=".stratalog-bench-", dir=Path.cwd())) if made_dir else dir_path
    assert target_dir is not None
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        plan = _resolve_plan(sizes, seconds, rate_mib_s, target_dir, capacity_mib, fsync, io_threads,
                             recovery_mib, quick)
        doc = _run_with_progress(console, plan)
    finally:
        if made_dir:
            shutil.rmtree(target_dir, ignore_errors=True)
    _report(console, doc, json_path)


def _run_with_progress(console: Console, plan: WalBenchPlan) -> dict[str, Any]:
    machine = machine_info(plan.dir_path)
    _print_machine(console, machine)
    if machine["filesystem"] == "tmpfs":
        console.print(f"[yellow]{plan.dir_path} is on tmpfs: no O_DIRECT and no disk; pass --dir on a "
                      "real disk[/]")
    if plan.fsync is not FsyncPolicy.ALWAYS:
        console.print(f"[yellow]fsync={plan.fsync.value}: acknowledged records are not durable; these "
                      "figures are not comparable with fsync=always[/]")
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True,
                  refresh_per_second=PROGRESS_REFRESH_PER_S) as progress:
        return run_wal_bench(plan, _BarProgress(progress, _phases(plan)))


def _report(console: Console, doc: dict[str, Any], json_path: Path | None) -> None:
    load, other = doc["load_average_1m"], doc["other_activity"]
    console.print(f"while it ran, other processes used {other['other_cpu_s']:,.1f} CPU-s and wrote "
                  f"{other['other_disk_write_mib']:,.0f} MiB, the hypervisor stole {other['steal_cpu_s']:,.1f} "
                  f"CPU-s; load average (1 min) {load['start']:.2f} at start, {load['end']:.2f} at end")
    for t in tables(doc):
        console.print(t.rich())
    if json_path is not None:
        write_json(json_path, doc)
        console.print(f"figures written to {json_path}")
